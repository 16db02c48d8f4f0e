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
from ddpslurm.analyze.read.bulk import BULK
from ddpslurm.analyze.read.prefilter import TUNE_SAMPLE_BYTES

#: seconds one file may take to read (a hung network filesystem, an endless pseudo-file): then the rest is skipped
READ_DEADLINE = 300.0

_CONTROL_BYTES = bytes(b for b in range(32) if b not in (8, 9, 10, 12, 13, 27)) + b"\x7f"


#: NUL bytes, each run of them one match: a crashed node leaves zero-filled holes (blocks the file system allocated and
#: the dead node never wrote) inside and at the end of its logs on NFS/Lustre, and a log can carry a stray NUL
_NUL_RUNS = re.compile(rb"\x00+")
#: more NUL runs than one per this many bytes of a head are NULs woven through the data (binary structure, UTF-16),
#: not holes in a text log
NUL_RUN_SPACING = 64


def control_bytes(head: bytes) -> int:
    """How many of `head`'s bytes are control bytes (`_CONTROL_BYTES`): in one compiled pass where the bulk path
    is built (`_bulk.control_bytes`, which holds the same set), else what `bytes.translate` drops."""
    if BULK is not None:
        return BULK.control_bytes(head)
    return len(head) - len(head.translate(None, _CONTROL_BYTES))


def is_binary(head: bytes) -> bool:
    """Heuristic: whether a file's first block is binary data, not a text log. NUL runs are holes and left out
    (a head of holes alone is text: its log is read on past them), unless they are woven through the data; then
    mostly non-text bytes make it binary: control bytes, or some control bytes and many bytes that are not UTF-8."""
    if b"\x00" in head:
        if len(_NUL_RUNS.findall(head)) > max(4, len(head) // NUL_RUN_SPACING):
            return True
        head = head.replace(b"\x00", b"")
    if not head:
        return False
    control = control_bytes(head) / len(head)
    if control > 0.1:
        return True
    if control < 0.03:  # text, in any 8-bit encoding (Latin-1, CP1251 letters are not UTF-8)
        return False
    invalid = head.decode("utf-8", "replace").count("\ufffd")  # compressed or random data: most high bytes
    return invalid / len(head) > 0.2


class ReadDeadline(OSError):
    """A file took longer than READ_DEADLINE seconds to read: the rest is left unread (and reported)."""


#: how far back from a file's end `ends_with_newline` looks past a hole of NULs for the last byte written
HOLE_LOOKBACK = 64 << 20

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
        #: where a read that came short ended (the file's end then): a read from there gives nothing without asking
        #: the kernel again (one system call less a file); -1 before one
        self.short_at = -1

    def read(self, n: int) -> bytes:
        """Up to `n` bytes from where the reader is."""
        buf = bytearray(n)
        return bytes(buf[:self.readinto(memoryview(buf))])

    def head(self, n: int) -> bytes:
        """The file's first `n` bytes (at most), read without moving the reader (one pread)."""
        return os.pread(self.fd, n, 0)

    def readinto(self, view: memoryview) -> int:
        """Read into `view`, up to what the file holds plus some slack for a file still growing; how many bytes
        came. A read right after one that came short (a regular file's end, as it was a moment ago) gives 0; one
        after a seek asks the kernel again (a file still being written may have grown)."""
        if time.monotonic() > self.deadline:
            raise ReadDeadline(errno.ETIMEDOUT, f"still reading after {READ_DEADLINE:.0f} s; the rest is not read")
        if self.pos == self.short_at:
            return 0
        want = min(len(view), max(self.size - self.pos, 0) + (64 << 10))
        try:
            got = os.readv(self.fd, [view[:want]])
        except BlockingIOError:
            raise OSError(errno.EAGAIN, "reading it would block (a pseudo-file?)") from None
        if self.pos < self.size <= self.pos + got:
            self.last_byte = view[self.size - 1 - self.pos]
        self.pos += got
        if 0 < got < want:
            self.short_at = self.pos
        return got

    def seek(self, offset: int) -> None:
        self.pos = os.lseek(self.fd, offset, os.SEEK_SET)
        self.short_at = -1

    def ends_with_newline(self) -> bool:
        """Whether the file's last byte (as it was opened) other than a NUL (a hole a crashed node left at its end)
        is a line end; an empty file, or one of NULs only, has no cut line."""
        if self.last_byte is not None and self.last_byte != 0:
            return self.last_byte == 10
        if self.last_byte is None and self.size:
            last = os.pread(self.fd, 1, self.size - 1)
            if last != b"\x00":
                return last == b"\n"
        end = self.size
        while end > max(0, self.size - HOLE_LOOKBACK):
            start = max(0, end - (64 << 10))
            piece = os.pread(self.fd, end - start, start).rstrip(b"\x00")
            if piece:
                return piece[-1:] == b"\n"
            end = start
        return True

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
