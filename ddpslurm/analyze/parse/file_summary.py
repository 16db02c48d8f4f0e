"""A file's summary as its scan leaves it: the raw last lines of its blocks in, its tail and last line's shape out.
The scan keeps the last lines of every block it reads (`last_lines`, split from the block's end); at the file's end
the summary gets its tail (decoded, for the few files a report may show) and the shape of its last line, numbers
masked (ddpslurm's and submitit's own lines aside), which most ranks' logs end on alike. Empty rank sets, tails and
stream maps are shared ones (`settled`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ddpslurm.analyze.model import FileSummary
from ddpslurm.analyze.parse.attribution import clean
from ddpslurm.analyze.parse.shared_values import canonical
from ddpslurm.analyze.read.blocks import MAX_LINE

#: the last lines of a file its summary keeps
TAIL_LINES = 6

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


def decoded_from_end(tail: Sequence[bytes]) -> list[str]:
    """The last lines `last_line_shape` reads of `tail` (raw, blank ones aside), decoded from the end only as far as
    it reads them: up to the last line that is not ddpslurm's or submitit's own, and the very last line. Most of a
    16k-rank job's files keep no tail: their six last lines are not all decoded for one shape."""
    out: list[str] = []
    for raw in reversed(tail):
        if not raw.strip():
            continue
        line = clean(raw.decode("utf-8", errors="replace"))
        out.append(line)
        if not line.startswith(OWN_LINES):
            break
    out.reverse()
    return out


#: the heads of ddpslurm's and submitit's own lines: a log's last line is read before them (`last_line_shape`)
OWN_LINES = ("ddpslurm:", "submitit ")


def last_line_shape(tail: Sequence[str]) -> str | None:
    """The file's last line with its numbers masked (ddpslurm's and submitit's own lines aside when others exist):
    what most ranks' logs end on is compared with it."""
    lines = [ln for ln in tail if not ln.startswith(OWN_LINES)] or tail
    return canonical(_DIGITS.sub("N", lines[-1])) if lines else None


_DIGITS = re.compile(r"\d+")


def last_lines(block: bytes | bytearray, count: int, end: int | None = None) -> list[bytes]:
    """The last `count` lines of a block of complete lines `block[:end]` (of its last 4 * MAX_LINE bytes), split
    from the end: a 4 MB block is not cut into all its lines for six of them."""
    end = len(block) if end is None else end
    floor = max(0, end - 4 * MAX_LINE)
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


def note_tail(summary: FileSummary, tail: Sequence[bytes], keep_tail: bool) -> None:
    """The summary's last line's shape from the file's raw last lines `tail`, and its tail itself with `keep_tail`
    (a report shows a few files' tails when nothing matched: 16k ranks' tails are not held for that)."""
    if keep_tail:
        summary.tail = [clean(t.decode("utf-8", errors="replace")) for t in tail if t.strip()]
        summary.last_line = last_line_shape(summary.tail)
    else:
        summary.last_line = last_line_shape(decoded_from_end(tail))
