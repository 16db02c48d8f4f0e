"""Byte blocks of whole lines: a binary handle (a `Reader`, or a `Window` over a byte range of it) in, blocks out.
A file is read in chunks of `CHUNK` bytes into one reused buffer, each block cut at its last line end (the partial
line after it is read again with the next block); overlong lines are truncated to `MAX_LINE` bytes and their rest
skipped without being held in memory. A file's last line without a line end is given one.
"""

from __future__ import annotations

from collections.abc import Iterator

CHUNK = 4 << 20
MAX_LINE = 16 * 1024

#: the read buffer a process reuses for every file it scans (a fresh 4 MB per read costs more than reading it)
_BUFFER: list[bytearray] = []


def _read_buffer(size: int) -> bytearray:
    """A buffer of at least `size` bytes, taken from the process's spare one when it is free (give it back with
    `_BUFFER.append`); a nested reader gets a fresh one."""
    if _BUFFER and len(_BUFFER[-1]) >= size:
        return _BUFFER.pop()
    return bytearray(size)


def iter_blocks(handle, chunk: int = CHUNK, max_line: int = MAX_LINE
                ) -> Iterator[tuple[bytes | bytearray, int, int]]:
    """Blocks of complete lines from a binary handle (`readinto`, `seek`, `tell`): `(buffer, end, truncated)`,
    where `buffer[:end]` are whole lines, each ending with b'\\n', and `truncated` counts the lines cut at
    `max_line` bytes (their rest is skipped without being held in memory).

    Nothing is copied: the buffer is read into and reused, so it is valid only until the next block is asked for,
    and the bytes after `end` are not lines of this block (a partial line is read again with the next block).
    """
    buf = _read_buffer(chunk)
    view = memoryview(buf)[:chunk]
    try:
        yield from _blocks(handle, buf, view, max_line)
    finally:
        _BUFFER.append(buf)


def _blocks(handle, buf: bytearray, view: memoryview, max_line: int) -> Iterator[tuple[bytes | bytearray, int, int]]:
    discarding = False  # inside an overlong line whose first max_line bytes were yielded
    while True:
        got = handle.readinto(view)
        if not got:
            return
        if discarding:
            nl = buf.find(b"\n", 0, got)
            if nl >= 0:
                discarding = False
                handle.seek(handle.tell() - got + nl + 1)
            continue
        last = buf.rfind(b"\n", 0, got)
        if last < 0:
            if got > max_line:
                yield bytes(view[:max_line]) + b"\n", max_line + 1, 1
                discarding = True
                continue
            piece = bytes(view[:got])  # an unterminated piece: the file's last line, unless more follows
            handle.seek(handle.tell() - got)
            more = _read_more(handle, view, got)
            if more <= got:
                yield piece + b"\n", got + 1, 0
                return
            handle.seek(handle.tell() - more)
            continue
        rest = got - last - 1
        if rest > max_line:
            yield buf, last + 1, 0
            yield bytes(view[last + 1:last + 1 + max_line]) + b"\n", max_line + 1, 1
            discarding = True
            continue
        if rest:
            handle.seek(handle.tell() - rest)
        yield buf, last + 1, 0


def _read_more(handle, view: memoryview, had: int) -> int:
    """Read again from a piece of `had` bytes without a line end: how many bytes are there now (the file may grow)."""
    total = 0
    while total < len(view):
        got = handle.readinto(view[total:])
        if not got:
            break
        total += got
        if total > had:
            break
    return total


class Window:
    """A binary reader over the byte range [start, end) of an open file."""

    def __init__(self, handle, start: int, end: int) -> None:
        handle.seek(start)
        self.handle, self.end = handle, end

    def readinto(self, view: memoryview) -> int:
        left = self.end - self.handle.tell()
        return self.handle.readinto(view[:left]) if left > 0 else 0

    def seek(self, offset: int) -> None:
        self.handle.seek(offset)

    def tell(self) -> int:
        return self.handle.tell()
