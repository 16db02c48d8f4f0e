"""Counting the line ends of a block: the scan counts every byte's newlines, for line numbers and each file's
line count.

`bytes.count` of one byte is a byte-at-a-time loop (0.3-0.5 CPU s per GB here); numpy compares a block in vector
instructions (about 0.06 s per GB, benchmarks/README.md). numpy comes with pandas, a dependency, but costs 60-80
ms and 10 MB to import, which a small job never earns back. So a process counts with `bytes.count` until the long
spans it has counted that way (NUMPY_AFTER_BYTES) cost about what the import does, and imports numpy then: the
rule that never pays more than twice the better choice made in hindsight. Short spans, where numpy's fixed cost
per call is more than the loop, and a process without numpy always count with `bytes.count`.
"""

from __future__ import annotations

from types import ModuleType

#: spans shorter than this are counted by bytes.count (numpy's fixed cost per call is a few microseconds)
NUMPY_MIN_BYTES = 16 << 10
#: long-span bytes a process counts with bytes.count before it imports numpy (their count costs about the import)
NUMPY_AFTER_BYTES = 128 << 20

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


def _numpy_after(size: int) -> ModuleType | None:
    """numpy, once this process has counted NUMPY_AFTER_BYTES of long spans without it (this one included)."""
    global _counted, _numpy
    if _counted is None:
        return None
    _counted += size
    if _counted < NUMPY_AFTER_BYTES:
        return None
    _counted = None
    try:
        import numpy
    except ImportError:
        return None
    _numpy = numpy
    return numpy
