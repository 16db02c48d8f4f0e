"""After the preemption / time-limit signal: was it the time limit, and should the job be requeued?

Slurm sends the same signal (USR2, `--signal-delay` seconds early) for both; like submitit, a signal
that arrives after min(0.8 T, T - 10 min) of a T-second limit counts as the time limit, an earlier
one as a preemption. Requeues are capped by SLURM_RESTART_COUNT (the attempt number).
"""

from __future__ import annotations

from dataclasses import dataclass

TIME_LIMIT = "time_limit"
PREEMPTION = "preemption"
#: Exit status of ranks whose job wanted a requeue but reached --max-requeues (EX_TEMPFAIL).
CAP_REACHED_EXIT = 75


def is_time_limit(elapsed_s: float, limit_s: float) -> bool:
    """True when a signal after `elapsed_s` of a `limit_s` job means the time limit (submitit's rule)."""
    return elapsed_s >= min(0.8 * limit_s, limit_s - 600)


@dataclass(frozen=True)
class RequeueDecision:
    reason: str  # TIME_LIMIT | PREEMPTION
    requeue: bool  # whether the job is to be requeued (by global rank 0)
    exit_code: int  # what this rank exits with


def decide(*, elapsed_s: float, limit_s: float, attempt: int, max_requeues: int, can_requeue: bool = True,
           ) -> RequeueDecision:
    """What a rank does once the script has stopped after the signal."""
    reason = TIME_LIMIT if is_time_limit(elapsed_s, limit_s) else PREEMPTION
    if can_requeue and attempt < max_requeues:
        return RequeueDecision(reason, True, 0)
    return RequeueDecision(reason, False, CAP_REACHED_EXIT)


def requeue_job(job_id: str) -> None:
    """`scontrol requeue JOBID` through the scheduler runner."""
    from ddpslurm.scheduler.commands import scontrol_requeue_argv
    from ddpslurm.scheduler.run import run

    run(scontrol_requeue_argv(job_id), timeout=60)
