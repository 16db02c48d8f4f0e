"""A file's summary as its scan leaves it: the raw last lines of its blocks in, its tail and its last lines' shapes
out. The scan keeps the last lines of every block it reads (`last_lines`, split from the block's end); at the file's
end the summary gets its tail (decoded, for the few files a report may show) and the shapes of its last lines, digits
deleted (ddpslurm's and submitit's own lines aside), which most ranks' logs end on alike. Empty rank sets, tails and
stream maps are shared ones (`settled`).
"""

from __future__ import annotations

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
    """The summary's last lines' shapes from the file's raw last lines `tail`, and its tail itself with `keep_tail`
    (a report shows a few files' tails when nothing matched: 16k ranks' tails are not held for that)."""
    raw = b"\n".join(t for t in tail if t.strip())
    lines = [clean(ln) for ln in raw.decode("utf-8", errors="replace").split("\n")] if raw else []
    # digits deleted on the cleaned lines' bytes (a UTF-8 sequence holds no ASCII digit byte): str.translate's
    # per-character lookups cost several times more
    shapes = "\n".join(lines).encode().translate(None, _DIGIT_BYTES).decode().split("\n") if lines else []
    summary.tail_shapes = line_shapes(shapes)
    summary.last_line = summary.tail_shapes[-1] if summary.tail_shapes else None
    if keep_tail:
        summary.tail = [ln for ln in lines if ln.strip()]
