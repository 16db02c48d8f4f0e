"""One file's scan: a `SourceFile` (or a byte range of it) in, its events and its `FileSummary` out.
The file is read in binary blocks of whole lines (`iter_blocks`); only the lines holding one of the signature set's
anchors (the prefilter's candidate lines, and those of the file's head that hold a head anchor) are cut out and read
(`FileState.handle`), except inside a traceback or a torchelastic failure block, where every line is read until the
block ends; repeated NCCL channel lines are skipped on the block itself. A range read in a worker reads a block still
open at its end on past it (a logged exception watched there too, until its watch ends). The summary counts the
lines and bytes, keeps the file's last lines, and tallies how the streams of a labelled log end (`stream_ends`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence

from ddpslurm.analyze.model import Event, FileSummary, SourceFile
from ddpslurm.analyze.parse import repeated_blocks, stream_ends
from ddpslurm.analyze.parse.channel_lines import told_channel_line
from ddpslurm.analyze.parse.file_state import FileState
from ddpslurm.analyze.parse.file_summary import TAIL_LINES, block_tail, last_line_shape, note_tail, settled
from ddpslurm.analyze.parse.repeated_facts import told_once
from ddpslurm.analyze.read.blocks import MAX_LINE, Window, iter_blocks
from ddpslurm.analyze.read.bulk import BULK
from ddpslurm.analyze.read.files import READ_DEADLINE, Opened, Reader, is_binary
from ddpslurm.analyze.read.line_count import newlines
from ddpslurm.analyze.read.prefilter import candidate_starts
from ddpslurm.analyze.rules.signatures import HEAD_ANCHORS, UNTIMED_CHARS, SignatureSet

#: how far past its end a range may read to finish a traceback or block open there (or a logged exception's watch)
OVERRUN_BYTES = 4 << 20
#: the head of a file, where the lines holding a head anchor are read too (`head_starts`)
HEAD_BYTES = 64 << 10
HEAD_ANCHOR_BYTES = tuple(a.encode() for a in HEAD_ANCHORS)
HEADER = repeated_blocks.HEADER


def scan_file(source: SourceFile, sigs: SignatureSet, year: int | None = None,
              on_bytes: Callable[[int], None] | None = None, start: int = 0,
              end: int | None = None, keep_tail: bool = True, opened: Opened | None = None
              ) -> tuple[list[Event], FileSummary]:
    """Scan one log file (or its lines in [start, end)); never raises on content. `opened`: the file opened already
    (`read_ahead`), closed here.

    The summary keeps the shape of the file's last line always, its last lines only with `keep_tail` (a report
    shows a few files' tails when nothing matched: 16k ranks' tails are not held for that).

    A range ends at `end`, except that a traceback or failure block still open there is read to its end, and a
    logged exception watched there until its watch ends (at most OVERRUN_BYTES further); line numbers are relative
    to `start`, `summary.lines` counts the range.
    """
    summary = FileSummary(file=source.display)
    state = FileState(source=source, sigs=sigs, year=year, summary=summary)
    tail: deque[bytes] = deque(maxlen=TAIL_LINES)
    timeouts = sum(sigs.timeouts.values())
    try:
        with Reader(source.path, READ_DEADLINE, opened) as handle:
            tally = None
            if start == 0:
                head = handle.head(8192)
                if is_binary(head):
                    summary.binary = True
                    return [], settled(summary)
                tally = _stream_tally(head, handle.size, end, summary)
            lineno = _scan_range(handle, start, end, state, tail, tally, on_bytes)
    except OSError as error:
        summary.error = error.strerror or str(error)
        summary.match_timeouts = sum(sigs.timeouts.values()) - timeouts
        return state.events, settled(summary)
    summary.match_timeouts = sum(sigs.timeouts.values()) - timeouts
    state.finish()
    summary.lines = lineno
    note_tail(summary, tail, keep_tail)
    if tally is not None:
        summary.streams = tally.ends(last_line_shape)
    return told_once(state.events), settled(summary)


def _stream_tally(head: bytes, size: int, end: int | None, summary: FileSummary) -> stream_ends.StreamTally | None:
    """The tally of how each stream ends, for a labelled log (judged on its `head`) read whole and not too big;
    None otherwise (a labelled log's streams left untallied are noted in its summary)."""
    if not stream_ends.looks_labelled(head):
        return None
    if end is None and size <= stream_ends.MAX_BYTES:
        return stream_ends.StreamTally()
    summary.streams_untallied = True
    return None


def _scan_range(handle: Reader, start: int, end: int | None, state: FileState, tail: deque[bytes],
                tally: stream_ends.StreamTally | None, on_bytes: Callable[[int], None] | None) -> int:
    """Read the lines in [start, end) of an open file (to its end where `end` is None) into `state`, their last
    ones into `tail`, their streams' ends into `tally`, and on past `end` while it is read in line mode (a traceback
    or block open, a logged exception watched: `_read_past_end`); how many lines the range holds."""
    summary = state.summary
    assert summary is not None
    anchors = state.sigs.anchors
    every_line = bool(state.sigs.always)
    reader = handle if end is None else Window(handle, start, end)
    lineno = 0
    first = start == 0
    repeats = repeated_blocks.Repeats() if repeated_blocks.ENABLED else None
    for block, size, truncated in iter_blocks(reader):
        summary.truncated_lines += truncated
        summary.bytes += size
        head = head_starts(block, min(size, HEAD_BYTES)) if first else ()
        if repeats is not None:
            repeats.clear()
        lineno = _scan_block(block, size, lineno, state, anchors, every_line, head, repeats=repeats)
        first = False
        if tally is not None:
            tally.feed(block, size)
        tail.extend(block_tail(block, size))
        if on_bytes:
            on_bytes(size)
    if end is None or end >= handle.size:
        summary.ends_with_newline = handle.ends_with_newline()
    if end is not None and state.line_mode:
        summary.read_past_end = _read_past_end(handle, end, lineno, state, anchors, every_line) - lineno
    return lineno


def _read_past_end(handle: Reader, end: int, lineno: int, state: FileState, anchors: Sequence[bytes],
                   every_line: bool) -> int:
    """Read on from a range's `end` (OVERRUN_BYTES at most) until line mode ends: no traceback or block open, no
    line waited for, and no logged exception watched (whose process may say on the next range's first lines that
    it went on: those lines are this range's to read, in context, as the whole file's reading reads them); the line
    count then, counted on from the range's `lineno`."""
    for block, size, _t in iter_blocks(Window(handle, end, end + OVERRUN_BYTES)):
        lineno = _scan_block(block, size, lineno, state, anchors, every_line, stop_when_idle=True)
        if not state.line_mode:
            break
    return lineno


def head_starts(block: bytes | bytearray, end: int) -> list[int]:
    """Offsets of the lines of `block[:end]` that hold a head anchor (submitit's JobEnvironment line: a handful
    of anchors, each looked for on its own, not an automaton pass of its own over every file's head)."""
    starts: set[int] = set()
    for anchor in HEAD_ANCHOR_BYTES:
        for at in occurrences(block, anchor, end):
            starts.add(block.rfind(b"\n", 0, at) + 1)
    return sorted(starts)


#: a head anchor is looked for through its first byte (memchr: many times faster over a file's head than
#: `bytes.find` of the whole anchor, which showed in a 16k-rank job's small .out files) and checked where that byte
#: is; past this many of those bytes that do not start it, the rest is searched for the whole anchor
FIRST_BYTE_TRIES = 64


def occurrences(block: bytes | bytearray, anchor: bytes, end: int) -> Iterator[int]:
    """Where `anchor` starts in `block[:end]`, in order, as repeated `bytes.find` of it finds them (no overlaps)."""
    first = anchor[:1]
    at, tries = block.find(first, 0, end), 0
    while at >= 0 and tries < FIRST_BYTE_TRIES:
        if block.startswith(anchor, at, end):
            yield at
            at = block.find(first, at + len(anchor), end)
        else:
            tries += 1
            at = block.find(first, at + 1, end)
    at = block.find(anchor, at, end) if at >= 0 else -1
    while at >= 0:
        yield at
        at = block.find(anchor, at + len(anchor), end)


def _scan_block(block: bytes | bytearray, n: int, lineno: int, state: FileState, anchors: Sequence[bytes],
                every_line: bool, extra: Sequence[int] = (), stop_when_idle: bool = False,
                repeats: repeated_blocks.Repeats | None = None) -> int:
    """Process one block of complete lines, `block[:n]`; returns the line count after it. `repeats`: the file's
    repeated periods looked for (a traceback or an error line a retry loop prints again and again:
    `repeated_blocks`), at each traceback header read in line mode and each line alike to the last that made an
    event."""
    cur = 0
    starts = None if every_line else candidate_starts(block, anchors, n)
    if extra and starts is not None:
        starts = sorted(set(starts) | set(extra))
    head_end = max(extra) + 1 if extra else 0
    if BULK is not None and starts is not None and not stop_when_idle:
        return _scan_block_bulk(block, n, lineno, state, starts, repeats, head_end)
    count = len(starts) if starts is not None else 0
    idx = 0
    channels = state.channel_lines
    line_mode = every_line or state.line_mode  # changes only when a line is handled: asked again after each
    while cur < n:
        if not line_mode:
            while idx < count and starts[idx] < cur:
                idx += 1
            if channels:  # told channel lines skipped in a row (their newlines are counted with the next line read)
                while idx < count and told_channel_line(block, starts[idx], n, channels):
                    idx += 1
            if idx >= count:
                lineno += newlines(block, cur, n)
                break
            nxt = starts[idx]
            lineno += newlines(block, cur, nxt)
            cur = nxt
        end = block.find(b"\n", cur, n)
        if end < 0:
            end = n
        line = bytes(block[cur:min(end, cur + MAX_LINE)])
        if repeats is not None and (line_mode or line == repeats.event_line or cur < head_end):
            jump = _repeat_at(repeats, block, n, cur, end, line, lineno, state, head_end)
            if jump is not None:
                cur, lineno = jump
                continue
        lineno += 1
        if end - cur > MAX_LINE and state.summary is not None:
            state.summary.truncated_lines += 1  # read up to MAX_LINE, like a line cut at a block's edge
        made = len(state.events)
        state.handle(line, lineno)
        if repeats is not None and len(state.events) != made:
            repeats.event_line = line
        cur = end + 1
        line_mode = every_line or state.line_mode
        if stop_when_idle and not state.line_mode:
            break
    return lineno


def _scan_block_bulk(block: bytes | bytearray, n: int, lineno: int, state: FileState, starts: list[int],
                     repeats: repeated_blocks.Repeats | None = None, head_end: int = 0) -> int:
    """`_scan_block` (its pure loop the reference) with the candidate lines walked in compiled code: `_bulk.next_line`
    passes over the told channel lines and the lines whose shape is remembered as inert with no digit-sensitive
    signature to ask (what `FileState.handle` would return on at once), counts the line ends and finds the next
    line's bounds and shape; while a traceback or block is open every line is read here, as there. `told` keeps the
    channel key last found told from one call to the next (the file's channel lines come in runs of one key)."""
    next_line = BULK.next_line
    channels = state.channel_lines
    told: list = [None]
    inert = state.sigs.caches.inert_lines
    handle = state.handle
    summary = state.summary
    cur = idx = 0
    while cur < n:
        if state.line_mode:
            end = block.find(b"\n", cur, n)
            if end < 0:
                end = n
            line = bytes(block[cur:min(end, cur + MAX_LINE)])
            if repeats is not None and (line == repeats.event_line or block.find(HEADER, cur, end) >= 0):
                jump = _repeat_at(repeats, block, n, cur, end, line, lineno, state, 0)
                if jump is not None:
                    cur, lineno = jump
                    continue
            lineno += 1
            if end - cur > MAX_LINE and summary is not None:
                summary.truncated_lines += 1
            made = len(state.events)
            handle(line, lineno)
            if repeats is not None and len(state.events) != made:
                repeats.event_line = line
            cur = end + 1
            continue
        idx, start, end, lineno, raw, key = next_line(block, n, cur, starts, idx, lineno, channels, inert,
                                                      UNTIMED_CHARS, MAX_LINE, told)
        if start < 0:
            break
        if repeats is not None and (raw == repeats.event_line or start < head_end):
            jump = _repeat_at(repeats, block, n, start, end, raw, lineno - 1, state, head_end)
            if jump is not None:
                cur, lineno = jump
                continue
        if end - start > MAX_LINE and summary is not None:
            summary.truncated_lines += 1
        made = len(state.events)
        handle(raw, lineno, key)
        if repeats is not None and len(state.events) != made:
            repeats.event_line = raw
        cur = end + 1
    return lineno


def _repeat_at(repeats: repeated_blocks.Repeats, block: bytes | bytearray, n: int, cur: int, end: int, line: bytes,
               lineno: int, state: FileState, head_end: int) -> tuple[int, int] | None:
    """Before the line `block[cur:end]` (`line`, as read) is read: where the reading goes on after the periods
    `repeats` replays from it (offset, line count), or None. A period may start at a traceback header read in line
    mode, or at a line alike to the last one that made an event; lines read out of line mode before `head_end` (the
    head's lines read only there) end every period."""
    alike = line == repeats.event_line and repeats.unmatched < repeated_blocks.UNMATCHED
    if not state.line_mode:
        if cur < head_end:
            repeats.clear()
            return None
        if not alike:
            return None
    elif not alike and block.find(HEADER, cur, end) < 0:
        return None
    return repeats.at_header(block, n, cur, lineno, state)
