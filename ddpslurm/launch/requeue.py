"""After the preemption / time-limit signal: was it the time limit, and should the job be requeued?

Slurm sends the same signal (USR2, `--signal-delay` D seconds early) for both. Like submitit, the
elapsed time of the attempt tells them apart, but with the signal delay in the rule: a signal after
min(0.8 T, T - D - 120 s) of a T-second limit is the time limit, an earlier one a preemption. (submitit's
min(0.8 T, T - 10 min) calls every signal in a job shorter than 10 minutes a time limit; the 120 s
cover Slurm sending the signal up to 60 s early plus the start-up between the job's start and the
worker's clock.) Requeues are capped by SLURM_RESTART_COUNT (the attempt number).
"""

from __future__ import annotations

from dataclasses import dataclass

TIME_LIMIT = "time_limit"
PREEMPTION = "preemption"
#: Exit status of ranks whose job wanted a requeue but reached --max-requeues (EX_TEMPFAIL).
CAP_REACHED_EXIT = 75


#: Allowance (s): Slurm's signal may come 60 s early, and the worker's clock starts after the job's.
START_SLACK_S = 120


def is_time_limit(elapsed_s: float, limit_s: float, signal_delay_s: float) -> bool:
    """True when a signal after `elapsed_s` of a `limit_s` job (signalled `signal_delay_s` early) means
    the time limit, False when it means a preemption."""
    return elapsed_s >= min(0.8 * limit_s, limit_s - signal_delay_s - START_SLACK_S)


@dataclass(frozen=True)
class RequeueDecision:
    reason: str  # TIME_LIMIT | PREEMPTION
    requeue: bool  # whether the job is to be requeued (by global rank 0)
    exit_code: int  # what this rank exits with


def decide(*, elapsed_s: float, limit_s: float, signal_delay_s: float, attempt: int, max_requeues: int,
           can_requeue: bool = True) -> RequeueDecision:
    """What a rank does once the script has stopped after the signal."""
    reason = TIME_LIMIT if is_time_limit(elapsed_s, limit_s, signal_delay_s) else PREEMPTION
    if can_requeue and attempt < max_requeues:
        return RequeueDecision(reason, True, 0)
    return RequeueDecision(reason, False, CAP_REACHED_EXIT)


def requeue_job(job_id: str) -> None:
    """`scontrol requeue JOBID` through the scheduler runner."""
    from ddpslurm.scheduler.commands import scontrol_requeue_argv
    from ddpslurm.scheduler.run import run

    run(scontrol_requeue_argv(job_id), timeout=60)
