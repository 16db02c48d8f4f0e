"""The compiled replay of a remembered line shape (read/_bulk_replay.h) against the Python replay, its reference
(parse/line_recipes.py `RememberedShapes.replay`): the same lines, through the same file's reading state, make the
same events and leave the same state (streams, line counts, hosts told, rank maps, the summary's ranks), whatever
the lines' digits, prefixes and order and whatever the file's own rank, host and srun task. A line the compiled
replay leaves to Python (it may continue the line above it) changes nothing before it is read there; a time not
where the recipe planned it is read by the state's own `_time`."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.model import FileSummary, SourceFile
from ddpslurm.analyze.parse import line_recipes
from ddpslurm.analyze.parse.file_state import FileState
from ddpslurm.analyze.read import bulk
from ddpslurm.analyze.rules.loading import load_signatures

pytestmark = pytest.mark.skipif(bulk.BULK is None, reason="the compiled bulk path is not built in this checkout")

#: message bodies of the libraries' families a big job repeats rank after rank ({d}: a run of digits, its width
#: drawn once per example so that lines share shapes; {h}: a hex id of a drawn width, its letters drawn per line,
#: now and then upper-case; {g}: a glog head; {n}: NCCL's `host:pid:tid [dev]` head)
BODIES = (
    "{g}ProcessGroupNCCL.cpp:{d}] [Rank {d}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={d}, "
    "OpType=ALLREDUCE, NumelIn={d}, NumelOut={d}, Timeout(ms)=600000) ran for {d} milliseconds before timing out.",
    "{g}ProcessGroupNCCL.cpp:{d}] [PG {d} (default_pg) Rank {d}] Exception (either an error or timeout) detected by "
    "watchdog at work: {d}, last enqueued NCCL work: {d}, last completed NCCL work: {d}.",
    "{g}ProcessGroupNCCL.cpp:{d}] [Rank {d}] Some NCCL operations have failed or timed out. Due to the asynchronous "
    "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
    "{n}NCCL INFO Bootstrap : Using ib0:10.{d}.{d}.{d}<0>",
    "{n}NCCL INFO NET/IB : Using [0]mlx5_{d}:1/IB [1]mlx5_{d}:1/IB ; OOB ib0:10.{d}.{d}.{d}<0>",
    "{n}NCCL INFO NET/Socket : Using [0]eth0:127.{d}.{d}.{d}<0> [1]docker0:172.{d}.0.1<0>",
    "{n}NCCL INFO Trees [0] {d}/{d}/-1->{d}->{d} [1] {d}/{d}/-1->{d}->{d}",
    "{n}NCCL INFO Channel {d}/0 : {d}[{d}] -> {d}[{d}] [send] via NET/IB/{d}/GDRDMA",
    "{n}NCCL INFO Init timings: rank {d} nranks {d} total 1.{d} (kernels 0.{d}, bootstrap 0.{d})",
    "{n}NCCL INFO comm 0x{h} rank {d} nRanks {d} nNodes {d} localRanks {d} localRank {d} MNNVL 0",
    "{n}NCCL INFO ncclCommInitRank comm 0x{h} rank {d} nranks {d} cudaDev {d} nvmlDev {d} busId {d}000 commId 0x{h} "
    "- Init START",
    "{n}NCCL WARN NET/IB : Got completion from peer 10.{d}.{d}.{d}<{d}> with status=12 opcode=0 len=0 vendor err {d}",
    "srun: error: gpu-{d}: task {d}: Exited with exit code {d}",
    "slurmstepd: error: *** STEP {d}.0 ON gpu-{d} CANCELLED AT 2025-03-14T22:55:01 DUE TO TIME LIMIT ***",
    "{g}socket.cpp:{d}] [c10d] The client socket has failed to connect to [gpu-{d}]:{d} (errno: 111 - Connection "
    "refused).",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
    "Last error:",
)
#: line prefixes: none, torch's rank tag, srun's label, torchrun's worker tag, a host tag, a collector's time
PREFIXES = ("", "[rank{d}]:", "{d}: ", "[default{d}]:", "gpu-{d}: ", "2025-03-14T22:55:{d}.{d}Z ", "{d}: [rank{d}]:",
            "[trainer{d}]:[rank{d}]:")
GLOG = "[{c}{d} {d}:{d}:{d}.{d} "
NCCL = "gpu-{d}:{d}:{d} [{d}] "


def _fill(template: str, widths: list[int], rng: random.Random, glog: str) -> str:
    out = template.replace("{g}", glog).replace("{n}", NCCL)
    while "{h}" in out:
        hexes = "0123456789abcdef" if rng.random() < 0.9 else "0123456789abcdefABCDEF"
        out = out.replace("{h}", "".join(rng.choice(hexes) for _ in range(widths[-1] + 6)), 1)
    pieces = out.split("{d}")
    digits = [str(rng.randrange(10 ** w)).zfill(w) if w < 4 else str(rng.randrange(10 ** (w - 1), 10 ** w))
              for w in widths[:len(pieces) - 1]]
    return "".join(p + (digits[i] if i < len(digits) else "") for i, p in enumerate(pieces))


@st.composite
def line_runs(draw) -> tuple[list[str], dict]:
    """Lines of a few shapes, each shape several times with other digits, in a drawn order; and a file's source."""
    rng = random.Random(draw(st.integers(0, 2 ** 32)))
    shapes = []
    for _ in range(draw(st.integers(1, 5))):
        body = draw(st.sampled_from(BODIES))
        prefix = draw(st.sampled_from(PREFIXES))
        widths = [draw(st.sampled_from((1, 2, 3, 4, 5))) for _ in range(24)]
        letter = draw(st.sampled_from("EWIF"))
        month = draw(st.sampled_from(("03", "3", "12", "10", "13", "00", "1")))  # a month glog's regex refuses too
        glog = GLOG.replace("{c}", letter).replace("{d}", month + "{d}", 1)
        shapes.append((prefix + body, widths, glog))
    order = draw(st.lists(st.integers(0, len(shapes) - 1), min_size=2, max_size=40))
    lines = [_fill(*shapes[i][:2], rng, shapes[i][2]) for i in order]
    source = {"rank": draw(st.sampled_from((None, 0, 3, 12))), "host": draw(st.sampled_from((None, "gpu-0001"))),
              "local_rank": draw(st.sampled_from((None, 1))), "task_file": draw(st.booleans()),
              "kind": draw(st.sampled_from(("log", "log", "job_record")))}
    return lines, source


def _read(lines: list[str], source: dict, year: int | None, compiled: bool) -> tuple:
    """Every line through one file's reading state, the recipes learned afresh; the events and the state."""
    sigs = load_signatures()
    sigs.caches.line_recipes.clear()
    sigs.caches.inert_lines.clear()
    src = SourceFile(path="/job/4817203_3_log.err", display="4817203_3_log.err", **source)
    state = FileState(source=src, sigs=sigs, year=year, summary=FileSummary(file=src.display))
    with pytest.MonkeyPatch.context() as patch:
        if not compiled:
            patch.setattr(line_recipes, "BULK", None)
        for lineno, line in enumerate(lines, 1):
            state.handle(line.encode(), lineno)
    kept = ("streams", "stream_lines", "handled", "stream_now", "previous", "label_rank", "prefix_rank", "tag_hosts",
            "carried_hosts", "rank_maps", "init_starts", "watching")
    return state.events, dataclasses.asdict(state.summary), {name: getattr(state, name) for name in kept}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line_runs(), st.sampled_from((2025, 2024, None)))
def test_the_compiled_replay_reads_every_line_as_the_python_replay_does(run: tuple[list[str], dict],
                                                                         year: int | None) -> None:
    lines, source = run
    compiled = _read(lines, source, year, compiled=True)
    python = _read(lines, source, year, compiled=False)
    assert compiled[0] == python[0]
    assert compiled[1:] == python[1:]


class _Counted:
    """`_bulk.replay` with its answers counted: True (read in C) and None (left to Python)."""

    def __init__(self) -> None:
        self.read = self.left = 0

    def replay(self, *args):
        done = bulk.BULK.replay(*args)
        self.read += done is True
        self.left += done is None
        return done


def test_lines_alike_but_for_digits_are_replayed_in_compiled_code_and_match_python(monkeypatch) -> None:
    """The watchdog lines of many ranks: all but the first read in C (the first is read in full and remembered),
    with the same events as the Python replay, times included."""
    rng = random.Random(5)
    lines = [f"[rank{r}]:[E0314 22:{rng.randrange(10, 60)}:{rng.randrange(10, 60)}.{rng.randrange(10 ** 5, 10 ** 6)} "
             f"ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum="
             f"{rng.randrange(10 ** 4, 10 ** 5)}, OpType=ALLREDUCE, NumelIn=25165824, NumelOut=25165824, Timeout(ms)="
             "600000) ran for 600005 milliseconds before timing out." for r in range(1000, 1050)]
    counted = _Counted()
    monkeypatch.setattr(line_recipes, "BULK", counted)
    events, _summary, _state = _read(lines, {"rank": None, "host": None}, 2025, compiled=True)
    assert counted.read == len(lines) - 1 and counted.left == 0
    monkeypatch.undo()
    assert events == _read(lines, {"rank": None, "host": None}, 2025, compiled=False)[0]
    assert all(e.time is not None and e.time_family == "glog" for e in events)


def test_a_line_that_may_continue_the_one_above_is_left_to_python_unchanged(monkeypatch) -> None:
    """An unprefixed line right after a prefixed one may continue torch's NCCL message (`_take_prefix`): the
    compiled replay leaves it to Python without touching the state, and Python reads it as it always does."""
    first = "[rank3]:" + "[E0314 22:55:01.005 ProcessGroupNCCL.cpp:607] [Rank 3] Some NCCL operations have failed."
    head = "gpu-0001:100035:100096 [5] NCCL INFO Trees [0] 11/12/-1->5->2 [1] 11/12/-1->5->2"
    lines = [head, head.replace("11/12", "13/14"), first, head.replace("11/12", "21/22")]
    counted = _Counted()
    monkeypatch.setattr(line_recipes, "BULK", counted)
    got = _read(lines, {"rank": 3}, 2025, compiled=True)
    assert counted.left >= 1
    monkeypatch.undo()
    assert got == _read(lines, {"rank": 3}, 2025, compiled=False)


@pytest.mark.parametrize("month", ["03", "3", "10", "12", "13", "1", "00"])
def test_glog_times_read_in_c_are_the_python_readers(month: str) -> None:
    """The glog time a recipe plans, read in C at the planned place, is `_read_glog`'s (month alternatives tried in
    the regex's order; a month it refuses there is read by Python, wherever it finds one)."""
    rng = random.Random(int(month) + 7)
    lines = [_fill(PREFIXES[1] + BODIES[0], [3] * 24, rng, f"[E{month}{{d}} {{d}}:{{d}}:{{d}}.{{d}} ")
             for _ in range(20)]
    compiled = _read(lines, {"rank": None}, 2025, compiled=True)[0]
    python = _read(lines, {"rank": None}, 2025, compiled=False)[0]
    assert [(e.time, e.time_family) for e in compiled] == [(e.time, e.time_family) for e in python]
    assert compiled == python


def test_bad_arguments_raise_and_do_not_crash() -> None:
    replay = bulk.BULK.replay
    with pytest.raises(TypeError):
        replay(None, (), "x", 1)
    with pytest.raises(TypeError):
        replay(None, (None,) * 9, b"x", 1)
    with pytest.raises(TypeError):
        replay(None, (None,) * 9)
    assert replay(None, (None,) * 9, "caf\u00e9", 1) is None  # not ASCII: Python's


def test_numbers_longer_than_a_machine_word_are_read_as_python_reads_them(monkeypatch) -> None:
    """A pid of NCCL's head has no bound on its digits: past 18 the compiled replay reads it as Python's `int`."""
    rng = random.Random(9)
    lines = [f"gpu-0001:{rng.randrange(10 ** 24, 10 ** 25)}:100096 [5] NCCL INFO Bootstrap : Using "
             f"ib0:10.100.0.{rng.randrange(10, 99)}<0>" for _ in range(6)]
    counted = _Counted()
    monkeypatch.setattr(line_recipes, "BULK", counted)
    got = _read(lines, {"rank": 3}, 2025, compiled=True)
    assert counted.read == len(lines) - 1
    monkeypatch.undo()
    assert got == _read(lines, {"rank": 3}, 2025, compiled=False)
    assert all(e.pid is not None and e.pid >= 10 ** 24 for e in got[0])
