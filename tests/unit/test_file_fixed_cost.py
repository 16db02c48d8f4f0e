"""A file's fixed cost in the scan (issue 48): the per-file steps made cheaper read as the plain versions they
replaced, kept here as the references: the told-once passes (parse/repeated_facts.py), the labelled-head test
(parse/stream_ends.py), and the reader that does not ask the kernel again at a file's end (read/files.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.model import Event
from ddpslurm.analyze.parse import repeated_facts, stream_ends
from ddpslurm.analyze.read import files
from ddpslurm.analyze.read.blocks import iter_blocks

# --- the references: the passes as they were written before they were made cheaper ----------------------------


def _says_no_more(later: Event, earlier: Event) -> bool:
    if later.time is not None and later.time != earlier.time:
        return False
    fields = set(earlier.fields)
    if later.get("srun_task") is not None and earlier.get("srun_task") is None and \
            later.get("rank") != str(later.rank):
        return False
    return all(pair in fields for pair in later.fields if pair[0] not in repeated_facts.READING_FIELDS)


def _without_repeats(events: list[Event]) -> list[Event]:
    seen: set[tuple] = set()
    told: dict[tuple, list[Event]] = {}
    out: list[Event] = []
    for e in events:
        if e.role == "victim" and e.rank is not None:
            key = (e.signature, e.rank, e.host, e.pid, e.fields)
            if key in seen:
                continue
            earlier = told.setdefault((e.kind, e.cause, e.rank, e.host, e.pid, e.local_rank), [])
            if any(_says_no_more(e, f) for f in earlier[-repeated_facts.TOLD_REACH:]):
                continue
            seen.add(key)
            earlier.append(e)
        out.append(e)
    return out


def _without_told_facts(events: list[Event]) -> list[Event]:
    failures = sorted(e.line for e in events if e.role is not None)
    told: dict[tuple, list[tuple[int, str, frozenset]]] = {}
    out: list[Event] = []
    for e in events:
        tellers = repeated_facts.TOLD_BY.get(e.kind)
        if tellers is not None and e.time is None:
            earlier = told.setdefault((e.rank, e.host, e.pid, e.local_rank), [])
            fields = frozenset(e.fields)
            read = repeated_facts.TOLD_FIELDS.get(e.kind)
            told_fields = fields if read is None else frozenset(p for p in e.fields if p[0] in read)
            if any(kind in tellers and told_fields <= seen and not _between(failures, line, e.line)
                   for line, kind, seen in earlier[-repeated_facts.TOLD_REACH:]):
                continue
            earlier.append((e.line, e.kind, fields))
        out.append(e)
    return out


_between = repeated_facts._between  # unchanged: the passes' one test of a failure between two lines
#: a labelled line's start, as the test read it line by line (the label itself is stream_ends' own)
_LABEL_AT = re.compile(stream_ends._LABEL + rb"[^\n]")


def _looks_labelled(head: bytes) -> bool:
    start = 0
    for _ in range(stream_ends.HEAD_LINES):
        if _LABEL_AT.match(head, start):
            return True
        start = head.find(b"\n", start) + 1
        if not start:
            return False
    return False


# --- events of few values, so that repeats, equal fields and shared processes are common ---------------------

_FIELDS = st.lists(st.sampled_from([("seq", "9"), ("seq", "8"), ("op", "ALLREDUCE"), ("rank", "4"), ("rank", "5"),
                                    ("srun_task", "4"), ("ifname", "ib0"), ("ip", "10.0.0.5"), ("via", "NET/IB"),
                                    ("nccl_rank", "5"), ("nranks", "8"), ("comm", "0xa")]),
                   max_size=5, unique=True).map(tuple)
_EVENT = st.builds(
    Event, file=st.just("f"), line=st.integers(1, 40), text=st.just("t"),
    kind=st.sampled_from(["watchdog_timeout", "nccl_init", "nccl_rank_map", "interface", "socket", "rank_info"]),
    rank=st.sampled_from([None, 4, 5]), host=st.sampled_from([None, "node-a"]), pid=st.sampled_from([None, 7]),
    local_rank=st.sampled_from([None, 0]), time=st.sampled_from([None, 5.0, 7.0]),
    cause=st.sampled_from([None, "collective_timeout"]), role=st.sampled_from([None, "victim", "culprit"]),
    signature=st.sampled_from(["v1", "v2", "generic"]), fields=_FIELDS)


@settings(max_examples=1500, deadline=None)
@given(events=st.lists(_EVENT, max_size=30))
def test_the_told_once_passes_drop_what_the_plain_passes_drop(events: list[Event]) -> None:
    assert repeated_facts.without_repeats(events) == _without_repeats(events)
    assert repeated_facts.without_told_facts(events) == _without_told_facts(events)
    assert repeated_facts.told_once(events) == (_without_told_facts(_without_repeats(events)) if len(events) > 1
                                                else events)


@settings(max_examples=1500, deadline=None)
@given(lines=st.lists(st.sampled_from([b"", b" ", b"3: x", b"  12: y", b"1234567: z", b"3:", b"3: ", b"x 3: y",
                                       b"2025-03-14 06:00", b"\t3: x", b"03: \xff", b"\r"]), max_size=12),
       final=st.booleans())
def test_a_labelled_head_is_told_as_line_by_line(lines: list[bytes], final: bool) -> None:
    head = b"\n".join(lines) + (b"\n" if final else b"")
    assert stream_ends.looks_labelled(head) == _looks_labelled(head)


@settings(max_examples=300, deadline=None)
@given(head=st.binary(max_size=400))
def test_a_labelled_head_of_random_bytes_is_told_as_line_by_line(head: bytes) -> None:
    assert stream_ends.looks_labelled(head) == _looks_labelled(head)


# --- the reader at a file's end ------------------------------------------------------------------------------


def _blocks(path: Path) -> list[bytes]:
    with files.Reader(str(path), files.READ_DEADLINE) as handle:
        return [bytes(block[:size]) for block, size, _ in iter_blocks(handle, chunk=64)]


def test_a_read_that_came_short_ends_the_file_without_another_read(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A regular file read whole in one read is not read once more to learn that it ended; a file longer than a
    block, or one whose last line has no line end, still reads the same lines."""
    path = tmp_path / "log.out"
    path.write_bytes(b"one\ntwo\n")
    reads: list[int] = []
    readv = os.readv
    monkeypatch.setattr(files.os, "readv", lambda fd, bufs: reads.append(fd) or readv(fd, bufs))
    assert _blocks(path) == [b"one\ntwo\n"]
    assert len(reads) == 1
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(40)) + b"no end")
    assert b"".join(_blocks(path)) == path.read_bytes() + b"\n"


def test_a_file_that_grows_after_a_seek_back_is_read_on(tmp_path: Path) -> None:
    """After a short read the reader answers 0 at that place; moved back (a partial line read again), it asks the
    kernel again, and what the file gained since is read."""
    path = tmp_path / "log.out"
    path.write_bytes(b"first\npartial")
    with files.Reader(str(path), files.READ_DEADLINE) as handle:
        buf = bytearray(1 << 16)
        got = handle.readinto(memoryview(buf))
        assert got == 13 and handle.readinto(memoryview(buf)) == 0
        with open(path, "ab") as more:
            more.write(b" line\n")
        handle.seek(6)
        assert bytes(buf[:handle.readinto(memoryview(buf))]) == b"partial line\n"
