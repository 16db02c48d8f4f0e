"""Counting the line ends of a block: the scan counts every byte's newlines, for line numbers and each file's
line count.

`bytes.count` of one byte is a byte-at-a-time loop (0.55 ns a byte here); numpy compares a block in vector
instructions (0.11 ns a byte, benchmarks/README.md). numpy comes with pandas, a dependency, but costs 0.12-0.17 s
and 10 MB to import, which a small job never earns back. Short spans, where numpy's fixed cost per call is more
than the loop, and a process without numpy always count with `bytes.count`.

Who imports it: a pool's parent knows every file's size before it forks, so it decides for its workers
(`worth_importing`): each imports numpy as it starts when its share of the long spans repays the import, else
none ever does (a worker that imported numpy halfway through its share, the rule below, paid the import and
repaid little of it: the 256-rank torchrun job lost 0.07 s a worker). The parent never imports it: it holds the
job's events at its peak, and numpy is 10 MB. A process that scans on its own counts with `bytes.count` until the
long spans it has counted that way (NUMPY_AFTER_BYTES) cost about what the import does, and imports numpy then:
the rule that never pays more than twice the better choice made in hindsight.
"""

from __future__ import annotations

from types import ModuleType

#: spans shorter than this are counted by bytes.count (numpy's fixed cost per call is a few microseconds)
NUMPY_MIN_BYTES = 16 << 10
#: what a long span costs to count, ns a byte, with bytes.count and with numpy; what importing numpy costs, s
#: (measured on the 2-core VM, 2026-11-28: benchmarks/README.md)
COUNT_NS = 0.55
NUMPY_COUNT_NS = 0.11
NUMPY_IMPORT_S = 0.14
#: long-span bytes a process counts with bytes.count before it imports numpy (their count costs about the import)
NUMPY_AFTER_BYTES = int(NUMPY_IMPORT_S / (COUNT_NS * 1e-9))

_numpy: ModuleType | None = None
#: long-span bytes this process counted without numpy; None once numpy is imported or found missing
_counted: int | None = 0


def newlines(block: bytes | bytearray, start: int, end: int) -> int:
    """How many b'\\n' bytes `block[start:end]` holds (without copying it)."""
    size = end - start
    if size >= NUMPY_MIN_BYTES:
        np = _numpy if _numpy is not None else _numpy_after(size)
        if np is not None:
            return int(np.count_nonzero(np.frombuffer(block, np.uint8, size, start) == 10))
    return block.count(b"\n", start, end)


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
