"""A rank's signal handling: handlers that only take note, and a thread that acts on what they noted.

`install()` is the first thing a rank does (before any shared-filesystem I/O: folder creation, the log
tee's fork), so every SIGTERM or USR2 that reaches ddpslurm's code is ddpslurm's: submitit's own handlers,
in place until then, would ignore a SIGTERM (the rank trains on into SIGKILL) and answer a USR2 by
requeueing the job from rank 0, behind the batch-step supervisor's back.

A handler sets the preemption flag, appends `(signum, time)` to a list and writes one byte into a pipe:
no file, no print, no lock (a handler runs between two bytecodes of the main thread, maybe inside a write
to the same stream or file). The `Dispatcher` thread wakes on the pipe and hands each arrival, in order,
to the rank's callback, which writes the records, prints, and decides whether a SIGTERM ends the rank.

A process forked from the rank (a DataLoader worker) inherits the handlers: there they only set that
process's flag, so a worker survives the preemption SIGTERM while its parent finishes the step.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from ddpslurm import preemption

#: The signals that set the flag: Slurm's SIGTERM (GraceTime preemption, requeue, scancel) and USR2 (the
#: job's --signal before the time limit, or at preemption with preempt_send_user_signal).
WATCHED = (signal.SIGTERM, preemption.PREEMPTION_SIGNAL)


class Inbox:
    """Where the handlers leave the signals they caught; `wait()` blocks until one comes."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.arrivals: list[tuple[int, float]] = []
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: set the flag, note the arrival, wake the dispatcher. Nothing else."""
        preemption.request(signum)
        if os.getpid() != self.pid:  # a forked child: no dispatcher runs here
            return
        self.arrivals.append((signum, time.time()))  # list.append holds no lock a handler could meet again
        with contextlib.suppress(OSError):  # a full pipe already wakes the dispatcher
            os.write(self._write_fd, b"s")

    def wait(self, timeout: float | None) -> None:
        """Block until a handler wrote (or `timeout` s passed), then empty the pipe."""
        with contextlib.suppress(InterruptedError, OSError, ValueError):
            select.select([self._read_fd], [], [], timeout)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._read_fd, 4096):
                pass


def install(inbox: Inbox, signums: tuple[int, ...] = WATCHED) -> None:
    """Point `signums` at the inbox's handler (main thread only, as every `signal.signal`)."""
    preemption.reset()
    for signum in signums:
        signal.signal(signum, inbox.handler)


class Dispatcher(threading.Thread):
    """Calls `on_signal(signum, unix)` for each arrival, in order, outside the handler; after each wake,
    `on_wake(now)` returns how long to sleep at most (None: until the next signal)."""

    def __init__(self, inbox: Inbox, on_signal: Callable[[int, float], None],
                 on_wake: Callable[[float], float | None] = lambda now: None) -> None:
        super().__init__(name="ddpslurm-signals", daemon=True)
        self.inbox, self.on_signal, self.on_wake = inbox, on_signal, on_wake
        self.handled = 0

    def run(self) -> None:
        timeout: float | None = 0  # the arrivals noted before the thread started come first
        while True:
            self.inbox.wait(timeout)
            self.dispatch()
            timeout = self.on_wake(time.time())

    def dispatch(self) -> None:
        """Hand over every arrival not handed over yet."""
        while self.handled < len(self.inbox.arrivals):
            signum, unix = self.inbox.arrivals[self.handled]
            self.on_signal(signum, unix)
            self.handled += 1
