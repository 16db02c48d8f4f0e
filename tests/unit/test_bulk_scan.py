"""The compiled bulk path (read/_bulk.c) against the pure-Python path, its reference: each C function against its
Python twin on random bytes, and whole scans and diagnoses of the corpus, the benchmark's generated jobs and
adversarial files through both paths, which must find the same events, summaries and answers."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse import channel_lines, file_scan, file_summary, line_recipes, scan
from ddpslurm.analyze.read import bulk, files, prefilter
from ddpslurm.analyze.read.blocks import CHUNK, MAX_LINE
from ddpslurm.analyze.rules.loading import load_signatures
from tests.unit.test_analyze_line_recipes import _load_generator

BULK = bulk.BULK
pytestmark = pytest.mark.skipif(BULK is None, reason="the compiled bulk path is not built in this checkout")

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "analyzer" / "cases"
#: a sample of the corpus's logs at the scan level (every case is diagnosed both ways below)
LOGS = random.Random(48).sample(sorted(p for p in CASES.rglob("*") if p.is_file() and p.stat().st_size < 1 << 20
                                       and p.suffix in (".out", ".err", ".log", ".txt")), 300)


@contextlib.contextmanager
def pure_path() -> Iterator[None]:
    """Every place that takes the bulk path takes the pure one (what DDPSLURM_PURE_SCAN=1 does at import)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(file_scan, "BULK", None)
        patch.setattr(files, "BULK", None)
        patch.setattr(prefilter, "BULK", None)
        patch.setattr(file_summary, "BULK", None)
        patch.setattr(line_recipes, "_shape", line_recipes.masked_shape)
        patch.setattr(line_recipes, "BULK", None)  # recipes replayed in Python (a recipe's plan left unread)
        yield


def _scan(path: Path, start: int = 0, end: int | None = None, sigs=None) -> tuple:
    source = SourceFile(path=str(path), display=path.name, size=path.stat().st_size)
    events, summary = scan.scan_file(source, sigs or load_signatures(), 2024, start=start, end=end)
    return events, dataclasses.asdict(summary)


def _both(path: Path, start: int = 0, end: int | None = None) -> tuple[tuple, tuple]:
    compiled = _scan(path, start, end)
    with pure_path():
        pure = _scan(path, start, end)
    return compiled, pure


# --- the C functions against their twins ---------------------------------------------------------------------

#: bytes a line's shape turns on: digits, dates' dashes, hex runs and what bounds them, and some others
_SHAPE_BYTES = st.binary(max_size=80) | st.lists(st.sampled_from(
    [b"0", b"1", b"9", b"2026", b"-", b"12-02", b"0000-00-00", b"1999-", b" ", b"x", b"\xff", b"\n", b"\r",
     b"0x", b"0X", b"ab", b"f", b"g", b"A", b"_", b"=", b"(", b"{", b",", b"\t", b"["]),
    max_size=40).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(raw=_SHAPE_BYTES)
def test_shape_is_masked_shape(raw: bytes) -> None:
    assert BULK.shape(raw) == line_recipes.masked_shape(raw)
    assert BULK.shape(bytearray(raw)) == line_recipes.masked_shape(raw)


_CHANNEL_PIECES = [b" NCCL INFO Channel ", b"00", b"7", b"/", b"02", b" : ", b"3", b"[", b"1a0", b"Ff", b"]",
                   b" -> ", b"4", b"[1b0]", b" [send] via", b" [receive] via", b" [", b"send", b"] via", b"x",
                   b" NCCL INFO Channel 00/02 : 3[1a0] -> 4[1b0] [send] via", b"\xc3", b"\n", b" "]


@settings(max_examples=1000, deadline=None)
@given(line=st.lists(st.sampled_from(_CHANNEL_PIECES), max_size=30).map(b"".join) | st.binary(max_size=100),
       cut=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_channel_key_is_the_regex_search(line: bytes, cut: tuple[float, float]) -> None:
    start, end = sorted(int(c * len(line)) for c in cut)
    assert BULK.channel_key(line, start, end) == channel_lines.line_channel_key(line, start, end)
    assert BULK.channel_key(bytearray(line), 0, len(line)) == channel_lines.line_channel_key(line, 0, len(line))


#: channel lines of two heads and three ranks, and lines that only look like them
_CHANNEL_RUN_LINES = [b"h1:7:7 [0] NCCL INFO Channel 00/02 : 3[1a0] -> 4[1b0] [send] via NET",
                      b"h1:7:7 [0] NCCL INFO Channel 01/02 : 3[1a0] -> 4[1b0] [send] via NET",
                      b"h1:7:7 [0] NCCL INFO Channel 01/02 : 5[1a0] -> 3[1b0] [receive] via NET",
                      b"h1:7:7 [0] NCCL INFO Channel 02/02 : 4[1a0] -> 3[1b0] [send] via NET",
                      b"h2:7:7 [0] NCCL INFO Channel 00/02 : 3[1a0] -> 4[1b0] [send] via NET",
                      b"h1:7:7 [0] NCCL INFO Channel 00/02 : 3[1a0] -> 4[1b0] [recv] via NET",
                      b"h1:7:7 [0] NCCL INFO Channel", b"h1:7:7 [0] NCCL WARN x", b"N NCCL INFO Channel 0 : 3[a] -> 4"]


@settings(max_examples=500, deadline=None)
@given(picks=st.lists(st.integers(0, len(_CHANNEL_RUN_LINES) - 1), max_size=40),
       known=st.sets(st.integers(0, 5)))
def test_the_told_channel_key_kept_from_call_to_call_tells_what_the_set_tells(picks: list[int],
                                                                              known: set[int]) -> None:
    """`next_line` with the key last found told kept (`told`) passes over exactly the lines it passes over
    looking every key up in the set, whatever runs of heads, ranks and look-alike lines come."""
    lines = [_CHANNEL_RUN_LINES[i] for i in picks]
    block = b"".join(ln + b"\n" for ln in lines)
    starts = [sum(len(ln) + 1 for ln in lines[:i]) for i in range(len(lines))]
    channels = {channel_lines.line_channel_key(ln, 0, len(ln)) for ln in (_CHANNEL_RUN_LINES[i] for i in known)}
    channels.discard(None)

    def walk(told: list | None) -> list[tuple]:
        out, cur, idx, lineno = [], 0, 0, 0
        while True:
            idx, start, end, lineno, raw, key = BULK.next_line(block, len(block), cur, starts, idx, lineno, channels,
                                                               {}, 512, MAX_LINE, told)
            out.append((idx, start, end, lineno, raw, key))
            if start < 0:
                return out
            cur = end + 1

    assert walk([None]) == walk(None)
    told_ones = {i for i, ln in enumerate(lines) if channel_lines.line_channel_key(ln, 0, len(ln)) in channels}
    assert [row[0] for row in walk([None])[:-1]] == [i for i in range(len(lines)) if i not in told_ones]


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 300_000), seed=st.integers(0, 2**32), every=st.integers(1, 5000),
       cut=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_newlines_and_control_bytes_are_counted_as_python_counts_them(size: int, seed: int, every: int,
                                                                       cut: tuple[float, float]) -> None:
    rng = random.Random(seed)
    block = bytearray(rng.randbytes(size))
    for i in range(rng.randrange(every), size, every):
        block[i] = 10
    start, end = sorted(int(c * size) for c in cut)
    assert BULK.newlines(block, start, end) == block.count(b"\n", start, end)
    head = bytes(block[:8192])
    with pure_path():
        pure = files.control_bytes(head)
    assert files.control_bytes(head) == pure


#: bytes a block's lines and their shapes turn on: line ends, digits, control and high bytes, ddpslurm's and
#: submitit's heads, carriage returns and escapes
_TAIL_PIECES = [b"\n", b"\n", b"a", b"step 12", b" ", b"\t", b"\r", b"\x0b", b"\x0c", b"\x00", b"\x7f", b"\xff\xfe",
                b"ddpslurm: ", b"submitit INFO", b"\x1b[1m", b"\x1b]0;t\x07", b"2026-12-02", b"x" * 40]
_BLOCKS = st.lists(st.sampled_from(_TAIL_PIECES), max_size=60).map(b"".join) | st.binary(max_size=300)


@settings(max_examples=500, deadline=None)
@given(block=_BLOCKS, runs=st.lists(st.lists(st.floats(0, 1), max_size=20), max_size=3), tuples=st.booleans())
def test_line_starts_is_the_python_loop(block: bytes, runs: list[list[float]], tuples: bool) -> None:
    """Each automaton's matches (ascending ends, or the (pattern, start, end) tuples it reports), merged: the
    start of each line holding one, as the pure loop finds them on the sorted ends."""
    size = len(block)
    if not size:
        assert BULK.line_starts(block, 0, [[], []]) == prefilter.line_starts(block, 0, []) == []
        return
    ends = [sorted(1 + int(f * (size - 1)) for f in run) for run in runs]
    given_runs = [[(0, e - 1, e) for e in run] if tuples else run for run in ends]
    want = prefilter.line_starts(block, size, sorted(e for run in ends for e in run))
    assert BULK.line_starts(block, size, given_runs) == want
    assert BULK.line_starts(bytearray(block) + b"tail", size, given_runs) == want  # a reused buffer, longer


def test_line_starts_refuses_what_is_no_match_end() -> None:
    for runs in ([[0]], [[4]], [[2, 1]], [[(0, 1)]], [["x"]]):
        with pytest.raises((ValueError, TypeError)):
            BULK.line_starts(b"ab\nc", 3, runs)
    with pytest.raises(TypeError):
        BULK.line_starts(b"ab\nc", 3, [(1, 2)])
    with pytest.raises(ValueError):
        BULK.line_starts(b"ab\nc", 9, [[1]])


@settings(max_examples=300, deadline=None)
@given(block=_BLOCKS, count=st.integers(0, 8), cut=st.integers(0, 20), window=st.integers(0, 400),
       at=st.floats(0, 1))
def test_last_lines_are_the_python_split(block: bytes, count: int, cut: int, window: int, at: float) -> None:
    end = int(at * len(block))
    want = [piece[:cut] for piece in file_summary.last_lines(block, count, end, window)]
    assert BULK.last_lines(block, count, end, cut, window) == want
    assert BULK.last_lines(bytearray(block), count, end, cut, window) == want


def test_last_lines_of_long_lines_and_refused_arguments() -> None:
    """Lines past MAX_LINE and past the window (the first line then is the rest of one), a block without a line
    end, an empty one; a span out of the buffer is refused."""
    long = b"x" * (3 * MAX_LINE)
    for block in (long + b"\n" + long + b"\n", long, b"", b"\n", b"a\n\n", long + b"\n" + b"b\nc"):
        for count in (0, 1, 2, 64):
            want = [p[:400] for p in file_summary.last_lines(block, count)]
            assert BULK.last_lines(block, count, len(block), 400, file_summary.TAIL_WINDOW) == want
    with pytest.raises(ValueError):
        BULK.last_lines(b"a\n", 1, 5, 400, 10)
    with pytest.raises(ValueError):
        BULK.last_lines(b"a\n", -1, 2, 400, 10)


def test_control_bytes_are_the_set_is_binary_counts() -> None:
    """_bulk.control_bytes's set, written in C as ranges, is files._CONTROL_BYTES byte for byte."""
    for b in range(256):
        assert BULK.control_bytes(bytes([b])) == (b in files._CONTROL_BYTES), b
    every = bytes(range(256)) * 40  # past the vectorized loop's 4,080-byte rounds, and a rest after them
    assert BULK.control_bytes(every + b"\x01" * 7) == len(files._CONTROL_BYTES) * 40 + 7


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000))
def test_crc32_is_zlibs(data: bytes) -> None:
    assert BULK.crc32(data) == zlib.crc32(data)
    assert BULK.crc32(bytearray(data[1:])) == zlib.crc32(data[1:])  # every alignment of the 8-byte steps


def _pure_marks(lines: list[bytes]) -> tuple[bytes, bytes | None]:
    shapes = file_summary.byte_shapes(lines)
    return file_summary.line_marks(shapes), file_summary.last_shown(shapes)


@settings(max_examples=1000, deadline=None)
@given(lines=st.lists(st.lists(st.sampled_from(_TAIL_PIECES), max_size=8).map(b"".join) | st.binary(max_size=30),
                      max_size=12))
def test_tail_marks_are_the_python_marks(lines: list[bytes]) -> None:
    """The marks and the last shape of a file's last lines as byte_shapes and line_marks give them; a line with a
    line end or an escape byte is left to the Python path (None)."""
    got = BULK.tail_marks(lines, file_summary.SHOWN_LINES, file_summary._OWN_BYTES)
    if any(b"\n" in ln or b"\x1b" in ln for ln in lines):
        assert got is None
    else:
        assert got == _pure_marks(lines)


#: lines whose shapes repeat (digits deleted), two of them of one length with other bytes
_REPEATING = st.lists(st.tuples(st.sampled_from([b"step {} | loss {}", b"step {} | lost {}", b"ddpslurm: {} {}",
                                                  b"\t{}\r{}", b"{}{}"]),
                                st.integers(0, 10**6), st.integers(0, 99)).map(lambda t: t[0].replace(
                                    b"{}", str(t[1]).encode(), 1).replace(b"{}", str(t[2]).encode(), 1)),
                      max_size=70)


@settings(max_examples=500, deadline=None)
@given(lines=_REPEATING)
def test_tail_marks_of_lines_that_repeat_a_shape_are_the_python_marks(lines: list[bytes]) -> None:
    """A run of lines of one shape (a training loop's progress lines) has its mark computed once in C: the marks
    are still each line's, also where a shape of the same length but other bytes follows."""
    assert BULK.tail_marks(lines, file_summary.SHOWN_LINES, file_summary._OWN_BYTES) == _pure_marks(lines)


@pytest.mark.skipif(not prefilter.AUTOMATON_AVAILABLE, reason="ahocorasick_rs is not installed")
def test_the_prefilter_and_the_tail_of_real_logs_are_alike_both_ways() -> None:
    """The corpus sample's logs: their candidate lines found by the automata, each block's last lines and the
    marks of the file's last lines, in C and in Python."""
    anchors = load_signatures().anchors
    compiled_finder, pure_finder = prefilter.AutomatonFinder(anchors), prefilter.AutomatonFinder(anchors)
    assert len(compiled_finder.automata) > 1  # the shipped anchors outgrow one: runs merged
    checked = 0
    for path in LOGS:
        block = path.read_bytes()
        compiled = compiled_finder.starts(block)
        with pure_path():
            assert pure_finder.starts(block) == compiled, path
        lines = BULK.last_lines(block, file_summary.TAIL_LINES, len(block), file_summary.TAIL_CHARS,
                                file_summary.TAIL_WINDOW)
        assert lines == [p[:file_summary.TAIL_CHARS] for p in file_summary.last_lines(block, file_summary.TAIL_LINES)]
        got = BULK.tail_marks(lines, file_summary.SHOWN_LINES, file_summary._OWN_BYTES)
        if got is not None:
            assert got == _pure_marks(lines), path
            checked += 1
    assert checked > len(LOGS) // 2


def test_bad_arguments_raise_and_do_not_crash() -> None:
    with pytest.raises(ValueError):
        BULK.newlines(b"abc", 2, 9)
    with pytest.raises(ValueError):
        BULK.channel_key(b"abc", -1, 2)
    with pytest.raises(ValueError):
        BULK.next_line(b"a\n", 2, 0, [5], 0, 0, set(), {}, 512, MAX_LINE, None)
    with pytest.raises(TypeError):
        BULK.next_line(b"a\n", 2, 0, [0], 0, 0, set(), {}, 512, MAX_LINE)
    with pytest.raises(TypeError):
        BULK.next_line(b"a\n", 2, 0, [0], 0, 0, set(), {}, 512, MAX_LINE, [])
    with pytest.raises(TypeError):
        BULK.next_line("a\n", 2, 0, [0], 0, 0, set(), {}, 512, MAX_LINE, None)
    with pytest.raises(TypeError):
        BULK.control_bytes("text")
    with pytest.raises(TypeError):
        BULK.tail_marks([b"a", "text"], 6, (b"ddpslurm:",))
    with pytest.raises(TypeError):
        BULK.tail_marks([b"a"], 6, ("ddpslurm:",))


# --- whole scans: random files built of the lines big jobs repeat ----------------------------------------------

_LINES = [
    "gpu-{a}:{b}:{c} [{d}] NCCL INFO Channel {e:02d}/02 : {f}[{g}] -> {h}[{g}] [send] via NET/IB/{d}",
    "gpu-{a}:{b}:{c} [{d}] NCCL INFO Channel {e:02d}/02 : {f}[{g}] -> {h}[{g}] [receive] via NET/IB/{d}",
    "gpu-{a}:{b}:{c} [{d}] NCCL INFO NET/IB : Using [0]mlx5_{d}:1/IB ; OOB ib0:10.0.{a}.{b}<0>",
    "gpu-{a}:{b}:{c} [{d}] NCCL INFO Trees [0] {e}/-1/-1->{f}->{h} [1] {e}/-1/-1->{f}->{h}",
    "gpu-{a}:{b}:{c} [{d}] NCCL INFO comm 0x{g}f rank {f} nRanks 16 nNodes 2 localRanks 8 localRank {d} MNNVL 0",
    "gpu-{a}:{b}:{c} [{d}] NCCL INFO comm 0x{g}f rank {f} nranks 16 cudaDev {d} busId {g}000 - Init COMPLETE",
    "2026-12-0{d} 10:{e:02d}:{b:02d} step {c} loss {a}.{b}",
    "[rank{f}]:[E1202 10:{e:02d}:00.{c} {b} ProcessGroupNCCL.cpp:{c}] [PG ID 0 PG GUID 0(default_pg) Rank {f}] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum={c}, OpType=ALLREDUCE, NumelIn={c}, "
    "NumelOut={c}, Timeout(ms)=600000) ran for 60000{d} milliseconds before timing out.",
    "[rank{f}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {d}.00 GiB. GPU {d} has a total "
    "capacity of 79.15 GiB of which {a} MiB is free.",
    "Traceback (most recent call last):",
    '  File "/work/train.py", line {c}, in <module>',
    "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:{c}, unhandled system error",
    "srun: error: gpu-{a}: task {f}: Exited with exit code 1",
    "W1202 10:00:{b:02d} {c} torch/distributed/elastic/multiprocessing/api.py:{c}] Sending process {c} closing "
    "signal SIGTERM",
    "{f}: NCCL WARN NET/IB : Got completion from peer 10.0.{a}.{b}<{c}> with status=12 opcode=0 len=0",
]


def _line(rng: random.Random) -> bytes:
    nums = {k: rng.choice([0, 1, 7, 12, 305, 4021]) for k in "abcdfh"}
    text = rng.choice(_LINES).format(**nums, e=rng.randrange(32), g=rng.choice(["1a0", "c0", "3f"]))
    line = text.encode()
    twist = rng.random()
    if twist < 0.03:
        line = line * (MAX_LINE // len(line) + 2)  # past MAX_LINE, holding anchors
    elif twist < 0.06:
        line += b"\r"
    elif twist < 0.08:
        line = line[:10] + b"\x00\x00" + line[10:]
    elif twist < 0.10:
        line += b" \xff\xfe\xc3("  # not UTF-8
    elif twist < 0.12:
        line = b""
    return line


def _write(path: Path, seed: int, count: int, final_newline: bool) -> Path:
    rng = random.Random(seed)
    body = b"\n".join(_line(rng) for _ in range(count))
    path.write_bytes(body + (b"\n" if final_newline and body else b""))
    return path


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), count=st.integers(0, 400), final_newline=st.booleans())
def test_random_files_scan_alike_both_ways(tmp_path: Path, seed: int, count: int, final_newline: bool) -> None:
    path = _write(tmp_path / "rank.out", seed, count, final_newline)
    compiled, pure = _both(path)
    assert compiled == pure
    size = path.stat().st_size
    if size > 10:  # a range of the file, as a worker reads one: a block open at its end is read on past it
        cut = random.Random(seed).randrange(size)
        start = path.read_bytes().rfind(b"\n", 0, cut) + 1
        compiled, pure = _both(path, start, None)
        assert compiled == pure
        compiled, pure = _both(path, 0, start or None)
        assert compiled == pure


@pytest.mark.parametrize("name", ["empty", "newlines only", "one line no newline", "nul hole", "cr only",
                                  "invalid utf-8", "long anchor line", "exactly max line"])
def test_adversarial_files_scan_alike_both_ways(tmp_path: Path, name: str) -> None:
    channel = b"gpu-1:2:3 [0] NCCL INFO Channel 00/02 : 3[1a0] -> 4[1b0] [send] via NET/IB/0"
    content = {
        "empty": b"",
        "newlines only": b"\n" * 1000,
        "one line no newline": b"[rank3]: torch.OutOfMemoryError: CUDA out of memory.",
        "nul hole": channel + b"\n" + b"\x00" * 70_000 + channel + b"\n" + b"\x00" * 10 + b"Traceback (most",
        "cr only": (channel + b"\r") * 50 + b"Traceback (most recent call last):\r  File \"x\", line 1\r",
        "invalid utf-8": (b"\xff\xfe NCCL INFO Channel 00/02 : 3[1a0] -> 4[1b0] [send] via \xc3(\n") * 30,
        "long anchor line": b"x" * (3 * MAX_LINE) + channel + b"\n" + channel + b"\n" + b"Traceback" * 5000,
        "exactly max line": (channel + b" " * (MAX_LINE - len(channel))) + b"\n" + channel * 60 + b"\n",
    }[name]
    path = tmp_path / "rank.out"
    path.write_bytes(content)
    compiled, pure = _both(path)
    assert compiled == pure


@pytest.mark.parametrize(("twin", "line"), [
    ("SystemExit: 144 (signal)", "SystemExit: 143 (signal)"),  # inert, with a digit-sensitive signature to ask
    ("worker got signal 12 in worker", "worker got signal 11 in worker"),  # a literal holding a digit
    ("2124-05-08 10:00:00 torch.OutOfMemoryError: CUDA out of memory.",  # the timestamp's `19|20`
     "2024-05-08 10:00:00 torch.OutOfMemoryError: CUDA out of memory."),
])
def test_a_line_whose_digits_decide_is_read_after_its_twin_both_ways(tmp_path: Path, twin: str, line: str) -> None:
    """The shapes the bulk path passes over are those with nothing to ask: a line of a remembered inert shape
    that a digit-sensitive signature matches is read, as the pure path reads it."""
    path = tmp_path / "twin.log"
    path.write_text(f"{twin}\n{twin}\n{line}\n")
    compiled, pure = _both(path)
    assert compiled == pure
    assert 3 in [event.line for event in compiled[0]]


def test_the_bulk_path_reads_fewer_lines_in_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What it is for: told channel lines and inert lines never reach `FileState.handle`."""
    from ddpslurm.analyze.parse.file_state import FileState

    _load_generator().generate(tmp_path, ranks=16, gb=0.004, gpn=8, seed=5, layout="submitit", culprit=11,
                               scenario="oom")
    calls = {"compiled": 0, "pure": 0}
    handle, which = FileState.handle, ["compiled"]

    def counting(state, raw, lineno, shape=None):
        calls[which[0]] += 1
        return handle(state, raw, lineno, shape)

    monkeypatch.setattr(FileState, "handle", counting)
    logs = sorted(p for p in tmp_path.iterdir() if p.suffix == ".out")
    compiled_sigs = load_signatures()
    with pure_path():
        pure_sigs = load_signatures()
    for path in logs:
        which[0] = "compiled"
        compiled = _scan(path, sigs=compiled_sigs)
        with pure_path():
            which[0] = "pure"
            assert _scan(path, sigs=pure_sigs) == compiled
    assert calls["compiled"] < calls["pure"]


def test_a_block_edge_inside_lines_scans_alike_both_ways(tmp_path: Path) -> None:
    """A file past one read block (CHUNK): the block is cut at its last line end, the rest read with the next."""
    rng = random.Random(5)
    path = tmp_path / "big.out"
    with path.open("wb") as out:
        while out.tell() < CHUNK + (1 << 20):
            out.write(_line(rng) + b"\n")
    compiled, pure = _both(path)
    assert compiled == pure
    assert compiled[1]["lines"] > 5_000


def test_the_corpus_logs_scan_alike_both_ways() -> None:
    """A sample of the corpus's logs, each scanned with one signature set per path, warmed on the logs before it
    (its memos learned as a worker's are)."""
    compiled_sigs = load_signatures()
    with pure_path():
        pure_sigs = load_signatures()
    for path in LOGS:
        compiled = _scan(path, sigs=compiled_sigs)
        with pure_path():
            pure = _scan(path, sigs=pure_sigs)
        assert compiled == pure, path


def test_every_case_is_diagnosed_alike_both_ways() -> None:
    from ddpslurm.analyze.api import analyze_paths

    cases = sorted(p for p in CASES.iterdir() if p.is_dir())
    assert len(cases) > 100
    for case in cases:
        compiled = analyze_paths([str(case)]).to_dict()
        with pure_path():
            pure = analyze_paths([str(case)]).to_dict()
        assert compiled == pure, case


@pytest.mark.parametrize(("layout", "scenario", "gpn", "culprit"), [
    ("submitit", "oom", 8, 11), ("submitit", "straggler", 8, 11), ("torchrun", "oom", 8, 9),
    ("torchrun", "straggler", 8, 9), ("logdir", "oom", 8, 9), ("logdir", "straggler", 8, 9),
    ("merged", "straggler", 4, 6), ("submitit", "memkill", 8, 8), ("merged", "memkill", 4, 5),
    ("submitit", "ibfail", 4, 6), ("merged", "ibfail", 2, 15), ("submitit", "segv", 4, 6),
    ("submitit", "inithang", 8, 11), ("merged", "inithang", 4, 0), ("submitit", "latelost", 4, 6),
    ("torchrun", "latelost", 8, 9), ("submitit", "desync", 4, 6), ("torchrun", "desync", 8, 9),
])
def test_generated_jobs_scan_and_are_diagnosed_alike_both_ways(tmp_path: Path, layout: str, scenario: str, gpn: int,
                                                               culprit: int) -> None:
    from ddpslurm.analyze.api import analyze_paths

    _load_generator().generate(tmp_path, ranks=16, gb=0.002, gpn=gpn, seed=5, layout=layout, culprit=culprit,
                          scenario=scenario)
    compiled = analyze_paths([tmp_path], workers=1).to_dict()
    with pure_path():
        pure = analyze_paths([tmp_path], workers=1).to_dict()
    assert compiled == pure
    logs = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".out", ".err", ".log"))
    assert logs
    for path in logs:
        got, want = _both(path)
        assert got == want, path


def test_a_big_job_read_on_the_pure_path_unasked_says_so() -> None:
    """One note for a job of many files or bytes read without the compiled scanner because it was not built; none
    where it is built, where DDPSLURM_PURE_SCAN asked for the pure path, or for a small job."""
    from ddpslurm.analyze.read.bulk import BIG_JOB_BYTES, BIG_JOB_FILES, pure_path_note

    note = pure_path_note(BIG_JOB_FILES, 5 << 20, built=False, asked=False)
    assert note and f"{BIG_JOB_FILES:,} files" in note and "not built" in note and "same" in note
    assert pure_path_note(3, BIG_JOB_BYTES, built=False, asked=False)
    assert pure_path_note(BIG_JOB_FILES - 1, BIG_JOB_BYTES - 1, built=False, asked=False) is None
    assert pure_path_note(BIG_JOB_FILES, BIG_JOB_BYTES, built=True, asked=False) is None
    assert pure_path_note(BIG_JOB_FILES, BIG_JOB_BYTES, built=False, asked=True) is None
    stale = pure_path_note(BIG_JOB_FILES, BIG_JOB_BYTES, built=False, asked=False, stale=True)
    assert stale and "older source" in stale and "not built" not in stale


def test_a_build_of_another_interface_is_not_taken(monkeypatch) -> None:
    """A `_bulk` left from an older source (its functions fewer, or other) is refused for the pure path, and said
    to be stale; the one built from this tree is taken (this fails where the build in the tree is out of date:
    `pip install -e .` again)."""
    from ddpslurm.analyze.read import bulk

    monkeypatch.delenv("DDPSLURM_PURE_SCAN", raising=False)
    module, stale = bulk._load()
    assert module is not None and module.INTERFACE == bulk.INTERFACE and not stale
    monkeypatch.setattr(bulk, "INTERFACE", bulk.INTERFACE + 1)
    assert bulk._load() == (None, True)


def test_analyze_of_a_big_job_notes_the_pure_path_only_where_the_scanner_is_missing(tmp_path, monkeypatch) -> None:
    from ddpslurm.analyze import api
    from ddpslurm.analyze.read import bulk

    for rank in range(bulk.BIG_JOB_FILES):
        (tmp_path / f"rank_{rank}.log").write_text("step 1\n" if rank else "RuntimeError: boom\n")
    monkeypatch.delenv("DDPSLURM_PURE_SCAN", raising=False)
    monkeypatch.setattr(bulk, "BULK", object())  # the note asks only whether it was built
    notes = api.analyze_paths([str(tmp_path)], workers=1).notes
    assert not any("pure-Python path" in n for n in notes)
    monkeypatch.setattr(bulk, "BULK", None)
    notes = api.analyze_paths([str(tmp_path)], workers=1).notes
    assert sum("pure-Python path" in n for n in notes) == 1
