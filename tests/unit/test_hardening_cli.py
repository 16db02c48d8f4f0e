"""Issue 16, items 7, 13 and 14: status output, error lines, `template -o`, `analyze --jobs`, job folder hygiene."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ddpslurm.errors import SubmitError
from ddpslurm.jobfolder import check_folder
from ddpslurm.sanitize import json_dumps
from ddpslurm.scheduler.status import render_text, status_from_scontrol

REPO = Path(__file__).resolve().parents[2]
HOSTILE_NAME = "x\x1b]0;owned\x07\x1b[2J\u009b31mred\nfolder: /etc/forged"
RAW_CONTROLS = [chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]]


def run_cli(*args: str, cwd: Path, stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess:
    """`ddpslurm <args>` run from this checkout in `cwd` (test_retries runs it too)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", *args], cwd=cwd, env=env, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=60)


def one_clean_error_line(done: subprocess.CompletedProcess, code: int) -> str:
    """The one line a failed command wrote, after checking it exited `code` with no traceback or raw control."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    assert not any(ch in lines[0] for ch in RAW_CONTROLS), ascii(lines[0])
    return lines[0]


def test_status_text_never_passes_a_job_name_or_reason_raw() -> None:
    record = {"JobId": "12", "JobName": HOSTILE_NAME, "JobState": "PENDING", "Reason": "Bad\x1b[31m\nreason 2",
              "NodeList": "(null)", "RunTime": "00:00:00", "Restarts": "0"}
    text = render_text(status_from_scontrol("12", record, folder="/jobs/job_12\x9b"))
    assert not any(ch in text for ch in RAW_CONTROLS), ascii(text)
    assert text.count("\n") == 1 and text.splitlines()[1].startswith("folder: ")  # no forged "folder:" line
    assert "xred folder: /etc/forged" in text and "reason Bad reason 2" in text


def test_status_json_escapes_c1_and_stays_strict() -> None:
    record = {"JobId": "12", "JobName": HOSTILE_NAME + "\udcff", "JobState": "RUNNING", "Reason": "None"}
    out = json_dumps(status_from_scontrol("12", record).to_dict())
    assert not any(ch in out for ch in RAW_CONTROLS if ch != "\n")
    assert json.loads(out)["name"].startswith("x\x1b]0;owned")
    out.encode("utf-8")  # no lone surrogate left


@pytest.mark.parametrize(("target", "words"), [("/nonexistent/x.sbatch", "No such file"),
                                                ("/dev/full", "No space left")])
def test_template_output_errors_are_one_line(tmp_path: Path, target: str, words: str) -> None:
    line = one_clean_error_line(run_cli("template", "srun-gpu", "-o", target, cwd=tmp_path), 1)
    assert words in line and "-o" in line


def test_template_to_a_full_stdout_is_one_line(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        done = run_cli("template", "srun-gpu", cwd=tmp_path, stdout=full)
    assert "No space left" in one_clean_error_line(done, 1)


@pytest.mark.parametrize("jobs", ["0", "1000000", str(10**30)])
def test_analyze_jobs_is_bounded(tmp_path: Path, jobs: str) -> None:
    (tmp_path / "a.log").write_text("hello\n")
    done = run_cli("analyze", "--jobs", jobs, str(tmp_path / "a.log"), cwd=tmp_path)
    assert done.returncode == 2 and "--jobs" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [
    ("analyze", "no\x1b[2Jpe\u009b"), ("template", "x\x1b]0;t\x07y"), ("status", "1\x1b[31m"),
    ("submit", "t\x1b[2J.py"), ("submit", "train.py", "--nodes", "2\x1b[31m"), ("analyze", "--format", "x\u009bq", "a"),
])
def test_own_arguments_with_escapes_are_sanitized_in_error_lines(tmp_path: Path, args: tuple[str, ...]) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode in (1, 2), done.stderr
    assert "Traceback" not in done.stderr
    assert not any(ch in done.stderr for ch in RAW_CONTROLS), ascii(done.stderr)


def test_a_new_jobs_folder_is_private(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "jobs"
    check_folder(folder)
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777, 0o757])
def test_a_jobs_folder_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(SubmitError) as refused:
        check_folder(folder)
    assert "writable by other users" in str(refused.value) and "chmod go-w" in refused.value.hint


def test_an_existing_private_or_readable_folder_is_accepted(tmp_path: Path) -> None:
    for mode in (0o700, 0o755):
        folder = tmp_path / f"jobs{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        check_folder(folder)


def test_submit_refuses_a_world_writable_folder(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    done = run_cli("submit", "train.py", "--local", "--folder", str(shared), cwd=tmp_path)
    assert "writable by other users" in one_clean_error_line(done, 1)
