"""The scan's byte path: line ends counted compiled, with memchr or bytes.count alike,
repeated NCCL channel lines skipped on the block as `handle` would skip them, and the embedded-rank prefix looked
for only where its literal is."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse import attribution, file_scan, file_state, line_streams, scan
from ddpslurm.analyze.read import line_count
from ddpslurm.analyze.rules.loading import load_signatures

SIGS = load_signatures()


def _random_block(size: int, seed: int, newline_every: int) -> bytearray:
    """`size` random bytes with a newline every `newline_every` bytes besides those it drew."""
    rng = random.Random(seed)
    block = bytearray(rng.randbytes(size))
    for i in range(rng.randrange(newline_every), size, newline_every):
        block[i] = 10
    return block


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 700_000), seed=st.integers(0, 2**32), newline_every=st.integers(1, 5000),
       cut=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_the_line_ends_are_counted_as_bytes_count_counts_them(size: int, seed: int, newline_every: int,
                                                              cut: tuple[float, float]) -> None:
    """Both counters, the pure one (memchr pieces past REPLACE_MIN_BYTES) and the one the scan takes (compiled
    where it was built), on spans of every length, across REPLACE_PIECE's edges and of its exact size."""
    block = _random_block(size, seed, newline_every)
    start, end = sorted(int(c * size) for c in cut)
    whole = bytes(block)
    spans = [(start, end), (0, size)] + [(size - span, size) for span in
                                         (line_count.REPLACE_PIECE - 1, line_count.REPLACE_PIECE,
                                          line_count.REPLACE_PIECE + 1) if span <= size]
    for count in (line_count.pure_newlines, line_count.newlines):
        for lo, hi in spans:
            assert count(block, lo, hi) == block.count(b"\n", lo, hi)
            assert count(whole, lo, hi) == whole.count(b"\n", lo, hi)


def _long_gap_log(tmp_path: Path) -> SourceFile:
    """A log whose failure lines sit between long runs of lines without an anchor (the spans numpy counts)."""
    rng = random.Random(7)
    lines = []
    for block in range(6):
        lines += [f"step {i} | loss {rng.random():.4f} | tokens/s {rng.randint(1, 99999)}" for i in range(3000)]
        lines.append(f"[rank{block}]:[E612 10:24:0{block}.2 ProcessGroupNCCL.cpp:1] [Rank {block}] Watchdog caught "
                     "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                     "Timeout(ms)=600000) ran for 600038 milliseconds before timing out.")
    path = tmp_path / "5_0_log.err"
    path.write_text("\n".join(lines) + "\n")
    return SourceFile(path=str(path), display=path.name, rank=0, size=path.stat().st_size)


def test_a_scan_counts_the_lines_between_far_apart_candidates(tmp_path: Path) -> None:
    source = _long_gap_log(tmp_path)
    events, summary = scan.scan_file(source, SIGS)
    assert summary.lines == 6 * 3001
    assert [e.line for e in events if e.kind == "watchdog_timeout"] == [3001 * (i + 1) for i in range(6)]


#: NCCL heads of two processes, and the lines a channel-heavy INFO log mixes with its channel lines
#: (the third holds the channel words itself: its lines are found by a search that passes them first)
HEADS = ("gpu-a07:31337:31400 [2] NCCL INFO ", "node-12:4242:4300 [0] NCCL INFO ",
         "gpu-b01:7:8 [1] NCCL INFO Channel 00/0 : x NCCL INFO ")
OTHER = ("step 7 | loss 1.0", "gpu-a07:31337:31400 [2] NCCL INFO Connected all rings",
         "[rank5]:[E612 10:24:03.2 ProcessGroupNCCL.cpp:1] [Rank 5] Watchdog caught collective operation timeout: "
         "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600038 "
         "milliseconds before timing out.",
         "Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "ValueError: bad batch",
         "gpu-a07:31337:31400 [2] NCCL INFO comm 0x5a1 rank 5 nRanks 16 nNodes 2 localRanks 8 localRank 2 MNNVL 0",
         # a head's channel words with no direction, and with a channel line's words only further on
         "gpu-a07:31337:31400 [2] NCCL INFO Channel 03/0 : 5[2] -> 6[0] via P2P/IPC",
         "gpu-a07:31337:31400 [2] NCCL INFO Channel 01/0 : oops NCCL INFO Channel 02/0 : 5[2] -> 6[0] [send] via NET")


def _channel(head: str, channel: int, me: int, peer: int, send: bool) -> str:
    pair = f"{me}[2] -> {peer}[0] [send]" if send else f"{peer}[0] -> {me}[2] [receive]"
    return f"{head}Channel {channel:02d}/0 : {pair} via NET/IB/0/GDRDMA"


channel_lines = st.builds(_channel, st.sampled_from(HEADS), st.integers(0, 31), st.sampled_from((5, 9)),
                          st.integers(0, 15), st.booleans())


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.one_of(channel_lines, channel_lines, st.sampled_from(OTHER)), min_size=1, max_size=80))
def test_channel_lines_skipped_on_the_block_give_what_handle_gives(tmp_path_factory, lines: list[str]) -> None:
    """Skipping a repeated channel line before it is cut out changes no event, no line number, no line count."""
    path = tmp_path_factory.mktemp("channels") / "job.log"
    path.write_text("\n".join(lines) + "\n")
    source = SourceFile(path=str(path), display="job.log", size=path.stat().st_size)
    key = lambda result: ([(e.line, e.kind, e.signature, e.pid, e.fields) for e in result[0]],  # noqa: E731
                          result[1].lines)
    fast = scan.scan_file(source, SIGS)
    real = file_scan.told_channel_line
    try:
        file_scan.told_channel_line = lambda *args: False  # every candidate line reaches `handle`
        slow = scan.scan_file(source, SIGS)
    finally:
        file_scan.told_channel_line = real
    assert key(fast) == key(slow)


def test_a_repeated_channel_line_is_skipped_on_the_block(tmp_path: Path, monkeypatch) -> None:
    lines = [_channel(HEADS[0], c, 5, 6, True) for c in range(10)]
    path = tmp_path / "job.log"
    path.write_text("\n".join(lines) + "\n")
    handled: list[int] = []
    real = file_state.FileState.handle
    monkeypatch.setattr(file_state.FileState, "handle",
                        lambda self, raw, n, *key: handled.append(n) or real(self, raw, n, *key))
    events, summary = scan.scan_file(SourceFile(path=str(path), display="job.log", size=path.stat().st_size), SIGS)
    assert handled == [1] and summary.lines == 10
    assert [(e.line, e.get("nccl_rank")) for e in events] == [(1, "5")]


@settings(max_examples=300, deadline=None)
@given(before=st.text(st.sampled_from("ab [(]):|\t"), max_size=170), tag=st.sampled_from(("[rank", "[Rank", "[Rank ")),
       number=st.integers(0, 99999), after=st.sampled_from(("]: x", "]:", "] x", "]")))
def test_the_embedded_rank_is_looked_for_wherever_it_can_be(before: str, tag: str, number: int, after: str) -> None:
    text = f"{before}{tag}{number}{after}"
    found = attribution.EMBEDDED_RANK.search(text, 0, 160) is not None
    assert not found or attribution.may_embed_rank(text)
    assert attribution.may_embed_rank(text) == (tag[:5] in text[:160])


@pytest.mark.parametrize("pure", ["1", "0"])
def test_no_process_of_a_scan_imports_numpy(tmp_path: Path, pure: str) -> None:
    """The parent holds the job's events at its peak, and a worker's memory is the machine's too: neither the
    pool's workers nor a process scanning alone imports numpy (10 MB), on the pure path or the compiled one."""
    source = _long_gap_log(tmp_path)
    probe = (
        "import sys\n"
        "from ddpslurm.analyze.parse import scan, scan_tasks\n"
        "from ddpslurm.analyze.model import FileSummary, SourceFile\n"
        "from ddpslurm.analyze.rules.loading import load_signatures\n"
        "scan.PARALLEL_MIN_BYTES = 0\n"
        f"s = SourceFile(path={source.path!r}, display='a', rank=0, size={source.size})\n"
        "results = scan.scan_files([s, s, s], load_signatures(), workers=2)\n"
        "print([summary.lines for _, summary in results], 'numpy' in sys.modules)\n"
        "real = scan_tasks.scan_file\n"
        "def probed(*a, **k):\n"
        "    events, summary = real(*a, **k)\n"
        "    summary.last_line = str('numpy' in sys.modules)\n"
        "    return events, summary\n"
        "scan_tasks.scan_file = probed\n"
        "print(*{summary.last_line for _, summary in scan.scan_files([s, s], load_signatures(), workers=2)})\n"
        "scan_tasks.scan_file = real\n"
        "results = scan.scan_files([s], load_signatures(), workers=1)\n"
        "print('numpy' in sys.modules)\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2], env={**os.environ, "DDPSLURM_PURE_SCAN": pure})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[18006,", "18006,", "18006]", "False", "False", "False"]


@given(st.text(alphabet="torchdistribuelag ./", max_size=40))
def test_the_torchrun_words_looked_for_first_change_no_answer(body: str) -> None:
    assert line_streams.mentions_torchrun(body) == (line_streams.TORCHRUN.search(body) is not None)
