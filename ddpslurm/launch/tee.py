"""Capture a process's fd 1 and fd 2 into a file while still passing them through.

Works at the file-descriptor level, so C++ writes (c10d, gloo, NCCL) are captured too: each fd is
redirected into a pipe; a thread copies the pipe to the original destination and to the log file.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

_CHUNK = 65536


class FdTee:
    """`start()` redirects fds 1 and 2 through the tee; `stop()` restores them and drains the pipes."""

    def __init__(self, log_path: Path, fds: tuple[int, ...] = (1, 2)) -> None:
        self.log_path = log_path
        self.fds = fds
        self._saved: dict[int, int] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._log_fd = -1

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _flush_python_streams()
        for fd in self.fds:
            saved = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            self._saved[fd] = saved
            thread = threading.Thread(target=self._pump, args=(read_end, saved), name=f"ddpslurm-tee-{fd}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pump(self, read_end: int, destination: int) -> None:
        try:
            while True:
                data = os.read(read_end, _CHUNK)
                if not data:
                    break
                with self._lock:
                    _write_all(self._log_fd, data)
                _write_all(destination, data)
        except OSError:
            pass
        finally:
            os.close(read_end)

    def stop(self, timeout: float = 2.0) -> None:
        """Restore the fds; wait up to `timeout` for the copies (children may still hold the pipe)."""
        _flush_python_streams()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
        for thread in self._threads:
            thread.join(timeout)
        if any(thread.is_alive() for thread in self._threads):
            return  # a child still writes: keep its destinations open (closing could hit a reused fd)
        for saved in self._saved.values():
            os.close(saved)
        self._saved.clear()
        self._threads.clear()
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1


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
