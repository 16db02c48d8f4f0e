"""The one subprocess runner: missing binary, non-zero exit and timeout each become one clear error.

Uses real tiny executables on a private PATH (no Slurm needed, nothing mocked inside `run`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ddpslurm.errors import SlurmCommandError, SlurmNotFoundError
from ddpslurm.scheduler import run as run_module
from ddpslurm.scheduler.run import CONFIGLESS_ENV, TIMEOUT_EXIT, configuration_error, run


def tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def bin_env(tmp_path: Path) -> dict[str, str]:
    tool(tmp_path, "sacct", 'echo "out:$*"; echo "$FOO" >&2')
    tool(tmp_path, "sbatch", 'echo "sbatch: error: Batch job submission failed: Invalid partition name" >&2; exit 1')
    tool(tmp_path, "squeue", "exec /bin/sleep 5")
    tool(tmp_path, "scat", "exec /bin/cat")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=fake\n")
    return {"PATH": str(tmp_path), "FOO": "bar", "SLURM_CONF": str(conf)}


def test_run_returns_output_and_passes_env(bin_env: dict[str, str]) -> None:
    done = run(["sacct", "--jobs=1"], env=bin_env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "out:--jobs=1\n", "bar\n")


def test_run_passes_input(bin_env: dict[str, str]) -> None:
    assert run(["scat"], env=bin_env, input="#!/bin/sh\n").stdout == "#!/bin/sh\n"


def test_missing_binary_names_it_and_the_way_out(tmp_path: Path) -> None:
    with pytest.raises(SlurmNotFoundError) as info:
        run(["sbatch", "x.sh"], env={"PATH": str(tmp_path)})
    line = info.value.one_line()
    assert "sbatch not found on PATH" in line
    assert "module load slurm" in line and "ddpslurm submit --local" in line


def test_nonzero_exit_carries_argv_code_and_first_stderr_line(bin_env: dict[str, str]) -> None:
    with pytest.raises(SlurmCommandError) as info:
        run(["sbatch", "job.sh"], env=bin_env)
    error = info.value
    assert (error.argv, error.returncode) == (["sbatch", "job.sh"], 1)
    assert "Invalid partition name" in error.one_line()
    assert "\n" not in error.one_line()


def test_nonzero_exit_without_check_returns(bin_env: dict[str, str]) -> None:
    assert run(["sbatch"], env=bin_env, check=False).returncode == 1


def test_timeout_is_a_clear_error(bin_env: dict[str, str]) -> None:
    with pytest.raises(SlurmCommandError) as info:
        run(["squeue"], env=bin_env, timeout=0.3)
    assert info.value.returncode == TIMEOUT_EXIT
    assert "no answer after 0.3 s" in info.value.one_line()


def test_run_sets_no_slurm_variable(bin_env: dict[str, str], tmp_path: Path) -> None:
    tool(tmp_path, "sinfo", "/usr/bin/env | /bin/grep ^SLURM || true")
    assert run(["sinfo"], env=bin_env).stdout == f"SLURM_CONF={bin_env['SLURM_CONF']}\n"


def test_not_executable_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "scancel").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "scancel", 0o644)
    with pytest.raises((SlurmCommandError, SlurmNotFoundError)):
        run([str(tmp_path / "scancel")])


@pytest.fixture
def no_default_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_module, "CONFIG_FILES", (str(tmp_path / "absent" / "slurm.conf"),))


@pytest.mark.parametrize(("extra", "problem"), [
    ({}, "SLURM_CONF is unset"),
    ({"SLURM_CONF": "/nonexistent/slurm.conf"}, "SLURM_CONF=/nonexistent/slurm.conf does not exist"),
    ({CONFIGLESS_ENV: "1"}, None),
    ({CONFIGLESS_ENV: "0"}, "SLURM_CONF is unset"),
])
def test_configuration_error(no_default_conf: None, extra: dict[str, str], problem: str | None) -> None:
    error = configuration_error({"PATH": "/usr/bin", **extra})
    assert (error is None) if problem is None else (problem in error.one_line())


def test_a_default_slurm_conf_is_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setattr(run_module, "CONFIG_FILES", (str(tmp_path / "none.conf"), str(conf)))
    assert configuration_error({}) is None


def test_run_refuses_a_slurm_without_configuration(bin_env: dict[str, str], no_default_conf: None) -> None:
    """Without a slurm.conf, Slurm's clients would ask DNS for the controller: refuse before running them."""
    env = {k: v for k, v in bin_env.items() if k != "SLURM_CONF"}
    with pytest.raises(SlurmNotFoundError) as info:
        run(["sacct", "--jobs=1"], env=env)
    assert "not configured" in info.value.one_line() and "--local" in info.value.one_line()
