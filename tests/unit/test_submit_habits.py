"""Submitting from a login node with sbatch's habits: the command line as a user types it (subprocess).

sbatch's short flags and `--ntasks-per-node`, sbatch's time forms with their field ranges, hostlists
checked by ddpslurm's own parser, no `--wckey` from submitit's defaults, `--dry-run` without submitit,
usage errors of `template` exiting 2, no NCCL interface baked into the GPU templates, shell completion.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpslurm import templates
from ddpslurm.launch.plan import plan
from ddpslurm.launch.spec import make_spec
from tests.unit.test_hardening_cli import one_clean_error_line, run_cli

REPO = Path(__file__).resolve().parents[2]
GPU_TEMPLATES = ["srun-gpu", "torchrun-gpu", "requeue", "sweep"]


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def _directives(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith("#SBATCH ")]


def test_sbatch_short_flags_and_ntasks_per_node(script: Path) -> None:
    done = run_cli("submit", "train.py", "-N", "2", "--ntasks-per-node", "2", "-p", "debug", "-t", "1-0", "-A",
                   "proj1", "-J", "bert", "-w", "n[01-02]", "-x", "n03", "-q", "high", "-c", "4", "-C", "a100",
                   "--dry-run", "--lint", "off", "--folder", str(script.parent / "jobs"), cwd=script.parent)
    assert done.returncode == 0, done.stderr
    shown = _directives(done.stdout)
    for line in ("--nodes=2", "--ntasks-per-node=2", "--partition=debug", "--time=1440", "--account=proj1",
                 "--job-name=bert", "--nodelist='n[01-02]'", "--exclude=n03", "--qos=high", "--cpus-per-task=4",
                 "--constraint=a100"):
        assert f"#SBATCH {line}" in shown, (line, shown)


def test_template_takes_sbatch_short_flags_too() -> None:
    done = run_cli("template", "srun-cpu", "-N", "3", "--ntasks-per-node", "2", "-p", "cpu", "-t", "30", "-J", "x",
                   "-A", "p1", cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout == templates.render("srun-cpu", {"nodes": 3, "tasks_per_node": 2, "partition": "cpu",
                                                        "time": "30", "job_name": "x", "account": "p1"})


@pytest.mark.parametrize(("text", "minutes"), [
    ("30", 30), ("30:30", 31), ("72:00:00", 4320), ("1-12", 2160), ("1-12:30", 2190), ("1-12:30:01", 2191),
    ("0-23:59:59", 1440),
])
def test_every_sbatch_time_form_is_accepted(script: Path, text: str, minutes: int) -> None:
    done = run_cli("submit", "train.py", "--time", text, "--signal-delay", "10", "--dry-run", "--lint", "off",
                   "--folder", str(script.parent / "jobs"), cwd=script.parent)
    assert done.returncode == 0, done.stderr
    assert f"#SBATCH --time={minutes}" in _directives(done.stdout)


@pytest.mark.parametrize(("text", "why"), [
    ("99-99:99:99", "has 99 hours where at most 23 fit"), ("1-24", "has 24 hours"), ("5:60", "has 60 seconds"),
    ("1:60:00", "has 60 minutes"), ("1-0:0:75", "has 75 seconds"), ("1:2:3:4", "is not a Slurm time limit"),
    ("0", "is zero"), ("infinite", "asks for no time limit"), ("1.5", "is not a Slurm time limit"),
])
@pytest.mark.parametrize("command", ["submit", "template"])
def test_out_of_range_times_are_refused(script: Path, command: str, text: str, why: str) -> None:
    args = (["submit", "train.py", "--dry-run"] if command == "submit" else ["template", "srun-cpu"])
    line = one_clean_error_line(run_cli(*args, "--time", text, cwd=script.parent), 2)
    assert why in line and "days-hours:minutes:seconds" in line


@pytest.mark.parametrize("flag", ["--exclude", "-x", "--nodelist", "-w"])
@pytest.mark.parametrize(("value", "why"), [("node[01-", "'[' without ']'"), ("node[04-01]", "reversed range"),
                                            ("a,,b", "empty host name"), ("n[1-2]]", "']' without '['")])
def test_malformed_hostlists_are_refused(script: Path, flag: str, value: str, why: str) -> None:
    line = one_clean_error_line(run_cli("submit", "train.py", flag, value, "--dry-run", cwd=script.parent), 2)
    assert "is not a valid hostlist" in line and why in line and "node[01-04,07]" in line


def test_a_hostlist_file_is_left_to_sbatch(script: Path) -> None:
    done = run_cli("submit", "train.py", "--exclude", "/etc/bad_nodes", "--dry-run", "--lint", "off",
                   "--folder", str(script.parent / "jobs"), cwd=script.parent)
    assert done.returncode == 0 and "#SBATCH --exclude=/etc/bad_nodes" in _directives(done.stdout), done.stderr


def test_nodelist_goes_through_its_own_flag_and_not_with_retries(script: Path) -> None:
    line = one_clean_error_line(run_cli("submit", "train.py", "--sbatch-arg", "nodelist=n1", "--dry-run",
                                        cwd=script.parent), 2)
    assert "Use --nodelist instead" in line
    line = one_clean_error_line(run_cli("submit", "train.py", "-w", "n1", "--retries", "1", cwd=script.parent), 2)
    assert "cannot keep --nodelist" in line


def test_no_wckey_from_submitits_defaults(script: Path) -> None:
    done = run_cli("submit", "train.py", "--dry-run", "--lint", "off", "--folder", str(script.parent / "j"),
                   cwd=script.parent)
    assert done.returncode == 0 and "#SBATCH --nodes=1" in done.stdout, done.stderr
    assert not [ln for ln in done.stdout.splitlines() if "--wckey" in ln]
    own = run_cli("submit", "train.py", "--sbatch-arg", "wckey=proj7", "--dry-run", "--lint", "off",
                  "--folder", str(script.parent / "j"), cwd=script.parent)
    assert "#SBATCH --wckey=proj7" in _directives(own.stdout), own.stderr


def _without_submitit(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import submitit (what `pip install ddpslurm` on a login node gives)."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['submitit'] = None\n")
    return dict(os.environ, PYTHONPATH=f"{hide}:{REPO}")


def test_dry_run_needs_no_submitit_and_prints_the_same_script(script: Path, tmp_path: Path) -> None:
    args = [sys.executable, "-m", "ddpslurm.cli", "submit", "train.py", "-N", "2", "--gpus-per-node", "4", "--mem",
            "64G", "-x", "n[3-4]", "--sbatch-arg", "exclusive=", "--dry-run", "--lint", "off", "--folder", "/jobs"]
    run = {"cwd": script.parent, "capture_output": True, "text": True, "timeout": 60}
    bare = subprocess.run(args, env=_without_submitit(tmp_path), **run)
    full = subprocess.run(args, env=dict(os.environ, PYTHONPATH=str(REPO)), **run)
    assert bare.returncode == 0 and full.returncode == 0, bare.stderr + full.stderr
    warning = "# warning: submitit is not installed in this Python"
    assert warning in bare.stdout and warning not in full.stdout
    assert [ln for ln in bare.stdout.splitlines() if not ln.startswith(warning)] == full.stdout.splitlines()
    submitting = subprocess.run([a for a in args if a != "--dry-run"], env=_without_submitit(tmp_path), **run)
    assert submitting.returncode == 1 and "pip install 'ddpslurm[launch]'" in submitting.stderr


@pytest.mark.parametrize("options", [
    {}, {"nodes": 4, "gpus_per_node": 8, "cpus_per_task": 10, "mem": "500G", "partition": "gpu", "account": "a",
         "qos": "q", "time": "2-00:00", "constraint": "a100&ib", "exclude": "n[03-04]", "nodelist": "n[01-02]",
         "sbatch_args": ["mail-type=END", "exclusive=", "wckey=w1"], "job_name": "bert"},
    {"launcher": "torchrun", "tasks_per_node": 2, "max_requeues": 0}, {"hang_timeout_s": 30, "preflight": True},
])
def test_own_rendering_equals_submitits(tmp_path: Path, options: dict) -> None:
    from ddpslurm.launch import sbatch_text
    from ddpslurm.launch.submit import _python, render_sbatch

    (tmp_path / "t.py").write_text("")
    job = plan(make_spec(tmp_path / "t.py", folder=tmp_path / "jobs", **options))
    assert sbatch_text.render(job, _python(job)) == render_sbatch(job)


@pytest.mark.parametrize("name", GPU_TEMPLATES)
def test_gpu_templates_leave_the_nccl_interface_to_nccl_unless_asked(name: str) -> None:
    plain = run_cli("template", name, cwd=REPO)
    assert plain.returncode == 0, plain.stderr
    exported = [ln for ln in plain.stdout.splitlines() if ln.startswith("export NCCL_SOCKET_IFNAME")
                or ln.startswith("export NCCL_IB_HCA")]
    assert exported == []
    assert "# export NCCL_SOCKET_IFNAME=ib0  (set with --nccl-socket-ifname)" in plain.stdout
    asked = run_cli("template", name, "--nccl-socket-ifname", "ib0", "--nccl-ib-hca", "mlx5", cwd=REPO)
    lines = asked.stdout.splitlines()
    assert "export NCCL_SOCKET_IFNAME='ib0'" in lines and "export NCCL_IB_HCA='mlx5'" in lines


def test_unset_nccl_interface_leaves_gloo_alone(tmp_path: Path) -> None:
    """The `case` that copies NCCL_SOCKET_IFNAME to gloo runs under `set -u` with the variable unset."""
    line = next(ln for ln in templates.render("srun-gpu").splitlines() if ln.startswith("case "))
    done = subprocess.run(["bash", "-c", f'set -u; {line}; echo "gloo=${{GLOO_SOCKET_IFNAME-unset}}"'],
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert (done.returncode, done.stdout.strip()) == (0, "gloo=unset"), done.stderr


@pytest.mark.parametrize("args", [["nosuch"], ["srun-gpu", "--nodes", "0"], ["srun-cpu", "--gpus-per-node", "1"],
                                  ["srun-gpu", "--partition", "a b"], ["requeue", "--time", "2", "--signal-delay",
                                                                       "100"]])
def test_template_usage_errors_exit_2(args: list[str]) -> None:
    one_clean_error_line(run_cli("template", *args, cwd=REPO), 2)


def test_shell_completion_as_the_readme_shows_it() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), _DDPSLURM_COMPLETE="bash_source")
    source = subprocess.run([sys.executable, "-m", "ddpslurm.cli"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert source.returncode == 0 and "complete -o nosort -F _ddpslurm_completion ddpslurm" in source.stdout

    def complete(words: str) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "ddpslurm.cli"], capture_output=True, text=True, timeout=60,
                              env=dict(env, _DDPSLURM_COMPLETE="bash_complete", COMP_WORDS=words,
                                       COMP_CWORD=str(len(words.split()) - 1)))
        return done.stdout.splitlines()

    assert complete("ddpslurm sub") == ["plain,submit"]
    assert complete("ddpslurm template srun") == ["plain,srun-gpu", "plain,srun-cpu"]
    assert complete("ddpslurm submit --ntasks") == ["plain,--ntasks-per-node"]
    assert complete("ddpslurm submit train") == ["file,train"]
