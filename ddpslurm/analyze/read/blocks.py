"""Byte blocks of whole lines: a binary handle (a `Reader`, or a `Window` over a byte range of it) in, blocks out.
A file is read in chunks of `CHUNK` bytes into one reused buffer, each block cut at its last line end (the partial
line after it is read again with the next block); overlong lines are truncated to `MAX_LINE` bytes and their rest
skipped without being held in memory. A file's last line without a line end is given one. NUL bytes are left out
of the lines (`_Stream`): the zero-filled holes a crashed node leaves in its logs are noise, and a line written
after one is read whole, not cut at MAX_LINE by the hole before it.
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
    try:
        yield from _blocks(_Stream(handle, buf, chunk), buf, max_line)
    finally:
        _BUFFER.append(buf)


def _blocks(handle: _Stream, buf: bytearray, max_line: int) -> Iterator[tuple[bytes | bytearray, int, int]]:
    view = handle.view
    discarding = False  # inside an overlong line whose first max_line bytes were yielded
    while True:
        got = handle.readinto(0)
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
            more = _read_more(handle, got)
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


def _read_more(handle: _Stream, had: int) -> int:
    """Read again from a piece of `had` bytes without a line end: how many bytes are there now (the file may grow)."""
    total = 0
    while total < len(handle.view):
        got = handle.readinto(total)
        if not got:
            break
        total += got
        if total > had:
            break
    return total


class _Stream:
    """A binary handle's bytes read into `buf[:size]` with their NUL bytes left out, its positions (`tell`, `seek`)
    counted in the bytes kept. A read without a NUL (all of them, in most logs) is passed on as it came; one with NULs
    is compacted in place, and one of NULs only read past. `seek` goes where `_blocks` goes back to: the start of the
    reads since the last seek, or the start, the end or just past the first or the last line end of the last read."""

    __slots__ = ("buf", "handle", "last", "mark", "pos", "real", "view")

    def __init__(self, handle, buf: bytearray, size: int) -> None:
        self.handle, self.buf, self.view = handle, buf, memoryview(buf)[:size]
        self.pos = self.real = handle.tell()
        self.mark = (self.pos, self.real)  #: the last seek's position, kept bytes and file bytes
        #: the last read: where it started (kept, file), how long it was (kept, file), and where its first and last
        #: line ends are (kept, file) when it held a NUL (else None: kept and file positions move together)
        self.last: tuple[int, int, int, int, tuple[int, int, int, int] | None] = (self.pos, self.real, 0, 0, None)

    def readinto(self, start: int) -> int:
        """Read into `view[start:]`, NULs left out; how many bytes were kept (0 at the end of the file)."""
        real = self.real
        got = self.handle.readinto(self.view[start:])
        self.real += got
        if not got or self.buf.find(0, start, start + got) < 0:
            self.last = (self.pos, real, got, got, None)
            self.pos += got
            return got
        return self._compacted(start, got, real)

    def _compacted(self, start: int, got: int, real: int) -> int:
        """A read of `got` bytes at `view[start:]` that holds NULs, compacted, and the view filled up by further
        reads (a read of a hole alone keeps nothing, and `_blocks` takes a short read of a line for its end)."""
        at, kept_total, real_total = start, 0, 0
        first: tuple[int, int] = (-1, -1)
        last: tuple[int, int] = (-1, -1)
        while got:
            raw = bytes(self.view[at:at + got])
            kept = raw.replace(b"\x00", b"")
            self.buf[at:at + len(kept)] = kept
            if b"\n" in kept:
                if first == (-1, -1):
                    first = (kept_total + kept.find(b"\n"), real_total + raw.find(b"\n"))
                last = (kept_total + kept.rfind(b"\n"), real_total + raw.rfind(b"\n"))
            kept_total, real_total, at = kept_total + len(kept), real_total + got, at + len(kept)
            if at >= len(self.view):
                break
            got = self.handle.readinto(self.view[at:])
            self.real += got
        self.last = (self.pos, real, kept_total, real_total, first + last)
        self.pos += kept_total
        return kept_total

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int) -> None:
        real = self._file_position(pos)
        self.handle.seek(real)
        self.pos, self.real = pos, real
        self.mark = (pos, real)

    def _file_position(self, pos: int) -> int:
        if pos == self.mark[0]:
            return self.mark[1]
        kept_at, real_at, kept, real, ends = self.last
        offset = pos - kept_at
        if ends is None:
            if 0 <= offset <= kept:
                return real_at + offset
        else:
            for kept_offset, real_offset in ((0, 0), (ends[0] + 1, ends[1] + 1), (ends[2] + 1, ends[3] + 1),
                                             (kept, real)):
                if offset == kept_offset:
                    return real_at + real_offset
        raise ValueError(f"cannot seek to {pos} in the NUL-free stream")


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
