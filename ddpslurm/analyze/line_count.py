"""Counting the line ends of a block: the scan counts every byte's newlines, for line numbers and each file's
line count.

`bytes.count` of one byte is a byte-at-a-time loop (about 0.5 CPU s per GB here); numpy compares a block in
vector instructions (about 0.06 s per GB, benchmarks/README.md). numpy comes with pandas, a dependency, but costs
60-80 ms to import (and 10 MB): a scan turns it on (`use_numpy`) only for inputs large enough to repay that, in
the processes that read the files. Without it, or for short spans (where numpy's per-call cost is more than the
loop), `bytes.count` counts.
"""

from __future__ import annotations

from types import ModuleType

#: spans shorter than this are counted by bytes.count (numpy's fixed cost per call is a few microseconds)
NUMPY_MIN_BYTES = 16 << 10

_numpy: ModuleType | None = None


def use_numpy() -> bool:
    """Count long spans with numpy from now on in this process (and the processes it forks); False when numpy
    cannot be imported (then bytes.count counts, as before)."""
    global _numpy
    if _numpy is None:
        try:
            import numpy
        except ImportError:
            return False
        _numpy = numpy
    return True


def newlines(block: bytes | bytearray, start: int, end: int) -> int:
    """How many b'\\n' bytes `block[start:end]` holds (without copying it)."""
    if _numpy is None or end - start < NUMPY_MIN_BYTES:
        return block.count(b"\n", start, end)
    np = _numpy
    return int(np.count_nonzero(np.frombuffer(block, np.uint8, end - start, start) == 10))
