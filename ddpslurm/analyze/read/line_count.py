"""Counting the line ends of a block: the scan counts every byte's newlines, for line numbers and each file's
line count.

`bytes.count` of one byte is a byte-at-a-time loop. `bytes.replace` of one byte by nothing finds them with memchr
and copies what is left: counted as the length it lost, a span in pieces of REPLACE_PIECE (the piece's copies stay
in the core's cache) costs less, the copies included, and wins from about 4 KB on. numpy compares a block in vector
instructions, cheaper still, but costs a fixed time and 10 MB to import in each process: it repays that only past
about 1.3 GB of long spans in one process (the figures: benchmarks/README.md).

Who imports numpy: a pool's parent knows every file's size before it forks, so it decides for its workers
(`worth_importing`): each imports numpy as it starts when its share of the long spans repays the import, else
none ever does. The parent never imports it: it holds the job's events at its peak, and numpy is 10 MB. A process
that scans on its own counts without numpy until the long spans it has counted that way (NUMPY_AFTER_BYTES) cost
about what the import does, and imports numpy then: the rule that never pays more than twice the better choice
made in hindsight.
"""

from __future__ import annotations

from types import ModuleType

#: spans shorter than this are counted by bytes.count (a copy's fixed cost is more than the loop saves)
REPLACE_MIN_BYTES = 4 << 10
#: a long span is counted in pieces of this many bytes (a 4 MB piece's copies leave the cache and cost more a byte)
REPLACE_PIECE = 256 << 10
#: spans shorter than this never go to numpy (its fixed cost per call is more than it saves on them)
NUMPY_MIN_BYTES = 16 << 10
#: what a long span costs to count, ns a byte, without numpy (`_memchr_count`) and with it; what importing numpy
#: costs a process, s (measured on the 2-core VM, 2026-11-28: benchmarks/README.md)
COUNT_NS = 0.30
NUMPY_COUNT_NS = 0.175
NUMPY_IMPORT_S = 0.165
#: long-span bytes a process counts without numpy before it imports it (their count costs about the import)
NUMPY_AFTER_BYTES = int(NUMPY_IMPORT_S / (COUNT_NS * 1e-9))

_numpy: ModuleType | None = None
#: long-span bytes this process counted without numpy; None once numpy is imported or found missing
_counted: int | None = 0


def newlines(block: bytes | bytearray, start: int, end: int) -> int:
    """How many b'\\n' bytes `block[start:end]` holds (copying a piece of it at most)."""
    size = end - start
    if size >= NUMPY_MIN_BYTES:
        np = _numpy if _numpy is not None else _numpy_after(size)
        if np is not None:
            return int(np.count_nonzero(np.frombuffer(block, np.uint8, size, start) == 10))
    if size >= REPLACE_MIN_BYTES:
        return _memchr_count(block, start, end)
    return block.count(b"\n", start, end)


def _memchr_count(block: bytes | bytearray, start: int, end: int) -> int:
    """The newlines of `block[start:end]`: the bytes that `replace` drops from each piece of it."""
    count = 0
    for at in range(start, end, REPLACE_PIECE):
        piece = block[at:min(at + REPLACE_PIECE, end)]
        count += len(piece) - len(piece.replace(b"\n", b""))
    return count


def worth_importing(long_bytes: int, workers: int) -> bool:
    """Whether each of `workers` that share `long_bytes` of long spans to count repays importing numpy first."""
    return long_bytes / max(workers, 1) * (COUNT_NS - NUMPY_COUNT_NS) * 1e-9 > NUMPY_IMPORT_S


def follow_parent(use_numpy: bool) -> None:
    """In a worker as it starts: count the way its parent decided (`worth_importing`), numpy imported now or never."""
    global _counted
    if use_numpy:
        _import_numpy()
    else:
        _counted = None


def counting_with_numpy() -> bool:
    """Whether this process counts long spans with numpy now (imported by `follow_parent`, or once it paid)."""
    return _numpy is not None


def start_afresh() -> None:
    """Count as a process that has just started: without numpy, no long span counted yet (a test starts from it)."""
    global _counted, _numpy
    _numpy, _counted = None, 0


def _numpy_after(size: int) -> ModuleType | None:
    """numpy, once this process has counted NUMPY_AFTER_BYTES of long spans without it (this one included)."""
    global _counted
    if _counted is None:
        return None
    _counted += size
    if _counted < NUMPY_AFTER_BYTES:
        return None
    return _import_numpy()


def _import_numpy() -> ModuleType | None:
    """numpy, imported now (None where it is missing); `bytes.count` from then on, where it is."""
    global _counted, _numpy
    _counted = None
    try:
        import numpy
    except ImportError:
        return None
    _numpy = numpy
    return numpy
