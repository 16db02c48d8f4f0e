"""The scan's byte path: line ends counted with numpy, memchr or bytes.count alike (numpy imported once it pays),
repeated NCCL channel lines skipped on the block as `handle` would skip them, and the embedded-rank prefix looked
for only where its literal is."""

from __future__ import annotations

import builtins
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


@pytest.fixture
def fresh_counter():
    """The module's per-process state as a new process has it (no numpy yet, nothing counted), and after."""
    line_count.start_afresh()
    yield
    line_count.start_afresh()


def _random_block(size: int, seed: int, newline_every: int) -> bytearray:
    """`size` random bytes with a newline every `newline_every` bytes besides those it drew."""
    rng = random.Random(seed)
    block = bytearray(rng.randbytes(size))
    for i in range(rng.randrange(newline_every), size, newline_every):
        block[i] = 10
    return block


@settings(max_examples=200, deadline=None)
@given(size=st.integers(0, 100_000), seed=st.integers(0, 2**32), newline_every=st.integers(1, 3000),
       cut=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_numpy_counts_the_line_ends_bytes_count_counts(size: int, seed: int, newline_every: int,
                                                        cut: tuple[float, float]) -> None:
    block = _random_block(size, seed, newline_every)
    start, end = sorted(int(c * size) for c in cut)
    line_count.follow_parent(use_numpy=True)
    try:
        assert line_count.counting_with_numpy()
        assert line_count.newlines(block, start, end) == block.count(b"\n", start, end)
        assert line_count.newlines(bytes(block), 0, size) == block.count(b"\n")
    finally:
        line_count.start_afresh()


@settings(max_examples=200, deadline=None)
@given(size=st.integers(0, 700_000), seed=st.integers(0, 2**32), newline_every=st.integers(1, 5000),
       cut=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_memchr_pieces_count_the_line_ends_bytes_count_counts(size: int, seed: int, newline_every: int,
                                                              cut: tuple[float, float]) -> None:
    block = _random_block(size, seed, newline_every)
    start, end = sorted(int(c * size) for c in cut)
    line_count.start_afresh()
    line_count.follow_parent(use_numpy=False)  # a process that never imports numpy
    try:
        assert line_count.newlines(block, start, end) == block.count(b"\n", start, end)
        assert line_count.newlines(bytes(block), 0, size) == block.count(b"\n")
        whole = bytes(block)  # spans across REPLACE_PIECE's edges, and of its exact size
        for span in (line_count.REPLACE_PIECE - 1, line_count.REPLACE_PIECE, line_count.REPLACE_PIECE + 1):
            if span <= size:
                assert line_count.newlines(whole, size - span, size) == whole.count(b"\n", size - span)
        assert not line_count.counting_with_numpy()
    finally:
        line_count.start_afresh()


def test_numpy_is_imported_once_long_spans_have_cost_its_import(fresh_counter, monkeypatch) -> None:
    monkeypatch.setattr(line_count, "NUMPY_AFTER_BYTES", 50_000)
    block = b"x" * 99 + b"\n"
    block *= 1000  # 100 kB
    for _ in range(100):  # short spans do not count towards it (100 kB of them)
        assert line_count.newlines(block, 0, 1000) == 10
    assert not line_count.counting_with_numpy()
    assert line_count.newlines(block, 0, 20_000) == 200
    assert line_count.newlines(block, 20_000, 49_999) == 299
    assert not line_count.counting_with_numpy()  # 49,999 bytes of long spans so far
    assert line_count.newlines(block, 0, 16_384) == 163  # the span that reaches it is counted with numpy
    assert line_count.counting_with_numpy()


def test_without_numpy_the_line_ends_are_counted_all_the_same(fresh_counter, monkeypatch) -> None:
    real_import = builtins.__import__
    tried: list[str] = []

    def no_numpy(name, *args, **kwargs):
        if name == "numpy":
            tried.append(name)
            raise ImportError("no numpy here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(line_count, "NUMPY_AFTER_BYTES", 0)
    monkeypatch.setattr(builtins, "__import__", no_numpy)
    block = b"a\n" * 40_000
    assert line_count.newlines(block, 3, len(block)) == block.count(b"\n", 3)
    assert line_count.newlines(block, 0, len(block)) == 40_000
    assert tried == ["numpy"]  # looked for once, not at every span
    assert not line_count.counting_with_numpy()


def test_the_parent_weighs_the_import_against_each_workers_share() -> None:
    gb = 1 << 30
    assert line_count.worth_importing(5 * gb, 2)  # the 65k-rank job, 2.5 GB a worker: 0.34 s saved, 0.165 spent
    assert not line_count.worth_importing(gb, 2)  # the 1 GB job, 0.5 GB a worker: 0.07 s saved, not worth it
    assert line_count.worth_importing(3 * gb, 1)
    assert not line_count.worth_importing(5 * gb, 8)
    assert not line_count.worth_importing(0, 2)


@pytest.mark.parametrize("use_numpy", [True, False])
def test_a_worker_counts_the_way_its_parent_decided(fresh_counter, monkeypatch, use_numpy: bool) -> None:
    monkeypatch.setattr(line_count, "NUMPY_AFTER_BYTES", 1000)
    line_count.follow_parent(use_numpy)
    assert line_count.counting_with_numpy() == use_numpy  # imported as it starts, or
    block = b"x" * 99 + b"\n"
    assert line_count.newlines(block * 1000, 0, 100_000) == 1000
    assert line_count.counting_with_numpy() == use_numpy  # never, past NUMPY_AFTER_BYTES too


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


def test_a_scan_with_numpy_counts_gives_the_same_lines(tmp_path: Path, fresh_counter, monkeypatch) -> None:
    source = _long_gap_log(tmp_path)
    monkeypatch.setattr(line_count, "NUMPY_AFTER_BYTES", 1 << 40)
    plain_events, plain = scan.scan_file(source, SIGS)
    assert not line_count.counting_with_numpy()
    line_count.follow_parent(use_numpy=True)
    assert line_count.counting_with_numpy()
    events, summary = scan.scan_file(source, SIGS)
    assert summary.lines == plain.lines == 6 * 3001
    assert [(e.line, e.signature) for e in events] == [(e.line, e.signature) for e in plain_events]
    assert [e.line for e in events if e.kind == "watchdog_timeout"][:2] == [3001, 6002]


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


@pytest.mark.parametrize(("import_s", "workers_import"), [(0.0, True), (1e9, False)])
def test_the_workers_count_with_numpy_and_the_parent_does_not_import_it(tmp_path: Path, import_s: float,
                                                                         workers_import: bool) -> None:
    """The parent holds the job's events at its peak: numpy (10 MB) is imported by the processes that count, as
    they start when the parent found it worth it (an import that costs nothing here), else by none of them."""
    source = _long_gap_log(tmp_path)
    probe = (
        "import sys\n"
        "from ddpslurm.analyze.read import line_count\n"
        "from ddpslurm.analyze.parse import scan, scan_tasks\n"
        "from ddpslurm.analyze.model import FileSummary, SourceFile\n"
        "from ddpslurm.analyze.rules.loading import load_signatures\n"
        f"scan.PARALLEL_MIN_BYTES = line_count.NUMPY_AFTER_BYTES = 0; line_count.NUMPY_IMPORT_S = {import_s!r}\n"
        f"s = SourceFile(path={source.path!r}, display='a', rank=0, size={source.size})\n"
        "results = scan.scan_files([s, s, s], load_signatures(), workers=2)\n"
        "print([summary.lines for _, summary in results], 'numpy' in sys.modules)\n"
        "real = scan_tasks.scan_file\n"
        "scan_tasks.scan_file = lambda *a, **k: ([], FileSummary(file='a', last_line=str('numpy' in sys.modules)))\n"
        "print(*{summary.last_line for _, summary in scan.scan_files([s, s], load_signatures(), workers=2)})\n"
        "scan_tasks.scan_file = real\n"
        "results = scan.scan_files([s], load_signatures(), workers=1)\n"
        "print('numpy' in sys.modules)\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "DDPSLURM_PURE_SCAN": "1"})  # the compiled path counts without numpy
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[18006,", "18006,", "18006]", "False", str(workers_import), "True"]


@given(st.text(alphabet="torchdistribuelag ./", max_size=40))
def test_the_torchrun_words_looked_for_first_change_no_answer(body: str) -> None:
    assert line_streams.mentions_torchrun(body) == (line_streams.TORCHRUN.search(body) is not None)
