"""`ddpslurm analyze` input and output as a person meets them: a paste piped in (`-`, `<(...)`, a fifo), a report
piped on or read on a narrow terminal, each piece of evidence once with the frame that raised it, torchelastic's
boilerplate, the notes, contradictory formats, markup in Markdown, NUL runs in the logs of a crashed node."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddpslurm.analyze.read.blocks import iter_blocks
from ddpslurm.analyze.read.files import is_binary
from ddpslurm.analyze.read.streams import read_streams

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "analyzer" / "cases"
TRACEBACK = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 52, in <module>\n    step(batch)\n'
             '  File "/home/u/train.py", line 31, in step\n    raise ValueError("bad batch")\nValueError: bad batch\n')
#: NCCL's lost connection: what matters, the peer and `Broken pipe`, is at the end of a long line
BROKEN_PIPE = ("[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
               "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version "
               "2.20.5 ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
               "error. Last error: Call to recv from 10.0.3.7<43012> failed : Broken pipe\n")


def analyze(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
            pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """The command run as a person runs it, its stdout a pipe."""
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", *args], input=stdin,
                          capture_output=True, timeout=120, pass_fds=pass_fds, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def one_error_line(done: subprocess.CompletedProcess, code: int) -> str:
    err = done.stderr.decode()
    assert done.returncode == code, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- reading a paste: `-`, process substitution, a fifo -------------------------------------------------------------

def test_a_paste_piped_to_dash_is_read() -> None:
    done = analyze("-", "--json", stdin=TRACEBACK.encode())
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["cause"] == "user_code_exception"
    assert got["evidence"][0]["file"] == "<stdin>"


def test_a_shell_pipe_into_dash_is_read(tmp_path: Path) -> None:
    log = tmp_path / "paste.txt"
    log.write_text(TRACEBACK)
    cmd = f"cat {log} | {sys.executable} -m ddpslurm.cli analyze - --json"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cause"] == "user_code_exception"


@pytest.mark.skipif(shutil.which("bash") is None, reason="process substitution needs bash")
def test_process_substitution_is_read(tmp_path: Path) -> None:
    log = tmp_path / "n1.log"
    log.write_text(TRACEBACK)
    cmd = f"{sys.executable} -m ddpslurm.cli analyze <(cat {log}) --json"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["cause"] == "user_code_exception" and got["evidence"][0]["file"].startswith("/dev/fd/")


def test_a_pipe_given_as_dev_fd_is_read_with_a_file_beside_it(tmp_path: Path) -> None:
    (tmp_path / "1_1_log.err").write_text("[rank1]: torch.OutOfMemoryError: CUDA out of memory.\n")
    read, write = os.pipe()
    os.write(write, BROKEN_PIPE.encode())
    os.close(write)
    try:
        done = analyze(f"/dev/fd/{read}", str(tmp_path / "1_1_log.err"), "--json", pass_fds=(read,))
    finally:
        os.close(read)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["cause"], got["first_failing_rank"]) == ("cuda_oom", 1)


def test_a_named_fifo_is_read_as_its_writer_writes(tmp_path: Path) -> None:
    fifo = tmp_path / "rank_3.log"
    os.mkfifo(fifo)

    def writer() -> None:
        time.sleep(0.5)  # the command opens the fifo before anything writes
        with open(fifo, "w") as handle:
            handle.write(TRACEBACK)

    thread = threading.Thread(target=writer)
    thread.start()
    done = analyze(str(fifo), "--json")
    thread.join()
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["cause"], got["first_failing_rank"]) == ("user_code_exception", 3)  # rank from the name given


def test_a_fifo_inside_a_folder_is_skipped_and_said(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "1_0_log.err").write_text("ValueError: x\n")
    got = json.loads(analyze(str(tmp_path), "--json").stdout)
    assert any(s["path"].endswith("pipe") and "not a regular file" in s["reason"] for s in got["skipped"])


def test_empty_stdin_says_so() -> None:
    line = one_error_line(analyze("-", stdin=b""), 1)
    assert "<stdin> is empty" in line


def test_a_stream_that_never_closes_is_cut_at_the_deadline_and_reported() -> None:
    read, write = os.pipe()
    os.write(write, TRACEBACK.encode())  # the writer keeps its end open: `tail -f`
    try:
        with read_streams([f"/dev/fd/{read}"], deadline=0.5) as streams:
            copy = Path(streams.paths[0])
            assert copy.read_text() == TRACEBACK
            assert streams.shown[str(copy)] == f"/dev/fd/{read}"
            (cut,) = streams.skipped
            assert "still open after" in cut.reason and f"first {len(TRACEBACK)} bytes" in cut.reason
        assert not copy.exists()  # the copy goes with the block
    finally:
        os.close(read)
        os.close(write)


# --- output: a pipe, a narrow terminal ------------------------------------------------------------------------------

@pytest.fixture()
def lost_peer(tmp_path: Path) -> Path:
    (tmp_path / "1_1_log.err").write_text("[rank1]: torch.OutOfMemoryError: CUDA out of memory.\n")
    (tmp_path / "1_0_log.err").write_text(BROKEN_PIPE)
    return tmp_path


def test_piped_output_cuts_nothing(lost_peer: Path) -> None:
    done = analyze(str(lost_peer), env={"COLUMNS": ""})
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    assert "…" not in out
    row = next(line for line in out.splitlines() if line.startswith("│ 0 "))
    assert "Call to recv from 10.0.3.7<43012> failed : Broken pipe" in row  # the whole cell on one line


@pytest.mark.parametrize("how", [{"COLUMNS": "60"}, {"--width": "60"}])
def test_a_narrow_width_wraps_and_keeps_the_key_text(lost_peer: Path, how: dict[str, str]) -> None:
    args = ["--width", how["--width"]] if "--width" in how else []
    done = analyze(str(lost_peer), *args, env={"COLUMNS": how.get("COLUMNS", "")})
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 60
    cells = " ".join(line.split("│")[4].strip() for line in out.splitlines() if line.count("│") == 5)
    assert "10.0.3.7<43012>" in cells and "Broken pipe" in cells


def test_a_collapsed_rank_range_is_never_cut() -> None:
    from rich.console import Console

    from ddpslurm.analyze.model import Diagnosis, RankRow
    from ddpslurm.analyze.report.text import render_text

    rows = [RankRow(r, f"node{r // 8:03d}", "victim", "x" * 200) for r in range(260, 512)]
    d = Diagnosis(cause="unknown", first_failing_rank=None, first_failing_host=None, confidence="low",
                  summary="s", advice=[], evidence=[], ranks=rows, retry="unknown", exclude_nodes=[], notes=[])
    console = Console(file=io.StringIO(), width=50, highlight=False)
    render_text(d, console)
    out = console.file.getvalue()
    assert "260-511" in out and "…" not in out


def test_width_is_for_the_text_report_only(lost_peer: Path) -> None:
    assert "--width" in one_error_line(analyze(str(lost_peer), "--json", "--width", "80"), 2)


# --- the evidence: once, with its frame; torchelastic's pointer; the notes ------------------------------------------

def test_one_exception_in_three_files_is_one_piece_of_evidence_with_its_raising_frame() -> None:
    done = analyze(str(CASES / "lab-user_code_exception-1"), env={"COLUMNS": ""})
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    evidence = out.split("\nEvidence\n", 1)[1].split("\nRanks\n", 1)[0]
    assert evidence.count("ValueError: lab fault: bad batch at step 3") == 1
    assert "raised at /work/main/slurm/lab/ddp_fault.py:187 in main" in evidence
    assert "also in attempt_0/rank_3.exit.json:1, attempt_0/rank_3.log:14" in evidence
    assert "2815416_3_log.err:13  rank 3  2026-11-22T18:02:19.747Z" in evidence  # the exit record's time
    assert "Times were missing" not in out
    assert "rank 3 was singled out because it reported the failure itself" in out
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert len(notes) == len(set(notes))


def test_json_keeps_every_copy_for_scripts() -> None:
    got = json.loads(analyze(str(CASES / "lab-user_code_exception-1"), "--json").stdout)
    copies = [e["file"].rsplit("/", 1)[1] for e in got["evidence"] if e["text"].startswith("ValueError: lab fault")]
    assert copies == ["2815416_3_log.err", "rank_3.exit.json", "rank_3.log"]


def test_the_raising_frame_is_the_scripts(tmp_path: Path) -> None:
    (tmp_path / "1_2_log.err").write_text(TRACEBACK)
    got = analyze(str(tmp_path), "--format", "markdown").stdout.decode()
    assert "raised at /home/u/train.py:31 in step" in got


def test_torchelastic_pointer_to_its_docs_is_not_a_first_error() -> None:
    done = analyze(str(CASES / "user-exception-agent-sigterm-rank5-torch22-elastic-gen2"), "--json")
    got = json.loads(done.stdout)
    row = next(r for r in got["ranks"] if r["rank"] == 5)
    assert "To enable traceback" not in row["first_error"]
    assert "exited with exit code 1 (pid 268)" in row["first_error"]
    assert not any("To enable traceback" in e["text"] for e in got["evidence"])


# --- formats ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["markdown", "text"])
def test_json_and_another_format_is_a_usage_error(lost_peer: Path, fmt: str) -> None:
    line = one_error_line(analyze(str(lost_peer), "--json", "--format", fmt), 2)
    assert f"--json and --format {fmt}" in line


def test_markdown_shows_markup_in_log_text_as_text(tmp_path: Path) -> None:
    (tmp_path / "1_0_log.err").write_text("ValueError: [bold]loud[/] see [here](http://e.example/x) <b>b</b>\n")
    out = analyze(str(tmp_path), "--format", "markdown").stdout.decode()
    row = next(line for line in out.splitlines() if line.startswith("| 0 "))
    assert r"\[bold\]loud\[/\]" in row and r"\[here\](`http://e.example/x`)" in row and r"\<b\>" in row


# --- NUL runs -----------------------------------------------------------------------------------------------------

def test_nul_runs_in_a_crashed_nodes_log_are_noise(tmp_path: Path) -> None:
    log = tmp_path / "1_3_log.err"
    hole = b"\x00" * (1 << 20)  # a megabyte the dead node never wrote, inside the line written after it
    log.write_bytes(b"step 10 loss 2.1\nstep 11 lo\x00ss 2.0\n" + hole + TRACEBACK.encode() + b"\x00" * 4096)
    got = json.loads(analyze(str(log), "--json").stdout)
    assert (got["cause"], got["first_failing_rank"]) == ("user_code_exception", 3)
    assert got["evidence"][0]["text"] == "ValueError: bad batch"
    assert got["skipped"] == []


def test_a_mostly_binary_file_is_refused_and_reported(tmp_path: Path) -> None:
    (tmp_path / "1_0_log.err").write_text(TRACEBACK)
    (tmp_path / "core").write_bytes(b"\x7fELF\x02\x01\x01" + random.Random(0).randbytes(8000))
    got = json.loads(analyze(str(tmp_path), "--json").stdout)
    assert got["cause"] == "user_code_exception"
    assert {"path": str(tmp_path / "core"), "reason": "binary content (not a text log)"} in got["skipped"]


@pytest.mark.parametrize(("head", "binary"), [
    (b"a log line\n" * 100 + b"one NUL \x00 in a line\n", False),
    (b"\x00" * 8192, False),  # a hole: the log is read on past it
    (b"a log line of a usual length, from a writer that ends each one with a NUL: step 12\x00\n" * 100, False),
    ("утф-16 log line\n".encode("utf-16-le") * 100, True),  # NULs woven through the data
    (b"\x80\x04\x95pickle\x00\x00\x00\x00" * 50, True),
    (random.Random(0).randbytes(8192), True),  # compressed data
], ids=["nul-in-a-line", "hole", "nul-ended-lines", "utf-16", "pickle", "random"])
def test_is_binary_leaves_nul_runs_out(head: bytes, binary: bool) -> None:
    assert is_binary(head[:8192]) is binary


def test_blocks_leave_nuls_out_whatever_the_chunks() -> None:
    """Random logs of text, line ends and NUL runs, read in chunks of every size: the lines are the text's, NULs
    left out, none cut (each shorter than `max_line`)."""
    rng = random.Random(7)
    for _ in range(400):
        pieces = [rng.choice([b"\x00" * rng.choice([1, 16, 700, 5000]), b"\n", b"ab c" * rng.randint(1, 200)])
                  for _ in range(rng.randint(0, 25))]
        data = b"".join(pieces)
        lines = data.replace(b"\x00", b"").split(b"\n")
        longest = max(len(line) for line in lines)
        max_line = longest + 1
        chunk = max_line + 1 + rng.choice([0, 7, 300, 5000])
        got = b"".join(bytes(block[:end]) for block, end, _ in iter_blocks(io.BytesIO(data), chunk, max_line))
        want = b"".join(line + b"\n" for line in (lines[:-1] if lines[-1] == b"" else lines)) if data.strip(
            b"\x00") else b""
        assert got == want
