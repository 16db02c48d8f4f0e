"""`ddpslurm analyze` as a person runs it: bad input gives one clear line or a diagnosis, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=120)


def one_error_line(done: subprocess.CompletedProcess, code: int) -> str:
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_nonexistent_path(tmp_path: Path) -> None:
    line = one_error_line(run(str(tmp_path / "nope")), 1)
    assert "no such file or folder" in line and "give a job folder" in line


def test_empty_folder(tmp_path: Path) -> None:
    line = one_error_line(run(str(tmp_path)), 1)
    assert "no log files found" in line


def test_socket_is_refused(tmp_path: Path) -> None:
    """A fifo given is read as it comes (test_analyze_io.py); a socket cannot be opened and read: one line."""
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        line = one_error_line(run(str(tmp_path / "sock")), 1)
    assert "not a regular file, folder or pipe" in line


def test_only_binary_garbage(tmp_path: Path) -> None:
    (tmp_path / "core").write_bytes(bytes(range(256)) * 64)
    line = one_error_line(run(str(tmp_path / "core")), 1)
    assert "only binary files" in line


def test_pickles_are_skipped_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    (tmp_path / "1_0_result.pkl").write_bytes(evil)
    (tmp_path / "1_0_log.err").write_text("ValueError: bad\n")
    done = run(str(tmp_path), "--json")
    assert done.returncode == 0 and not marker.exists()
    assert json.loads(done.stdout)["cause"] == "user_code_exception"


def test_non_utf8_and_truncated_file(tmp_path: Path) -> None:
    (tmp_path / "1_3_log.err").write_bytes(b"caf\xe9 \xff\xfe\nTraceback (most recent call last):\n  File \"x.py\", "
                                           b"line 1, in <module>\nRuntimeError: CUDA out of mem")
    done = run(str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    # the exception line is cut mid-way: its type is read, its cause is not (the message was CUDA's OOM)
    assert (got["cause"], got["first_failing_rank"]) == ("unknown", 3)


def test_huge_single_line_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    with path.open("wb") as handle:
        for _ in range(100):
            handle.write(b"x" * (1 << 20))  # one 100 MB line
        handle.write(b"\nslurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n")
    # the probe's own peak: Linux's VmHWM is this process image's; ru_maxrss keeps the peak of the process it was
    # forked from (pytest itself, 300+ MB late in the suite), across the exec
    probe = ("import os, resource, sys, json; from ddpslurm.analyze.api import analyze_paths; "
             f"d = analyze_paths([{str(path)!r}]); "
             "hwm = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')] "
             "if os.path.exists('/proc/self/status') else []; "
             "print(json.dumps([d.cause, hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cause, max_rss_kb = json.loads(done.stdout.splitlines()[-1])
    assert cause == "slurm_time_limit"
    assert max_rss_kb < 300 * 1024


def test_symlink_loop_terminates(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "loop").symlink_to(tmp_path)
    (tmp_path / "a" / "1_0_log.err").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    done = run(str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cause"] == "cuda_oom"


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    (tmp_path / "x.log").write_text("hello\n")
    assert one_error_line(run(str(tmp_path), "--attempt", "soon"), 2)
    assert run().returncode == 2
    assert run(str(tmp_path), "--format", "yaml").returncode == 2


def test_attempt_not_in_the_logs_is_a_usage_error(tmp_path: Path) -> None:
    for n in (0, 1):
        (tmp_path / f"attempt_{n}").mkdir()
        (tmp_path / f"attempt_{n}" / "rank_0.log").write_text("ValueError: x\n")
    line = one_error_line(run(str(tmp_path), "--attempt", "7"), 2)
    assert "attempts found: 0, 1" in line


def test_unknown_job_id(tmp_path: Path) -> None:
    line = one_error_line(run("987654", cwd=tmp_path), 1)
    assert "no job folder for job 987654" in line


def test_job_id_finds_the_job_folder(tmp_path: Path) -> None:
    job = tmp_path / "ddpslurm_jobs" / "job_555"
    job.mkdir(parents=True)
    (job / "555_1_log.err").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    done = run("555", "--json", cwd=tmp_path, env={"PATH": "/nonexistent"})  # no sacct: logs only
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["first_failing_rank"] == 1


def test_bad_site_signature_is_one_line(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "x.toml").write_text("[[signature]]\nid = \"x\"\ncause = \"nope\"\nrole = \"culprit\"\npattern = 'a'\n")
    (tmp_path / "l.log").write_text("x\n")
    line = one_error_line(run(str(tmp_path / "l.log"), "--signatures", str(site)), 1)
    assert "x.toml" in line and "unknown cause 'nope'" in line


def test_log_text_is_not_markup_nor_escape_codes(tmp_path: Path) -> None:
    (tmp_path / "1_0_log.err").write_text("ValueError: [bold red]boom[/] \x1b[2J\x1b]0;title\x07 done\n")
    text = run(str(tmp_path))
    assert text.returncode == 0, text.stderr
    assert "[bold red]boom[/]" in text.stdout
    assert "\x1b[2J" not in text.stdout and "\x1b]0;" not in text.stdout
    md = run(str(tmp_path), "--format", "markdown")
    assert md.returncode == 0 and "## ddpslurm analyze: `user_code_exception`" in md.stdout


@pytest.mark.parametrize("fmt", [["--json"], ["--format", "json"]])
def test_json_output_is_one_object(tmp_path: Path, fmt: list[str]) -> None:
    (tmp_path / "1_2_log.err").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    done = run(str(tmp_path), *fmt)
    assert done.returncode == 0 and done.stderr == ""
    got = json.loads(done.stdout)
    assert (got["cause"], got["first_failing_rank"]) == ("cuda_oom", 2)
