"""The sbatch templates: golden files, validation, shell safety, and what the shell computes.

A golden diff means `sbatch_templates/` is not what `ddpslurm template` renders now. If the change is
deliberate, accept it with `ddpslurm template --regenerate` (or `DDPSLURM_UPDATE_GOLDEN=1 pytest
tests/unit/test_templates.py`) and review the diff before committing.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddpslurm import templates
from ddpslurm.errors import TemplateError

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "sbatch_templates"
NAMES = list(templates.TEMPLATES)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
UPDATE = os.environ.get("DDPSLURM_UPDATE_GOLDEN") == "1"

# Renderings beyond the defaults that must stay valid shell too.
VARIANTS = [
    ("srun-gpu", {"gpus_per_node": 0, "partition": "gpu,gpu2", "account": "p123", "qos": "high", "mem": "0"}),
    ("torchrun-gpu", {"gpus_per_node": 8, "nccl_socket_ifname": "^lo,docker", "nccl_ib_hca": "=mlx5_0:1,mlx5_1:1"}),
    ("srun-cpu", {"gloo_socket_ifname": "eth0", "script": "/home/a b/train it.py", "log_dir": "/scratch/$USER x"}),
    ("requeue", {"gpus_per_node": 0, "tasks_per_node": 1, "max_requeues": 0, "time": "2-00:00:00"}),
    ("sweep", {"array": "0-2%1", "nodes": 2}),
    ("standalone", {"gpus_per_node": 2, "python": "/opt/venv/bin/python"}),
]
HOSTILE_ARGS = ["--lr", "0.1", "two words", "$(touch /tmp/pwned)", "`id`", "it's", '"quoted"', "*", "a;b|c&", ""]


def _render_variant(name: str, values: dict) -> str:
    return templates.render(name, values, HOSTILE_ARGS)


def _shellcheck_or_skip() -> str:
    path = shutil.which("shellcheck")
    if path is None:
        if IN_CI:
            pytest.fail("shellcheck is required in CI (apt-get install shellcheck)")
        pytest.skip("shellcheck is not installed")
    return path


# --- golden files ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_golden_file_is_the_default_rendering(name: str) -> None:
    path = GOLDEN / templates.golden_name(name)
    rendered = templates.render(name)
    if UPDATE:
        path.write_text(rendered, encoding="utf-8")
    assert path.is_file(), f"{path} is missing: run `ddpslurm template --regenerate`"
    stored = path.read_text(encoding="utf-8")
    if stored != rendered:
        diff = "".join(list(difflib.unified_diff(stored.splitlines(True), rendered.splitlines(True),
                                                 str(path), f"ddpslurm template {name}"))[:60])
        pytest.fail(f"{path.name} differs from the rendering of its source. If the change is deliberate, "
                    "accept it with `ddpslurm template --regenerate` (or DDPSLURM_UPDATE_GOLDEN=1 pytest "
                    f"tests/unit/test_templates.py) and review the diff:\n{diff}")


def test_golden_folder_holds_exactly_the_templates() -> None:
    on_disk = sorted(p.name for p in GOLDEN.glob(f"*{templates.GOLDEN_SUFFIX}"))
    assert on_disk == sorted(templates.golden_name(n) for n in NAMES)


def test_write_golden_renders_every_template(tmp_path: Path) -> None:
    written = templates.write_golden(tmp_path)
    assert sorted(p.name for p in written) == sorted(templates.golden_name(n) for n in NAMES)
    for path in written:
        assert path.read_text() == (GOLDEN / path.name).read_text()


def test_data_dir_finds_the_golden_folder() -> None:
    assert templates.golden_folder() == GOLDEN  # a source checkout's sbatch_templates/
    assert (templates.golden_folder() / "srun-gpu.sbatch").is_file()


# --- shell validity ----------------------------------------------------------------------------------

CASES = [(n, {}) for n in NAMES] + VARIANTS


@pytest.mark.parametrize(("name", "values"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_bash_parses_the_rendering(name: str, values: dict, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(_render_variant(name, values) if values else templates.render(name))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("name", "values"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_shellcheck_is_clean(name: str, values: dict, tmp_path: Path) -> None:
    shellcheck = _shellcheck_or_skip()
    script = tmp_path / "job.sbatch"
    script.write_text(_render_variant(name, values) if values else templates.render(name))
    # The variants carry literal `$(...)` arguments on purpose; SC2016 ("does not expand in single quotes")
    # is then exactly what we want, so only that info note is waived for them.
    waive = ["--exclude=SC2016"] if values else []
    done = subprocess.run([shellcheck, "--shell=bash", *waive, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", NAMES)
def test_no_placeholder_survives(name: str) -> None:
    assert "@@" not in templates.render(name)


def test_user_text_is_never_substituted_again() -> None:
    script = templates.render("srun-cpu", {}, ["@@NODES@@", "@@BLOCK_FAILURES@@"])
    assert _shell_values(script, ["TRAIN_ARGS"]) == ["@@NODES@@", "@@BLOCK_FAILURES@@"]


def _shell_values(script: str, names: list[str], env: dict[str, str] | None = None) -> list[str]:
    """Run the rendered assignment lines of `names` in bash and return their words (NUL-separated)."""
    lines = [ln for ln in script.splitlines() if re.match(rf"({'|'.join(names)})=", ln)]
    printer = "; ".join(f'printf "%s\\0" "${{{n}[@]}}"' for n in names)
    done = subprocess.run(["bash", "-c", "\n".join([*lines, printer])], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], **(env or {})}, check=True)
    return done.stdout.split("\0")[:-1]


@pytest.mark.parametrize("name", NAMES)
def test_hostile_arguments_reach_the_script_verbatim(name: str, tmp_path: Path) -> None:
    script = templates.render(name, {"script": "my dir/$(x) train.py"}, HOSTILE_ARGS)
    assert _shell_values(script, ["TRAIN_SCRIPT", "TRAIN_ARGS"]) == ["my dir/$(x) train.py", *HOSTILE_ARGS]
    assert not Path("/tmp/pwned").exists()


# --- ports and addresses ---------------------------------------------------------------------------

def _port_line(name: str) -> str:
    return next(ln for ln in templates.render(name).splitlines() if ln.startswith("export MASTER_PORT="))


@pytest.mark.parametrize("job_id", ["1", "9999", "19999", "20000", "2815419", "4294967294"])
@pytest.mark.parametrize("name", ["srun-gpu", "srun-cpu", "torchrun-gpu", "torchrun-cpu", "requeue"])
def test_shell_port_is_ddpslurms_port(name: str, job_id: str) -> None:
    from ddpslurm.env import master_port_for

    done = subprocess.run(["bash", "-c", f'{_port_line(name)}; echo "$MASTER_PORT"'], capture_output=True,
                          text=True, env={"SLURM_JOB_ID": job_id}, check=True)
    port = int(done.stdout)
    assert port == master_port_for(job_id)
    assert 10000 <= port < 30000


@pytest.mark.parametrize(("array_job", "task"), [("100", "0"), ("100", "1"), ("19999", "1"), ("2815500", "7")])
def test_sweep_port_is_ddpslurms_array_port(array_job: str, task: str) -> None:
    """An array task's own SLURM_JOB_ID is the key, as in ddpslurm.env (array job id + index is another job's id)."""
    from ddpslurm.env import master_port_for

    env = {"SLURM_JOB_ID": str(int(array_job) + int(task) + 1), "SLURM_ARRAY_JOB_ID": array_job,
           "SLURM_ARRAY_TASK_ID": task}
    done = subprocess.run(["bash", "-c", f'{_port_line("sweep")}; echo "$MASTER_PORT"'], capture_output=True,
                          text=True, env=env, check=True)
    assert int(done.stdout) == master_port_for(env["SLURM_JOB_ID"])


def test_two_array_tasks_get_different_ports() -> None:
    line = _port_line("sweep")
    ports = {subprocess.run(["bash", "-c", f'{line}; echo "$MASTER_PORT"'], capture_output=True, text=True,
                            env={"SLURM_JOB_ID": str(5001 + t), "SLURM_ARRAY_JOB_ID": "5000",
                                 "SLURM_ARRAY_TASK_ID": str(t)}, check=True).stdout
             for t in range(8)}
    assert len(ports) == 8


# --- what every template must contain ----------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_every_directive_and_statement_has_a_comment(name: str) -> None:
    lines = templates.render(name).splitlines()
    uncommented = []
    for i, line in enumerate(lines[1:], start=1):
        prev = lines[i - 1]
        if line.startswith(("#SBATCH", "##SBATCH")) and not (prev.startswith("# ") or prev == "#"):
            uncommented.append(line)
        starts_statement = line[:1].isalpha() and not line.startswith(("fi", "done", "esac", "}", "then", "else"))
        continued = prev.rstrip().endswith(("\\", "(")) or prev.startswith((" ", "\t"))
        if starts_statement and not continued and not prev.startswith("#"):
            first, prev_first = line.split("=")[0].split()[0], prev.split("=")[0].split()[:1]
            if [first] != prev_first:  # a run of the same command (two traps) shares one comment
                uncommented.append(line)
    assert not uncommented, f"lines without an explaining comment above them: {uncommented}"


@pytest.mark.parametrize("name", NAMES)
def test_every_template_carries_the_essentials(name: str) -> None:
    text = templates.render(name)
    assert "ddpslurm analyze" in text
    for cause in ("network_unreachable", "port_in_use", "rendezvous_timeout", "wrong_interface", "infiniband_error",
                  "cuda_oom", "host_oom", "collective_timeout", "slurm_time_limit", "preempted", "node_failure"):
        assert cause in text
    assert re.search(r"^TRAIN_ARGS=\(", text, re.M) and re.search(r"^TRAIN_SCRIPT=", text, re.M)
    if name != "standalone":
        assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in text
        assert "srun --kill-on-bad-exit=1" in text
        assert "export MASTER_PORT=$((10000 + " in text


@pytest.mark.parametrize(("name", "markers"), [
    ("srun-gpu", ['--output="$LOG_DIR/%j_%t_log.out"', "NCCL_SOCKET_IFNAME=", "NCCL_IB_HCA=",
                  'NCCL_DEBUG_FILE="$LOG_DIR/nccl_%h_%p.log"', "TORCH_NCCL_ASYNC_ERROR_HANDLING=3",
                  "NCCL_ASYNC_ERROR_HANDLING=1"]),
    ("torchrun-gpu", ["--tee=3", "--redirects=3", "--log-dir=", '--node-rank="$SLURM_NODEID"', "%j_node%n.out",
                      "NCCL_IB_HCA="]),
    ("srun-cpu", ['--output="$LOG_DIR/%j_%t_log.out"', "OMP_NUM_THREADS"]),
    ("torchrun-cpu", ["--tee=3", "--redirects=3", "--max-restarts=0"]),
    ("requeue", ["#SBATCH --signal=B:USR2@90", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 'scontrol requeue "$SLURM_JOB_ID"', "SLURM_RESTART_COUNT", "MAX_REQUEUES=3", "/attempt_"]),
    ("sweep", ["#SBATCH --array=0-2", "export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))", "%x_%A_%a.out"]),
    ("standalone", ["--standalone", "#SBATCH --nodes=1"]),
])
def test_template_specific_settings(name: str, markers: list[str]) -> None:
    text = templates.render(name)
    missing = [m for m in markers if m not in text]
    assert not missing


@pytest.mark.parametrize(("gpus", "directive", "tasks"), [
    (4, "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4"),
    (8, "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=8"),
    (0, "##SBATCH --gpus-per-node=N", "#SBATCH --ntasks-per-node=2"),
])
def test_gpus_per_node_sets_the_request_and_the_rank_count(gpus: int, directive: str, tasks: str) -> None:
    lines = templates.render("srun-gpu", {"gpus_per_node": gpus}).splitlines()
    assert any(ln.startswith(directive) for ln in lines)
    assert tasks in lines
    assert not any(ln.startswith("#SBATCH --gpus-per-node") for ln in lines) if gpus == 0 else True


@pytest.mark.parametrize(("param", "value", "line"), [
    ("partition", "gpu", "#SBATCH --partition=gpu"),
    ("partition", "", "##SBATCH --partition=PARTITION"),
    ("account", "proj-1", "#SBATCH --account=proj-1"),
    ("qos", "", "##SBATCH --qos=QOS"),
    ("mem", "64G", "#SBATCH --mem=64G"),
    ("time", "1-12:00:00", "#SBATCH --time=1-12:00:00"),
    ("nodes", 16, "#SBATCH --nodes=16"),
    ("job_name", "bert.v2", "#SBATCH --job-name=bert.v2"),
])
def test_values_land_in_their_directive(param: str, value: object, line: str) -> None:
    assert line in templates.render("srun-gpu", {param: value}).splitlines()


def test_rerender_command_in_the_header_reproduces_the_script(tmp_path: Path) -> None:
    import shlex

    text = templates.render("requeue", {"nodes": 3, "partition": "gpu", "time": "12:00:00"}, ["--lr", "a b"])
    header = next(ln for ln in text.splitlines() if ln.startswith("# Rendered by: "))
    argv = shlex.split(header.removeprefix("# Rendered by: "))
    assert argv[:3] == ["ddpslurm", "template", "requeue"]
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", *argv[1:]], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == text


# --- validation --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("param", "value", "expected"), [
    ("nodes", 1, 1), ("nodes", "12", 12), ("gpus_per_node", 0, 0), ("max_requeues", 0, 0),
    ("partition", "gpu_a100", "gpu_a100"), ("partition", "a,b", "a,b"), ("account", "", ""),
    ("time", "30", "30"), ("time", "1-00", "1-00"), ("time", "02:00:00", "02:00:00"),
    ("mem", "500G", "500G"), ("mem", "0", "0"), ("array", "0-99%10", "0-99%10"), ("array", "1,3,5-7", "1,3,5-7"),
    ("nccl_socket_ifname", "^docker,lo", "^docker,lo"), ("nccl_ib_hca", "mlx5_0:1,mlx5_1:1", "mlx5_0:1,mlx5_1:1"),
    ("script", "dir with space/t.py", "dir with space/t.py"),
    ("python", "/opt/conda/bin/python", "/opt/conda/bin/python"),
])
def test_validate_accepts(param: str, value: object, expected: object) -> None:
    assert templates.validate(param, value) == expected


@pytest.mark.parametrize(("param", "value", "words"), [
    ("nodes", 0, "at least 1"), ("nodes", "two", "whole number"), ("nodes", True, "whole number"),
    ("gpus_per_node", -1, "at least 0"), ("cpus_per_task", 0, "at least 1"), ("signal_delay", 5, "at least 10"),
    ("partition", "gpu;reboot", "not allowed"), ("partition", "$(id)", "not allowed"), ("job_name", "", "not allowed"),
    ("account", "a b", "not allowed"), ("qos", "q\nx", "not allowed"), ("mem", "64 GB", "not allowed"),
    ("time", "1:2:3:4", "not a Slurm time"), ("time", "tomorrow", "not a Slurm time"), ("time", "", "not a Slurm time"),
    ("job_name", "-rf", "not allowed"), ("array", "0-3;ls", "not allowed"),
    ("nccl_socket_ifname", "ib0 eth0", "not allowed"), ("gloo_socket_ifname", "^lo", "not allowed"),
    ("script", "", "not a usable path"), ("script", "a\nb", "not a usable path"), ("log_dir", "logs/%j", "'%'"),
])
def test_validate_rejects_with_one_line_and_a_fix(param: str, value: object, words: str) -> None:
    with pytest.raises(TemplateError) as info:
        templates.validate(param, value)
    line = info.value.one_line()
    assert words in line
    assert "\n" not in line.replace(repr(value), "")
    assert info.value.hint


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("5:30", 330), ("01:00:00", 3600), ("1-0", 86400), ("2-12", 2 * 86400 + 12 * 3600),
    ("1-02:03", 86400 + 2 * 3600 + 180), ("1-02:03:04", 86400 + 7384), ("1:30", 90), ("72:00:00", 3 * 86400),
    ("0-23:59:59", 86399),
])
def test_slurm_time_seconds(text: str, seconds: int) -> None:
    assert templates.slurm_time_seconds(text) == seconds


def test_signal_delay_must_fit_in_the_time_limit() -> None:
    with pytest.raises(TemplateError, match="signal-delay"):
        templates.render("requeue", {"time": "1", "signal_delay": 60})
    with pytest.raises(TemplateError, match="up to 60s earlier"):  # the signal may come 60 s early: at the start
        templates.render("requeue", {"time": "2", "signal_delay": 100})
    assert "#SBATCH --signal=B:USR2@100" in templates.render("requeue", {"time": "3", "signal_delay": 100})


def test_unknown_template_lists_the_known_ones() -> None:
    with pytest.raises(TemplateError) as info:
        templates.render("srun-gpus")
    assert all(n in info.value.one_line() for n in NAMES)


@pytest.mark.parametrize(("name", "param"), [("srun-cpu", "gpus_per_node"), ("standalone", "nodes"),
                                             ("srun-gpu", "max_requeues"), ("requeue", "array")])
def test_options_a_template_does_not_use_are_refused(name: str, param: str) -> None:
    with pytest.raises(TemplateError, match=templates.PARAMS[param].option):
        templates.render(name, {param: 1})


def test_substitute_refuses_unknown_placeholders() -> None:
    with pytest.raises(TemplateError, match="@@NOPE@@"):
        templates.substitute("a @@NOPE@@ b", {})
    assert templates.substitute("x=@@A@@ y=$@ z=${a[@]}", {"A": "1"}) == "x=1 y=$@ z=${a[@]}"


def test_self_including_block_is_an_error_not_a_loop() -> None:
    with pytest.raises(TemplateError, match="nest"):
        templates.substitute("@@BLOCK_X@@", {}, {"BLOCK_X": "again @@BLOCK_X@@"})


def test_training_argument_with_newline_is_refused() -> None:
    with pytest.raises(TemplateError, match="newline"):
        templates.render("srun-cpu", {}, ["a\nb"])


# --- the command line --------------------------------------------------------------------------------

def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", "template", *args], capture_output=True, text=True,
                          cwd=cwd)


def test_cli_list_names_every_template_with_a_description() -> None:
    done = _cli("--list")
    assert done.returncode == 0
    rows = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert list(rows) == NAMES
    assert all(len(desc) > 20 for desc in rows.values())


def test_cli_prints_the_rendering_and_passes_train_args() -> None:
    done = _cli("srun-cpu", "--nodes", "3", "--", "--lr", "0.1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == templates.render("srun-cpu", {"nodes": 3}, ["--lr", "0.1"])


def test_cli_writes_the_output_file(tmp_path: Path) -> None:
    done = _cli("sweep", "--array", "0-7%2", "-o", str(tmp_path / "s.sbatch"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "s.sbatch").read_text() == templates.render("sweep", {"array": "0-7%2"})
    assert "sbatch --test-only" in done.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["srun-gpu", "--partition", "gpu;rm -rf /"], "--partition"),
    (["srun-gpu", "--nodes", "0"], "--nodes must be at least 1"),
    (["srun-cpu", "--gpus-per-node", "1"], "does not take --gpus-per-node"),
    (["nosuch"], "no template named"),
    (["requeue", "--time", "noon"], "not a Slurm time"),
])
def test_cli_bad_values_give_one_line_without_traceback(args: list[str], words: str) -> None:
    done = _cli(*args)
    assert done.returncode == 2  # usage errors exit 2, as in every other command
    assert done.stdout == ""
    assert words in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [[], ["srun-gpu", "--list"]])
def test_cli_usage_errors_exit_2(args: list[str]) -> None:
    done = _cli(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr


def test_installed_layout_renders_and_refuses_to_regenerate(tmp_path: Path) -> None:
    """A wheel puts the golden files at ddpslurm/_data/sbatch_templates (pyproject force-include)."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "ddpslurm", site / "ddpslurm", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(GOLDEN, site / "ddpslurm" / "_data" / "sbatch_templates")
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import ddpslurm; print(ddpslurm.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout.split()
    assert where == [str(site / "ddpslurm" / "__init__.py")]  # the copy, not this checkout
    shown = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "template", "srun-gpu"], capture_output=True,
                           text=True, env=env, cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout == (GOLDEN / "srun-gpu.sbatch").read_text()
    refused = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "template", "--regenerate"], capture_output=True,
                             text=True, env=env, cwd=tmp_path)
    assert refused.returncode == 1 and "cannot be regenerated" in refused.stderr
    assert (GOLDEN / "srun-gpu.sbatch").read_text() == templates.render("srun-gpu")
