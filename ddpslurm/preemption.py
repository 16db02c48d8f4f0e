"""The preemption flag a training script reads at step boundaries.

Under `ddpslurm submit` the worker's signal handlers (`ddpslurm.launch.signals`) set it; a script run
by itself can call `install_handler()`. A handler only sets the flag (checkpointing inside a signal
handler hangs: Lightning#21406); the script checks `preemption_requested()` at a step boundary, saves
its checkpoint and exits; the launcher then requeues.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

_requested = False
_seen = False  # the script asked for the flag after it was set

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


def request(signum: int | None = None) -> None:
    """Set the flag (what the signal handlers do; safe inside one: an assignment, nothing else)."""
    global _requested
    _requested = True


def _on_signal(signum: int, frame: FrameType | None) -> None:
    request(signum)


def install_handler(signum: int = PREEMPTION_SIGNAL) -> None:
    """Make `signum` set the flag instead of killing the process (for a script run without the worker)."""
    signal.signal(signum, _on_signal)


def reset() -> None:
    """Clear the flag (tests, and a worker that starts a new attempt in the same process)."""
    global _requested, _seen
    _requested = _seen = False
