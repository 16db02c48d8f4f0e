"""Issue 16, item 2: no value reaches an `#SBATCH` line unless sbatch would read it as exactly that value.

The reproducers of the issue (a newline in --partition injecting `touch`, `--mem $'16G\\n'`, `--mem ٦٤G`)
are refused by `submit` and `template` (both exit 2, a usage error) with one line, through the one shared check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpslurm import templates
from ddpslurm.errors import TemplateError, UsageError
from ddpslurm.launch.spec import make_spec
from ddpslurm.sbatch_values import check_sbatch_value, sbatch_value_problem

REPO = Path(__file__).resolve().parents[2]
INJECT = "gpu\ntouch /tmp/PWNED #"
HOSTILE = [INJECT, "16G\n", "x\n", "a b", "a\tb", 'a"b', "a'b", "a#b", "a\\b", "a\x1bb", "a\x9bb", "a\u2028b",
           "\u0666\u0664G", "é", ""]


@pytest.mark.parametrize("value", HOSTILE[:-1])
@pytest.mark.parametrize("option", ["partition", "account", "qos", "constraint", "exclude", "mem", "job-name",
                                    "time", "array", "folder", "reservation", "mail-type"])
def test_hostile_values_are_refused_for_every_option(option: str, value: str) -> None:
    assert sbatch_value_problem(option, value) is not None


@pytest.mark.parametrize(("option", "value"), [
    ("partition", "gpu,cpu"), ("account", "proj_1.a"), ("qos", "normal"), ("constraint", "[a100*2&ib]|h100"),
    ("exclude", "node[03-04],gpu7"), ("exclude", "/home/me/bad_nodes"), ("mem", "64G"), ("mem", "16000"),
    ("job-name", "ddp+v2.1"), ("time", "1-12:00:00"), ("array", "0-7%2"), ("folder", "/scratch/me/ddp_jobs"),
    ("mail-type", "END,FAIL"), ("gres", "gpu:a100:4"), ("dependency", "afterok:123"), ("exclusive", ""),
])
def test_real_values_pass(option: str, value: str) -> None:
    assert check_sbatch_value(option, value, UsageError) == value


@pytest.mark.parametrize(("option", "value"), [("mem", "16G\n"), ("time", "60\n"), ("job-name", "x\n"),
                                               ("mem", "\u0666\u0664G"), ("array", "1\u0663")])
def test_fullmatch_and_ascii_digits(option: str, value: str) -> None:
    """`$` in re.match accepts a trailing newline and `\\d` accepts Arabic-Indic digits: both refused."""
    with pytest.raises(UsageError) as caught:
        check_sbatch_value(option, value, UsageError)
    assert "\n" not in str(caught.value) and value not in str(caught.value)


@pytest.mark.parametrize("field", ["partition", "account", "qos", "constraint", "exclude", "mem", "job_name",
                                   "folder", "sbatch_args", "time"])
@pytest.mark.parametrize("value", [INJECT, "16G\n", "\u0666\u0664G", "a b"])
def test_make_spec_refuses_every_field(tmp_path: Path, field: str, value: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    arg: object = (f"reservation={value}",) if field == "sbatch_args" else value
    if field == "folder":
        arg = str(tmp_path / value)
    with pytest.raises(UsageError):
        make_spec(script, **{field: arg})


@pytest.mark.parametrize("param", ["partition", "account", "qos", "mem", "job_name", "time", "array"])
@pytest.mark.parametrize("value", [INJECT, "16G\n", "\u0666\u0664G", "\u0666\u0660"])
def test_templates_refuse_through_the_same_check(param: str, value: str) -> None:
    with pytest.raises(TemplateError):
        templates.validate(param, value)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("flag", ["--partition", "--account", "--qos", "--constraint", "--exclude", "--folder",
                                  "--sbatch-arg", "--mem", "--job-name"])
def test_submit_dry_run_injects_no_line(tmp_path: Path, flag: str) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    value = f"reservation={INJECT}" if flag == "--sbatch-arg" else INJECT
    done = _cli("submit", "train.py", flag, value, "--dry-run", cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert "touch" not in done.stdout and "PWNED" not in done.stdout
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddpslurm: error: ") and "\\n" in lines[0]


def test_template_refuses_the_injection(tmp_path: Path) -> None:
    done = _cli("template", "srun-gpu", "--partition", INJECT, cwd=tmp_path)
    assert done.returncode == 2 and "touch" not in done.stdout  # a usage error, as in `submit`
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["a\u009b2Jb.py", "a\u202eyp.b", "a\u2028b", "a\x1bb", "a\nb"])
def test_template_paths_and_train_args_refuse_control_characters(value: str) -> None:
    with pytest.raises(TemplateError):
        templates.validate("script", value)
    with pytest.raises(TemplateError):
        templates.render("srun-gpu", {}, [value])


def test_a_rendered_template_is_printable_text() -> None:
    text = templates.render("requeue", {"script": "dir with space/t\u00e9.py", "log_dir": "logs"}, ["--lr", "0.1 x"])
    assert all(line.isprintable() for line in text.splitlines())
