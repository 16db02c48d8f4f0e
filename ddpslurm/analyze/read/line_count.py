"""Counting the line ends of a block: the scan counts every byte's newlines, for line numbers and each file's
line count.

Where the compiled scanner is built, its `newlines` counts them (a vectorized memchr loop, the GIL released on long
spans). The pure path: `bytes.count` of one byte is a byte-at-a-time loop; `bytes.replace` of one byte by nothing
finds them with memchr and copies what is left: counted as the length it lost, a span in pieces of REPLACE_PIECE
(the piece's copies stay in the core's cache) costs less, the copies included, and wins from about 4 KB on.
"""

from __future__ import annotations

from ddpslurm.analyze.read.bulk import BULK

#: spans shorter than this are counted by bytes.count (a copy's fixed cost is more than the loop saves)
REPLACE_MIN_BYTES = 4 << 10
#: a long span is counted in pieces of this many bytes (a 4 MB piece's copies leave the cache and cost more a byte)
REPLACE_PIECE = 256 << 10


def pure_newlines(block: bytes | bytearray, start: int, end: int) -> int:
    """How many b'\\n' bytes `block[start:end]` holds, counted in Python (copying a piece of it at most): the pure
    twin of `_bulk.newlines`."""
    if end - start >= REPLACE_MIN_BYTES:
        return _memchr_count(block, start, end)
    return block.count(b"\n", start, end)


def _memchr_count(block: bytes | bytearray, start: int, end: int) -> int:
    """The newlines of `block[start:end]`: the bytes that `replace` drops from each piece of it."""
    count = 0
    for at in range(start, end, REPLACE_PIECE):
        piece = block[at:min(at + REPLACE_PIECE, end)]
        count += len(piece) - len(piece.replace(b"\n", b""))
    return count


#: how many b'\n' bytes `block[start:end]` holds: compiled where it was built, else `pure_newlines`
newlines = BULK.newlines if BULK is not None else pure_newlines
