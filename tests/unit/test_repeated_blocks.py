"""A block of lines a log repeats (a retry loop printing the same traceback again and again), replayed once its
reading repeats too (`parse/repeated_blocks.py`), against the scan that reads every line (the replay switched off):
the same events, summaries and `--json` answers, on the compiled and the pure path, over tracebacks that repeat
exactly, differ in one line or one digit, change their exception, chain (`During handling ...`), interleave with
other lines and ranks, carry ranks' prefixes, end in CRLF, are cut at the file's end, or read as byte ranges."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import SourceFile, moved_by, new_event
from ddpslurm.analyze.parse import repeated_blocks, scan
from ddpslurm.analyze.read.bulk import BULK
from ddpslurm.analyze.rules.loading import load_signatures
from tests.unit.test_bulk_scan import pure_path

OOM = ["Traceback (most recent call last):", '  File "/home/u/train.py", line 88, in <module>', "    main()",
       '  File "/home/u/train.py", line 61, in main', "    loss = model(batch).sum()",
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
NCCL_ERROR = ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error (run with "
              "NCCL_DEBUG=INFO for details), NCCL version 2.19.3")
#: the lines torch's NCCL error goes on with, without a prefix (`\0`)
NCCL_REST = ["\0ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
             "\0Last error:",
             "\0socketStartConnect: Connect to 10.1.2.3<45678> failed : Software caused connection abort"]
#: pieces a retry loop's log is made of: a traceback (and its variants), and the lines between
PIECES = {
    "oom": OOM,
    "oom, one digit": [*OOM[:3], '  File "/home/u/train.py", line 62, in main', *OOM[4:]],
    "oom, one line": [*OOM[:4], "    loss = model(batch).mean()", OOM[5]],
    "nccl": [*OOM[:5], "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"],
    "chained": [*OOM, "", "During handling of the above exception, another exception occurred:", "", *OOM[:3],
                "ValueError: batch failed"],
    "cause": [*OOM, "", "The above exception was the direct cause of the following exception:", "", *OOM[:3],
              "RuntimeError: step failed"],
    "cut": OOM[:4],
    "unindented": [OOM[0], OOM[1].strip(), OOM[2].strip(), OOM[5]],
    "ignored": ["Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f>", *OOM[:3],
                "OSError: [Errno 9] Bad file descriptor"],
    "nccl, continued": [*OOM[:5], NCCL_ERROR, *NCCL_REST],
    "continued": NCCL_REST[:1],
    "rest": NCCL_REST,
    "retry": ["retrying with a smaller batch"],
    "oom line": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 1.02 GiB free."],
    "watchdog": ["[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
                 "NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600023 milliseconds before "
                 "timing out."],
    "rank5": ["\0[rank5]: step 3 loss 0.5"] * 250 + ["\0[rank5]: RuntimeError: CUDA error: an illegal memory access"],
    "progress": ["step 12 loss 1.234"],
    "other": ["some unrelated output line"],
    "blank": [""],
}
#: line prefixes: none, torch's rank prefix, srun's label, torchrun's, both, a fixed time
PREFIXES = ["", "[rank3]: ", "3: ", "[default3]:", "3: [rank3]: ", "2026-11-02 10:00:01 "]


def _log(runs: list[tuple[str, int, int]], prefix: str, newline: str, other_rank: bool) -> str:
    """`runs` of (piece, how many times, the other rank's lines after each): a retry loop's log, each line with
    `prefix` (those of a piece that start with `\0` without)."""
    out = []
    for piece, times, interleave in runs:
        for _ in range(times):
            for line in PIECES[piece]:
                out.append(f"{line[1:]}{newline}" if line.startswith("\0") else f"{prefix}{line}{newline}")
                if other_rank and interleave and len(out) % interleave == 0:
                    out.append(f"[rank5]: step 3 loss 0.5{newline}")
    return "".join(out)


def _scan(path: Path, start: int = 0, end: int | None = None, rank: int | None = None) -> tuple:
    source = SourceFile(path=str(path), display=path.name, size=path.stat().st_size, rank=rank,
                        task_file=rank is not None)
    events, summary = scan.scan_file(source, load_signatures(), 2026, start=start, end=end)
    return events, dataclasses.asdict(summary)


def _replayed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the periods replayed from now on (one entry a replay: how many periods)."""
    counts: list[int] = []
    move_on = repeated_blocks._move_on

    def counting(state, first, last, times: int) -> None:
        counts.append(times)
        move_on(state, first, last, times)

    monkeypatch.setattr(repeated_blocks, "_move_on", counting)
    return counts


def _read_in_full(read):
    """`read()` with the replay switched off."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repeated_blocks, "ENABLED", False)
        return read()


def _all_ways(read) -> None:
    """`read()` gives the same with and without the replay, on the compiled path and on the pure one."""
    replayed = read()
    assert replayed == _read_in_full(read)
    if BULK is not None:
        with pure_path():
            assert read() == replayed


_RUNS = st.lists(st.tuples(st.sampled_from(sorted(PIECES)), st.integers(1, 30), st.integers(0, 7)),
                 min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=_RUNS, prefix=st.sampled_from(PREFIXES), crlf=st.booleans(), other_rank=st.booleans(),
       rank=st.sampled_from([None, 3]), cut=st.floats(0, 1))
def test_a_repeated_block_reads_as_if_read_in_full(tmp_path: Path, runs, prefix: str, crlf: bool,
                                                   other_rank: bool, rank: int | None, cut: float) -> None:
    path = tmp_path / "slurm-7.out"
    path.write_text(_log(runs, prefix, "\r\n" if crlf else "\n", other_rank))
    _all_ways(lambda: _scan(path, rank=rank))
    data = path.read_bytes()
    if len(data) > 10:  # byte ranges, as a worker reads a big file's: a traceback open at the end is read on past it
        start = data.rfind(b"\n", 0, int(cut * len(data))) + 1
        _all_ways(lambda: _scan(path, start, None, rank))
        _all_ways(lambda: _scan(path, 0, start or None, rank))


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("piece", ["oom", "chained", "cause", "unindented", "nccl"])
@pytest.mark.parametrize("crlf", [False, True])
def test_a_traceback_printed_again_and_again_is_replayed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         prefix: str, piece: str, crlf: bool) -> None:
    """What the replay is for: of 150 tracebacks alike, all but the first few are replayed, and the file reads as
    read in full (with a different one, one digit off, after them, 150 more, and the end cut mid-traceback; an
    unprefixed log's watch of that one's exception ages on through the next ones: those are read in full)."""
    path = tmp_path / "slurm-7.out"
    path.write_text(_log([(piece, 150, 0), ("oom, one digit", 1, 0), (piece, 150, 0), ("cut", 1, 0)], prefix,
                         "\r\n" if crlf else "\n", False))
    counts = _replayed(monkeypatch)
    _all_ways(lambda: _scan(path))
    assert sum(counts) >= 140 * (2 if BULK is not None else 1)


@pytest.mark.parametrize("after", ["continued", "rest", "rank5", "retry", "progress", "cut", "oom", "nccl, continued",
                                   "ignored", "blank"])
@pytest.mark.parametrize("piece", ["oom", "chained", "cause", "unindented", "nccl", "nccl, continued"])
@pytest.mark.parametrize("prefix", ["", "[rank3]: ", "3: "])
def test_what_follows_a_replayed_run_reads_as_after_a_run_read_in_full(tmp_path: Path, prefix: str, piece: str,
                                                                       after: str) -> None:
    """The state a replay leaves (its clocks moved on) is read on from as the full reading's: a line that continues
    the one above, another rank's lines past the idle limit, a retry notice, a traceback cut, another one."""
    path = tmp_path / "slurm-7.out"
    path.write_text(_log([(piece, 40, 0), (after, 1, 0), (piece, 20, 0), (after, 1, 0)], prefix, "\n", False))
    _all_ways(lambda: _scan(path))


@pytest.mark.parametrize("gap", [3, 45, 250, 2100])
@pytest.mark.parametrize("last", ["retrying with a smaller batch", "torch.OutOfMemoryError: CUDA out of memory.",
                                  "Traceback (most recent call last):"])
def test_two_ranks_tracebacks_in_turn_then_one_rank_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         gap: int, last: str) -> None:
    """A merged log whose two ranks print their tracebacks in turn (a period of both), then one rank's lines alone
    for `gap` lines (past a watch's reach, the idle limit, the file's watch), then the other's line: the watches,
    idle limits and exceptions the replay moved on are read on as the full reading's."""
    tracebacks = "".join(f"[rank{r}]: {line}\n" for r in (3, 5) for line in OOM)
    path = tmp_path / "slurm-7.out"
    path.write_text(tracebacks * 300 + "[rank5]: step 3 loss 0.5\n" * gap + f"[rank3]: {last}\n" + tracebacks * 12)
    counts = _replayed(monkeypatch)
    _all_ways(lambda: _scan(path))
    assert counts


def test_a_retry_notice_after_each_traceback_is_read_as_in_full(tmp_path: Path, monkeypatch) -> None:
    """An exception the process went on after is rewritten as a fact (`went_on`): a period that rewrites its own
    exception is replayed with its copies rewritten, one whose notice rewrites the period before's is read in full."""
    path = tmp_path / "slurm-7.out"
    path.write_text(_log([("oom", 100, 0), ("retry", 1, 0)] * 3, "[rank3]: ", "\n", False))
    _all_ways(lambda: _scan(path))
    path.write_text(_log([("oom", 1, 0), ("retry", 1, 0)] * 100, "[rank3]: ", "\n", False))
    counts = _replayed(monkeypatch)
    _all_ways(lambda: _scan(path))
    assert sum(counts) >= 90 * (2 if BULK is not None else 1)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("lines", [["oom line"], ["oom line", "retry"], ["oom line", "other"], ["watchdog"],
                                   ["oom line", "oom line", "retry"], ["retry", "oom line"]])
def test_an_error_line_printed_again_and_again_is_replayed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           prefix: str, lines: list[str]) -> None:
    """A period may start at a line alike to the last one that made an event, whatever mode it is read in: one
    error line 2,000 times (alone, with a retry notice, with other lines), then another, then the first again."""
    path = tmp_path / "slurm-7.out"
    runs = [(piece, 1, 0) for piece in lines] * 2000 + [("nccl, continued", 1, 0)] + [(lines[0], 300, 0)]
    path.write_text(_log(runs, prefix, "\n", False))
    counts = _replayed(monkeypatch)
    _all_ways(lambda: _scan(path))
    assert sum(counts) >= 1900 * (2 if BULK is not None else 1)


@pytest.mark.parametrize("runs", [
    [("oom", 400, 0)],
    [("chained", 200, 0), ("cut", 1, 0)],
    [("oom", 150, 0), ("nccl", 150, 0), ("progress", 1, 0)],
    [("oom", 100, 3), ("other", 2, 0), ("oom", 100, 5)],
])
def test_a_repeated_block_is_diagnosed_as_if_read_in_full(tmp_path: Path, runs) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "slurm-7.out").write_text(_log(runs, "[rank3]: ", "\n", True))
    (folder / "slurm-7_1.out").write_text(_log(runs, "", "\r\n", False))
    _all_ways(lambda: analyze_paths([folder], workers=1).to_dict())


def test_an_event_moved_on_says_the_same_further_down() -> None:
    e = new_event("f", 12, "exception", "boom", 3, fields=(("traceback_line", "7"), ("where", "x.py:3"),
                                                           ("went_on_line", "0012")))
    later = moved_by(e, 30)
    assert (later.line, later.fields) == (42, (("traceback_line", "37"), ("where", "x.py:3"),
                                               ("went_on_line", "0012")))
    assert repeated_blocks.normalised_event(later, 40) == repeated_blocks.normalised_event(e, 10)
    assert repeated_blocks.normalised_event(later, 41) != repeated_blocks.normalised_event(e, 10)


def test_a_state_a_field_of_which_is_not_known_is_frozen_as_it_is() -> None:
    """A value the snapshot does not know is compared as it is, and a copy of it: a change after it is taken down
    makes the snapshots differ (fail-safe)."""
    seen = {1, 2}
    frozen = repeated_blocks.freeze({"a": [seen, (3, "x")]})
    seen.add(4)
    assert frozen != repeated_blocks.freeze({"a": [seen, (3, "x")]})
    with pytest.raises(repeated_blocks._Refused):
        repeated_blocks.freeze(object())


#: the reading state's fields, as reviewed for the replay: those `_snapshot` counts from a clock or leaves out, and
#: those it compares as they are (none of which the reading compares with a clock: `init_starts` holds an event's
#: index that the reading only looks the event up by). A field added to one of these classes changes this list: it
#: must be reviewed first (a value the reading compares with a clock and that a period leaves alike would be
#: replayed wrong), then `_snapshot` taught it where it counts on one.
REVIEWED_FIELDS = {
    "FileState": {"source", "sigs", "year", "summary", "streams", "label_rank", "prefix_rank", "tag_hosts",
                  "carried_hosts", "handled", "stream_lines", "stream_now", "previous", "events", "rank_maps",
                  "init_starts", "generic", "watching", "rewritten_low", "tracebacks", "elastic", "pending", "waiting",
                  "channel_lines"},
    "TracebackAssembler": {"max_idle", "open", "seen", "fed", "opened", "ignored_at"},
    "_Open": {"start_line", "last_fed", "seq", "where", "exc", "exc_line", "chained", "awaiting_chain", "wrapper",
              "wrapper_gap", "process", "earlier", "frame", "outermost", "source_due", "unraisable", "head"},
    "_Watch": {"logged", "handled_at", "own_at", "reach"},
}


def test_every_field_of_the_reading_state_was_reviewed_for_the_replay() -> None:
    from ddpslurm.analyze.parse import line_events, tracebacks
    from ddpslurm.analyze.parse.file_state import FileState

    for cls in (FileState, tracebacks.TracebackAssembler, tracebacks._Open, line_events._Watch):
        assert {f.name for f in dataclasses.fields(cls)} == REVIEWED_FIELDS[cls.__name__], cls.__name__
