"""`ddpslurm submit` bad input: one line that says what to do, non-zero exit, no traceback (subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _submit(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env, PYTHONPATH=str(REPO))  # this checkout, not another install
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", "submit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def _assert_one_line_error(done: subprocess.CompletedProcess, fragment: str, code: int) -> None:
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    assert fragment in lines[0]


@pytest.mark.parametrize(("args", "fragment", "code"), [
    (["missing.py", "--nodes", "2"], "script 'missing.py' does not exist", 1),
    (["train.py", "--nodes", "0"], "--nodes 0 is invalid", 2),
    (["train.py", "--tasks-per-node", "-1"], "--tasks-per-node -1 is invalid", 2),
    (["train.py", "--time", "soon"], "--time 'soon' is not a Slurm time limit", 2),
    (["train.py", "--sbatch-arg", "exclusive"], "has no '='", 2),
    (["train.py", "--sbatch-arg", "nodes=3"], "Use --nodes instead", 2),
    (["train.py", "--mem", "much"], "--mem 'much'", 2),
])
def test_bad_input_is_one_line(script: Path, args: list[str], fragment: str, code: int) -> None:
    _assert_one_line_error(_submit([*args, "--dry-run"], script.parent), fragment, code)


def test_unwritable_folder(script: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    done = _submit(["train.py", "--folder", str(blocker / "jobs")], script.parent)
    _assert_one_line_error(done, "is not writable", 1)
    assert "--folder" in done.stderr


def test_sbatch_not_on_path_suggests_local(script: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"))
    done = _submit(["train.py", "--folder", str(tmp_path / "jobs")], script.parent, env=env)
    _assert_one_line_error(done, "sbatch not found on PATH", 1)
    assert "--local" in done.stderr


def test_dry_run_without_slurm_prints_the_script(script: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"))
    done = _submit(["train.py", "--nodes", "2", "--dry-run", "--folder", str(tmp_path / "jobs"), "--", "--lr", "1"],
                   script.parent, env=env)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=2" in done.stdout
    assert "srun --unbuffered" in done.stdout
    assert '["--lr", "1"]' in done.stdout
    assert not (tmp_path / "jobs").exists()


def test_dry_run_json(script: Path, tmp_path: Path) -> None:
    done = _submit(["train.py", "--nodes", "3", "--tasks-per-node", "2", "--dry-run", "--json",
                    "--folder", str(tmp_path / "jobs")], script.parent)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["executor"] == "slurm"
    assert "#SBATCH --nodes=3" in plan["sbatch"] and "#SBATCH --ntasks-per-node=2" in plan["sbatch"]
    assert plan["rank_env"]["WORLD_SIZE"] == "6"
    assert plan["executor_params"]["srun_args"] == ["--kill-on-bad-exit=1"]  # no --wait: see plan.REQUEUE_MARGIN_S


# --- submit --python: the interpreter the ranks run, checked before the queue wait -------------------------

@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment without torch or submitit (what a user forgot to activate)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin" / "python"


def test_python_without_torch_is_refused_before_submitting(script: Path, tmp_path: Path, bare_python: Path) -> None:
    done = _submit(["train.py", "--python", str(bare_python), "--lint", "off", "--folder", str(tmp_path / "jobs")],
                   script.parent)
    _assert_one_line_error(done, f"--python {bare_python} cannot import torch (ModuleNotFoundError", 1)
    assert "submitit (ModuleNotFoundError" in done.stderr and "pip install 'ddpslurm[launch,torch]'" in done.stderr
    assert not list((tmp_path / "jobs").glob("job_*"))  # nothing was submitted


@pytest.mark.parametrize(("python", "fragment"), [("/no/such/python3", "--python '/no/such/python3' does not exist"),
                                                  ("no-such-python", "--python 'no-such-python' is not on PATH")])
def test_missing_python_is_one_line(script: Path, tmp_path: Path, python: str, fragment: str) -> None:
    done = _submit(["train.py", "--python", python, "--lint", "off", "--folder", str(tmp_path / "jobs")],
                   script.parent)
    _assert_one_line_error(done, fragment, 1)


def test_python_by_name_is_the_one_on_path_in_every_line(script: Path, tmp_path: Path) -> None:
    import shutil

    done = _submit(["train.py", "--python", "python3", "--dry-run", "--lint", "off",
                    "--folder", str(tmp_path / "jobs")], script.parent)
    assert done.returncode == 0, done.stderr
    found = shutil.which("python3")
    assert f"# python: {found} " in done.stdout
    assert f"srun() {{ {found} -m ddpslurm.launch.batch" in done.stdout
    assert done.stdout.count(f"{found} -u -m submitit.core._submit") == 1


def test_the_batch_step_says_it_in_one_line_and_stops(tmp_path: Path, bare_python: Path) -> None:
    """Where the interpreter could not be checked before submitting, the batch step's check before srun."""
    from ddpslurm.launch.interpreter import batch_check_lines

    checked = tmp_path / "check.sh"
    for python, code in ((bare_python, 1), (Path(sys.executable), 0), (tmp_path / "gone" / "python", 1)):
        checked.write_text("\n".join(["#!/bin/bash", *batch_check_lines(str(python)), "echo srun would run"]) + "\n")
        done = subprocess.run(["bash", str(checked)], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert done.returncode == code, done.stderr
        if code:
            assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
            assert done.stderr.startswith(f"ddpslurm: error: {python} cannot import what every rank needs (")
        else:
            assert done.stdout == "srun would run\n" and done.stderr == ""


def test_an_interpreter_that_cannot_run_here_is_a_warning(tmp_path: Path) -> None:
    """Another architecture, or a loader only the compute nodes have: the batch step checks it."""
    from ddpslurm.launch.interpreter import check_interpreter

    foreign = tmp_path / "python"
    foreign.write_text("#!/opt/only-on-the-nodes/python\n")
    foreign.chmod(0o755)
    warning = check_interpreter(str(foreign), package_parent=str(REPO))
    assert warning and "cannot run here" in warning and "the batch step checks it before srun" in warning
