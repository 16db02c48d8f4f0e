"""Capture a process's fd 1 and fd 2 into a file, passing them through to where they went before or not.

Works at the file-descriptor level, so C++ writes (c10d, gloo, NCCL) are captured too: each fd is
redirected into a pipe, and a small forked copier process copies the pipes to the original
destinations and to the log file. A process, not a thread: when the rank dies (abort, SIGKILL of the
rank alone) the copier still drains what the rank wrote last, which is usually the error message.
The copier ignores the signals Slurm sends to every process of a step (TERM, INT, HUP, USR1, USR2)
and ends when all writers have closed the pipes.

The worker captures without passing through (`passthrough=False`): the rank's log is the one copy of its
output, and the task's own stdout and stderr (submitit's `%j_%t_log.out/err`, written by slurmstepd) keep
only what comes before the capture and after it (the interpreter's start-up, submitit's lines, slurmstepd's).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from pathlib import Path

_CHUNK = 65536
_IGNORED_IN_COPIER = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                      signal.SIGALRM, signal.SIGCONT)


class FdTee:
    """`start()` redirects fds 1 and 2 through the copier; `stop()` restores them and lets it drain."""

    def __init__(self, log_path: Path, fds: tuple[int, ...] = (1, 2), passthrough: bool = True) -> None:
        self.log_path = log_path
        self.fds = fds
        self.passthrough = passthrough
        self._saved: dict[int, int] = {}
        self._pid = 0

    def start(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        try:
            log_fd = os.open(self.log_path, flags, 0o644)
        except FileNotFoundError:  # made only when missing: the batch step made the folders before srun
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log_fd = os.open(self.log_path, flags, 0o644)
        _flush_python_streams()
        pipes = {fd: os.pipe() for fd in self.fds}
        saved = {fd: os.dup(fd) for fd in self.fds}
        pid = os.fork()
        if pid == 0:  # the copier
            try:
                for sig in _IGNORED_IN_COPIER:
                    signal.signal(sig, signal.SIG_IGN)
                for _, write_end in pipes.values():
                    os.close(write_end)
                _copy({read_end: saved[fd] if self.passthrough else None for fd, (read_end, _) in pipes.items()},
                      log_fd)
            finally:
                os._exit(0)
        os.close(log_fd)
        for fd, (read_end, write_end) in pipes.items():
            os.close(read_end)
            os.dup2(write_end, fd)
            os.close(write_end)
        self._saved, self._pid = saved, pid

    def stop(self, timeout: float = 2.0) -> None:
        """Restore the fds and wait up to `timeout` s for the copier (children may still hold the pipe)."""
        if not self._pid:
            return
        _flush_python_streams()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # drops this process's write end of the pipe
            os.close(saved)
        self._saved = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self._pid, os.WNOHANG)[0]:
                    break
            time.sleep(0.01)
        self._pid = 0


def _copy(sources: dict[int, int | None], log_fd: int) -> None:
    """Copy every readable source to `log_fd` and to its destination (None: none) until all reach end of file."""
    open_fds = dict(sources)
    while open_fds:
        try:
            ready, _, _ = select.select(list(open_fds), [], [])
        except InterruptedError:
            continue
        for read_end in ready:
            data = os.read(read_end, _CHUNK)
            if not data:
                os.close(read_end)
                del open_fds[read_end]
                continue
            _write_all(log_fd, data)
            destination = open_fds[read_end]
            if destination is not None:
                _write_all(destination, data)


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:
            return
        view = view[written:]
