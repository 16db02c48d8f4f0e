"""Read-ahead: a task's scan jobs in, their files opened and their byte ranges asked of the kernel out.
Each job's file is opened (with `READ_FLAGS`) and its range advised WILLNEED, so that files not in memory yet are
read while the ones before them are scanned; the open file is handed to the scan (no file is opened twice). Where
opening a file takes a round trip each (a network file system, judged on the first files this process opened),
threads open the next ones side by side and read their attributes too.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.read.discover import round_trips
from ddpslurm.analyze.read.files import READ_FLAGS, Opened

#: a scan task: the file, the year for year-less times, the byte range, whether its last lines are kept
ScanJob = tuple[SourceFile, int | None, int, int | None, bool]

_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
#: the most bytes of one file (or range) asked for ahead: past it the kernel's own read-ahead keeps a sequential read
#: fed, and a huge range is not pulled into memory at once
READ_AHEAD_BYTES = 8 << 20
#: files asked for ahead at a time (a task holds up to BATCH_FILES): up to twice as many are open at once
READ_AHEAD_FILES = 64


#: this process's opens timed so far (`read_ahead` without threads): how many, and their seconds (`opens_slow` judges
#: them; a test sets them to make opening slow or fast)
OPENS_TIMED = [0, 0.0]


def time_opens_afresh() -> None:
    """Forget the opens timed so far: how slow opening is gets timed afresh on the files of the scan at hand (by its
    workers too, forked after this)."""
    OPENS_TIMED[:] = [0, 0.0]


def opens_slow() -> bool:
    """Whether the first READ_AHEAD_FILES files this process opened for the scan at hand took a round trip each
    (`scan_files` starts the count again; a worker times its own)."""
    return round_trips(*OPENS_TIMED, timed=READ_AHEAD_FILES)


def read_ahead(batch: Sequence[ScanJob], pool: ThreadPoolExecutor | None = None) -> list[Opened | None]:
    """Open a task's files and ask the kernel to start reading their byte ranges now (posix_fadvise WILLNEED), so that
    those not in memory yet (a job's logs read for the first time, on a shared file system) are read while the first
    ones are scanned, instead of each read waiting in turn.

    Returns each job's open file, for its scan to read through and close (no file is opened twice: an open is a
    round trip to the metadata server on Lustre or NFS); None where it is not opened here (no advice to give on this
    platform, nothing to read, or it cannot be opened now: the scan opens it and reports why). Threads (`pool`) read
    each file's attributes too, for the scan to use instead of a round trip of its own, one file after the other."""
    if _WILLNEED is None:
        return [None] * len(batch)
    if pool is not None:
        return list(pool.map(functools.partial(_open_ahead, attributes=True), batch))
    started = time.perf_counter()
    opened = [_open_ahead(job) for job in batch]
    if OPENS_TIMED[0] < READ_AHEAD_FILES:
        OPENS_TIMED[0] += len(batch)
        OPENS_TIMED[1] += time.perf_counter() - started
    return opened


def _open_ahead(job: ScanJob, attributes: bool = False) -> Opened | None:
    """`read_ahead` of one job: its file opened and its range asked for (and its attributes read), or None."""
    source, _year, start, end, _tail = job
    length = min((source.size if end is None else end) - start, READ_AHEAD_BYTES)
    if length <= 0:
        return None
    try:
        fd = os.open(source.path, READ_FLAGS)
    except OSError:
        return None
    read: os.stat_result | None = None
    with contextlib.suppress(OSError):  # not a regular file (a fifo: ESPIPE), or no advice taken there
        if attributes:
            read = os.fstat(fd)
        os.posix_fadvise(fd, start, length, _WILLNEED)
    return Opened(fd, read)
