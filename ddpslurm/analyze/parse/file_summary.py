"""A file's summary as its scan leaves it: the raw last lines of its blocks in, its tail and its last lines' shapes
out. The scan keeps the last lines of every block it reads (`last_lines`, split from the block's end); at the file's
end the summary gets its tail (its last few lines decoded, for the few files a report may show), the shape of its last
line, and the marks of its last TAIL_LINES lines' shapes (digits deleted, ddpslurm's and submitit's own lines aside):
8 bytes a line, compared across ranks to tell which line most ranks' logs reach and which rank's log stops before it
(timeline.stopped_early). Empty rank sets, tails and stream maps are shared ones (`settled`).
"""

from __future__ import annotations

import re
import zlib
from array import array
from collections.abc import Sequence

from ddpslurm.analyze.model import FileSummary
from ddpslurm.analyze.parse.attribution import clean
from ddpslurm.analyze.parse.shared_values import canonical
from ddpslurm.analyze.read.blocks import MAX_LINE
from ddpslurm.analyze.read.bulk import BULK

#: the last lines of a file whose shapes its summary marks: enough that a few dozen lines of a rank's own (warnings,
#: retries, progress, a logged traceback) printed after the line most ranks end on still leave that line in view
TAIL_LINES = 64
#: the last lines of a file a report may show
SHOWN_LINES = 6
#: the bytes of each of a file's last lines its tail keeps, and the bytes at a block's end its last lines are
#: looked for in
TAIL_CHARS = 400
TAIL_WINDOW = 4 * MAX_LINE

#: what an empty summary holds: shared, not one set and one list per file (32k files: 9 MB of empty containers)
NO_RANKS: frozenset[int] = frozenset()
NO_STREAMS: dict[int, tuple[int, str | None]] = {}


def settled(summary: FileSummary) -> FileSummary:
    """The summary as a scan returns it: its empty rank set and tail are the shared empty ones."""
    if not summary.ranks_seen:
        summary.ranks_seen = NO_RANKS
    if not summary.tail:
        summary.tail = ()
    if not summary.streams:
        summary.streams = NO_STREAMS
    return summary


#: the heads of ddpslurm's and submitit's own lines: a log's last lines are read before them
OWN_LINES = ("ddpslurm:", "submitit ")


def line_shapes(lines: Sequence[str]) -> tuple[str, ...]:
    """The shapes of a file's last lines (decoded, digits deleted: lines that differ only in their numbers have one
    shape), oldest first, blank ones and ddpslurm's and submitit's own aside where others exist. Which line most
    ranks' logs hold near their end is asked of them (timeline.stopped_early)."""
    kept = [ln for ln in lines if ln.strip()]
    kept = [ln for ln in kept if not ln.startswith(OWN_LINES)] or kept
    return tuple([canonical(ln) for ln in kept])


def last_line_shape(lines: Sequence[str]) -> str | None:
    """The shape (`line_shapes`) of the last of `lines` that is not ddpslurm's or submitit's own, where one is."""
    shapes = line_shapes([ln.translate(_NO_DIGITS) for ln in lines])
    return shapes[-1] if shapes else None


_NO_DIGITS = str.maketrans("", "", "0123456789")
_DIGIT_BYTES = b"0123456789"


def last_lines(block: bytes | bytearray, count: int, end: int | None = None, window: int = TAIL_WINDOW
               ) -> list[bytes]:
    """The last `count` lines of a block of complete lines `block[:end]` (of its last `window` bytes), split
    from the end: a 4 MB block is not cut into all its lines for six of them."""
    end = len(block) if end is None else end
    floor = max(0, end - window)
    start = end
    for _ in range(count + 2):  # only the bytes after the last count + 2 line ends are copied (not 64 KB a file)
        start = block.rfind(b"\n", floor, start)
        if start < 0:
            start = floor - 1
            break
    pieces = bytes(block[start + 1:end]).rsplit(b"\n", count + 1)
    if pieces[-1] == b"":
        pieces.pop()  # after the block's last newline
    return pieces[-count:] if count else []


def block_tail(block: bytes | bytearray, end: int) -> list[bytes]:
    """The last TAIL_LINES lines of the block `block[:end]` (`last_lines`), each cut at TAIL_CHARS bytes, as a
    file's tail keeps them: in compiled code where it is built."""
    if BULK is not None:
        return BULK.last_lines(block, TAIL_LINES, end, TAIL_CHARS, TAIL_WINDOW)
    return [piece[:TAIL_CHARS] for piece in last_lines(block, TAIL_LINES, end)]


def shape_mark(shape: bytes) -> bytes:
    """A line shape's 4-byte mark (its CRC-32)."""
    return array("I", [zlib.crc32(shape)]).tobytes()


def marks_of(marks: bytes) -> array[int]:
    """The marks `line_marks` (or `shape_mark`) packed, one int each, oldest first: an array of 32-bit marks (as
    int objects, 64 a file are 2.6 KB; a 65k-rank job's diagnosis holds one set a rank)."""
    return array("I", marks)


def line_marks(shapes: Sequence[bytes]) -> bytes:
    """The marks (`shape_mark`) of lines' shapes, oldest first, blank ones and ddpslurm's and submitit's own aside
    where others exist (as `line_shapes` keeps decoded lines)."""
    kept = list(filter(bytes.strip, shapes))
    probe = b"\n".join(kept)
    if any(own in probe for own in _OWN_BYTES):  # one search of the bytes, not one test a line
        kept = [ln for ln in kept if not ln.startswith(_OWN_BYTES)] or kept
    return array("I", map(zlib.crc32, kept)).tobytes()


def byte_shapes(lines: Sequence[bytes]) -> list[bytes]:
    """The shapes of raw lines, one each, as `line_shapes` gives them on decoded lines: cleaned as
    `attribution.clean` cleans text (what follows a line's last `\\r`, escape sequences and control bytes out),
    digits deleted; in one pass over the bytes for lines without a carriage return or an escape."""
    joined = b"\n".join(lines)
    if b"\r" in joined or b"\x1b" in joined:
        joined = b"\n".join([_cut_bytes(ln) if b"\r" in ln or b"\x1b" in ln else ln for ln in lines])
    return joined.translate(None, _DELETED).split(b"\n")


#: what a shape leaves out: digits and the control bytes `attribution.clean` deletes (a tab is kept)
_DELETED = b"0123456789" + bytes([*range(0, 9), *range(11, 32), 127])
_ANSI_BYTES = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_OWN_BYTES = tuple(own.encode() for own in OWN_LINES)


def _cut_bytes(line: bytes) -> bytes:
    """What follows a raw line's last `\\r` that is not blank, its escape sequences out (`attribution.clean`)."""
    if b"\r" in line:
        parts = [p for p in line.split(b"\r") if p.strip()]
        line = parts[-1] if parts else b""
    return _ANSI_BYTES.sub(b"", line) if b"\x1b" in line else line


def note_tail(summary: FileSummary, tail: Sequence[bytes], keep_tail: bool) -> None:
    """The summary's marks of its last lines' shapes (`line_marks`) and the shape of its last line (of its last
    SHOWN_LINES lines) from the file's raw last lines `tail`, and its tail itself (those lines, decoded) with
    `keep_tail` (a report shows a few files' tails when nothing matched: 16k ranks' tails are not held for that).
    The marks and the last shape in compiled code where it is built (lines with an escape byte: here)."""
    lines = list(tail)
    done = BULK.tail_marks(lines, SHOWN_LINES, _OWN_BYTES) if BULK is not None else None
    if done is None:
        shapes = byte_shapes(lines)
        marks = line_marks(shapes)
        last = last_shown(shapes)
    else:
        marks, last = done
    summary.end_marks = canonical(marks)  # ranks' logs end alike: a batch's pickle carries each ending once
    summary.last_line = canonical(last.decode("utf-8", errors="replace")) if last is not None else None
    if keep_tail:
        decoded = [clean(t.decode("utf-8", errors="replace")) for t in lines[-SHOWN_LINES:] if t.strip()]
        summary.tail = [ln for ln in decoded if ln.strip()]


def last_shown(shapes: Sequence[bytes]) -> bytes | None:
    """The last non-blank of the last SHOWN_LINES `shapes`, not ddpslurm's or submitit's own where one is."""
    shown = [ln for ln in shapes[-SHOWN_LINES:] if ln.strip()]
    last = [ln for ln in shown if not ln.startswith(_OWN_BYTES)] or shown
    return last[-1] if last else None
