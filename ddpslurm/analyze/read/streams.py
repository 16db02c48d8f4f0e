"""Logs that are not regular files: standard input (`-`: `xclip -o | ddpslurm analyze -`), a process substitution
(`<(ssh n1 cat log)`, /dev/fd/N) and a named pipe given on the command line. A stream has no size, is read once and
cannot seek, while the scan reads ranges, seeks back over partial lines and may read a file in several workers: so
each stream is copied as it arrives into a temporary regular file (in a folder of its own, removed afterwards) that
is scanned like any log and shown under the name given (`<stdin>`, `/dev/fd/63`).

Bounded like a file: the same wall-clock deadline as a file's read (READ_DEADLINE) ends a stream that never closes
(`tail -f`), and the copy stops before the temporary folder's file system is nearly full (KEEP_FREE_BYTES); what
was not read is reported (`Skipped`), never dropped silently. A fifo met while walking a folder is still skipped:
only a stream named on the command line is read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpslurm.analyze.read.discover import Skipped
from ddpslurm.analyze.read.files import READ_DEADLINE
from ddpslurm.errors import AnalyzeInputError

#: the argument that names standard input, and the name its lines are shown under
STDIN = "-"
STDIN_NAME = "<stdin>"
#: the copy never leaves less than this free on the temporary folder's file system
KEEP_FREE_BYTES = 1 << 30
#: bytes read at a time, and copied between two looks at the free space
READ_BYTES = 1 << 20
CHECK_FREE_EVERY = 64 << 20


@dataclass
class Streams:
    """The paths to discover, each stream replaced by its copy; the name each copy is shown under; what was cut."""

    paths: list[str] = field(default_factory=list)
    shown: dict[str, str] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)

    def names(self) -> list[str]:
        """The paths as the person gave them (a copy under its shown name), for messages."""
        return [self.shown.get(p, p) for p in self.paths]


def is_stream(given: str) -> bool:
    """`-`, or a path to a fifo or pipe (a process substitution's /dev/fd/N): read once, as it comes."""
    if given == STDIN:
        return True
    try:
        return stat.S_ISFIFO(os.stat(given).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def read_streams(paths: Sequence[str | Path], deadline: float = READ_DEADLINE) -> Iterator[Streams]:
    """The given paths with each stream among them copied to a temporary file (removed when the block ends)."""
    streams = Streams()
    folder: str | None = None
    copies: dict[str, str] = {}
    try:
        for given in map(str, paths):
            if not is_stream(given):
                streams.paths.append(given)
                continue
            if given not in copies:
                folder = folder or tempfile.mkdtemp(prefix="ddpslurm-analyze-")
                copies[given] = _copy_stream(given, folder, len(copies), deadline, streams)
            streams.paths.append(copies[given])
        yield streams
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _copy_stream(given: str, folder: str, index: int, deadline: float, streams: Streams) -> str:
    """Copy one stream into `folder`; the copy's path (its shown name recorded, a cut copy reported)."""
    shown = STDIN_NAME if given == STDIN else given
    name = "stdin" if given == STDIN else os.path.basename(given.rstrip("/")) or "stream"
    copy = os.path.join(folder, str(index), name)
    os.makedirs(os.path.dirname(copy))
    try:
        fd = 0 if given == STDIN else os.open(given, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise AnalyzeInputError(f"{shown}: cannot be read ({error.strerror or error})",
                                "check the path and its permissions") from None
    try:
        with open(copy, "wb") as out:
            copied, cut = copy_until_end(fd, out, folder, deadline)
    except OSError as error:
        raise AnalyzeInputError(f"{shown}: cannot be read ({error.strerror or error})",
                                "save the log to a file and analyze that") from None
    finally:
        if fd != 0:
            os.close(fd)
    if cut:
        streams.skipped.append(Skipped(shown, f"{cut}: the first {copied:,} bytes were read, the rest is not"))
    streams.shown[copy] = shown
    return copy


def copy_until_end(fd: int, out, folder: str, deadline: float) -> tuple[int, str | None]:
    """Copy what `fd` gives into `out` until it ends; (bytes copied, why the copy stopped early or None). Waits for
    data with select, so that neither a writer that has not opened its end yet nor one that never closes it holds
    the analysis past `deadline` seconds."""
    end = time.monotonic() + deadline
    copied, checked = 0, 0
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return copied, f"still open after {deadline:.0f} s"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        try:
            chunk = os.read(fd, READ_BYTES)
        except BlockingIOError:
            continue  # another reader of a shared pipe took what woke us
        except OSError as error:
            if error.errno == errno.EIO:  # a terminal that went away: what came so far is the log
                return copied, None
            raise
        if not chunk:
            return copied, None
        if copied - checked >= CHECK_FREE_EVERY or not copied:
            checked = copied
            if shutil.disk_usage(folder).free - len(chunk) < KEEP_FREE_BYTES:
                return copied, f"the temporary folder ({tempfile.gettempdir()}) is nearly full"
        out.write(chunk)
        copied += len(chunk)
