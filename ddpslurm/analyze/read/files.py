"""Opening a log for its scan: a path (or a file `read_ahead` opened already) in, a reader of its bytes out.
A log is opened without ever blocking on a pseudo-file and never becoming a controlling terminal, only regular files
are read, and a wall-clock deadline stops a file that takes too long (a hung network filesystem, an endless
pseudo-file). Here too: the test that a file's first block is binary data, not text, and the sample of the largest
files' heads that the prefilter's anchor orders are timed on.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Sequence
from typing import NamedTuple

from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.read.prefilter import TUNE_SAMPLE_BYTES

#: seconds one file may take to read (a hung network filesystem, an endless pseudo-file): then the rest is skipped
READ_DEADLINE = 300.0

_CONTROL_BYTES = bytes(b for b in range(32) if b not in (8, 9, 10, 12, 13, 27)) + b"\x7f"


#: a run of NULs this long is a hole (what a node crash leaves at the end of a log on NFS/Lustre), not binary data
_NUL_RUN = re.compile(rb"\x00{16,}")


def is_binary(head: bytes) -> bool:
    """Heuristic: NUL bytes or mostly non-text bytes in the first block, zero-filled holes aside."""
    if b"\x00" in head:
        head = _NUL_RUN.sub(b"", head)
    if not head:
        return False
    if head.count(b"\x00") > max(1, len(head) // 100):
        return True
    control = len(head) - len(head.translate(None, _CONTROL_BYTES))
    return control / len(head) > 0.1


class ReadDeadline(OSError):
    """A file took longer than READ_DEADLINE seconds to read: the rest is left unread (and reported)."""


#: how a log is opened: never blocking on a pseudo-file, never becoming a controlling terminal
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


class Opened(NamedTuple):
    """A file `read_ahead` opened for its scan: its descriptor, and its attributes where a thread read them (on NFS
    mounted `noac` each fstat asks the server again)."""

    fd: int
    attributes: os.stat_result | None = None


class Reader:
    """A log opened for reading without ever blocking on a pseudo-file (/proc/kmsg, a fifo reached by a race) and
    with a wall-clock deadline, checked at every read. Only regular files are read."""

    def __init__(self, path: str, deadline: float, opened: Opened | None = None) -> None:
        """Open `path`, or read through `opened`, the same file opened already with READ_FLAGS (the reader closes
        it), with its attributes where they were read then."""
        self.fd = os.open(path, READ_FLAGS) if opened is None else opened.fd
        try:
            st = opened.attributes if opened is not None and opened.attributes is not None else os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
        except OSError:
            os.close(self.fd)
            raise
        self.size, self.pos = st.st_size, 0
        self.deadline = time.monotonic() + deadline
        #: the file's last byte (as opened) once a read has covered it: `ends_with_newline` asks no more then
        self.last_byte: int | None = None

    def read(self, n: int) -> bytes:
        """Up to `n` bytes from where the reader is."""
        buf = bytearray(n)
        return bytes(buf[:self.readinto(memoryview(buf))])

    def head(self, n: int) -> bytes:
        """The file's first `n` bytes (at most), read without moving the reader (one pread)."""
        return os.pread(self.fd, n, 0)

    def readinto(self, view: memoryview) -> int:
        """Read into `view`, up to what the file holds plus some slack for a file still growing; how many bytes
        came."""
        if time.monotonic() > self.deadline:
            raise ReadDeadline(errno.ETIMEDOUT, f"still reading after {READ_DEADLINE:.0f} s; the rest is not read")
        want = min(len(view), max(self.size - self.pos, 0) + (64 << 10))
        try:
            got = os.readv(self.fd, [view[:want]])
        except BlockingIOError:
            raise OSError(errno.EAGAIN, "reading it would block (a pseudo-file?)") from None
        if self.pos < self.size <= self.pos + got:
            self.last_byte = view[self.size - 1 - self.pos]
        self.pos += got
        return got

    def seek(self, offset: int) -> None:
        self.pos = os.lseek(self.fd, offset, os.SEEK_SET)

    def ends_with_newline(self) -> bool:
        """Whether the file's last byte (as it was opened) is a line end; an empty file has no cut line."""
        if self.last_byte is not None:
            return self.last_byte == 10
        return self.size == 0 or os.pread(self.fd, 1, self.size - 1) == b"\n"

    def tell(self) -> int:
        return self.pos

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def prefilter_sample(sources: Sequence[SourceFile], size: int = TUNE_SAMPLE_BYTES) -> bytes:
    """The first bytes of the largest files, `size` in all and a quarter of it at most from one file: the text the
    prefilter's anchor orders are timed on. Files that cannot be read now, and binary ones, give nothing."""
    pieces: list[bytes] = []
    left = size
    for source in sorted(sources, key=lambda s: -s.size):
        if left <= 0:
            break
        try:
            with Reader(source.path, READ_DEADLINE) as handle:
                piece = handle.read(min(left, size // 4))
        except OSError:
            continue
        if piece and not is_binary(piece[:8192]):
            pieces.append(piece)
            left -= len(piece)
    return b"".join(pieces)
