"""The preemption flag a training script reads at step boundaries.

The worker installs `install_handler()` before running the user's script. The handler only sets a
flag (checkpointing inside a signal handler hangs: Lightning#21406); the script checks
`preemption_requested()` at a step boundary, saves its checkpoint and exits; the worker then requeues.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import FrameType

_requested = False
_seen = False  # the script asked for the flag after it was set
_listeners: list[Callable[[int], None]] = []

#: Signal ddpslurm asks Slurm to send before the time limit or on preemption (NCCL may catch USR1).
PREEMPTION_SIGNAL = signal.SIGUSR2


def preemption_requested() -> bool:
    """True once the preemption / time-limit signal arrived in this process (or its launcher)."""
    global _seen
    requested = _requested or os.environ.get("DDPSLURM_PREEMPTED") == "1"
    if requested:
        _seen = True
    return requested


def flag_seen() -> bool:
    """True once the script has asked for the flag after it was set: it is on its way out (saving a
    checkpoint, say), and the launcher must not interrupt it."""
    return _seen


def request(signum: int) -> None:
    """Set the flag as the signal handler would (the worker's SIGTERM handler uses it)."""
    _on_signal(signum, None)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _requested
    _requested = True
    for listener in list(_listeners):
        listener(signum)


def install_handler(signum: int = PREEMPTION_SIGNAL, on_signal: Callable[[int], None] | None = None) -> None:
    """Make `signum` set the flag instead of killing the process; `on_signal(signum)` is then called too
    (the worker uses it to arm its grace timer and to forward the signal to torchrun's children)."""
    if on_signal is not None:
        _listeners.append(on_signal)
    signal.signal(signum, _on_signal)


def reset() -> None:
    """Clear the flag and the listeners (tests, and a worker that starts a new attempt in the same process)."""
    global _requested, _seen
    _requested = _seen = False
    _listeners.clear()
