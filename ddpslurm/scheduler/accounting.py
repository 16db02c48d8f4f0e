"""What Slurm's accounting (sacct) knows about a job: attempts, states, exit codes, nodes per step.

`job_accounting(job_id)` is the call `ddpslurm analyze JOBID` uses: it never raises for a missing or
unreachable sacct, it returns None, so the analyzer can go on from the logs alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ddpslurm.errors import SlurmCommandError, SlurmNotFoundError
from ddpslurm.scheduler.commands import check_job_id, sacct_argv
from ddpslurm.scheduler.parse import JobRecord, StepRecord, parse_sacct
from ddpslurm.scheduler.run import run
from ddpslurm.scheduler.states import JobState


@dataclass(frozen=True)
class JobAccounting:
    """All attempts of one job as sacct --duplicates lists them (oldest first); the last is the current."""

    job_id: str
    attempts: tuple[JobRecord, ...]

    @property
    def current(self) -> JobRecord:
        return self.attempts[-1]

    @property
    def state(self) -> JobState:
        return self.current.state

    @property
    def terminal(self) -> bool:
        return self.current.terminal

    @property
    def exit_code(self) -> int | None:
        return self.current.exit_code

    @property
    def signal(self) -> int | None:
        return self.current.signal

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        """Steps of the current attempt (`batch`, `extern`, `0`, ...)."""
        return self.current.steps

    @property
    def requeue_count(self) -> int:
        """How many times the job went back to the queue (one extra sacct record per requeue)."""
        return len(self.attempts) - 1

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.current.nodes

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary (the analyzer and `status --json` use the same shape for steps)."""
        return {
            "job_id": self.job_id, "state": self.state.value, "slurm_state": self.current.raw_state,
            "exit_code": self.exit_code, "signal": self.signal, "requeue_count": self.requeue_count,
            "nodes": list(self.nodes), "steps": [step_dict(s) for s in self.steps],
        }


def step_dict(step: StepRecord) -> dict[str, object]:
    """One step as plain JSON values."""
    return {
        "step": step.step_id, "state": step.state.value, "slurm_state": step.raw_state,
        "exit_code": step.exit_code, "signal": step.signal, "nodelist": step.nodelist, "nodes": list(step.nodes),
        "ntasks": step.ntasks, "elapsed_s": step.elapsed_s, "start": step.start, "end": step.end,
    }


def accounting_from_records(job_id: str, records: Iterable[JobRecord]) -> JobAccounting | None:
    """Pick the records of `job_id` out of parsed sacct output; None if absent.

    Matched by JobID, else by JobIDRaw unless `job_id` is an array's id: one array task carries the
    array's id as its JobIDRaw, and taking it for the whole array would mislead (see `array_tasks`).
    """
    records = list(records)
    mine = tuple(r for r in records if r.job_id == job_id)
    if not mine and not array_tasks(job_id, records):
        mine = tuple(r for r in records if r.job_id_raw == job_id)
    return JobAccounting(job_id, mine) if mine else None


def array_tasks(job_id: str, records: Iterable[JobRecord]) -> list[str]:
    """The task ids (`123_0`, `123_1`, ...) when `job_id` is an array job's id, else []."""
    return sorted({r.job_id for r in records if r.job_id.startswith(f"{job_id}_")})


def query_sacct(job_ids: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                timeout: float = 30) -> list[JobRecord]:
    """Run sacct for the jobs and parse it. Raises SlurmNotFoundError / SlurmCommandError."""
    return parse_sacct(run(sacct_argv(job_ids), timeout=timeout, env=env).stdout)


def job_accounting(job_id: str | int, *, env: Mapping[str, str] | None = None,
                   timeout: float = 30) -> JobAccounting | None:
    """States, exit codes and nodes per step of a job from sacct.

    None when sacct is not installed, accounting is off or unreachable, or it does not know the job.
    """
    text = check_job_id(job_id)
    records = sacct_records(text, env=env, timeout=timeout)
    return accounting_from_records(text, records) if records is not None else None


def sacct_records(job_id: str, *, env: Mapping[str, str] | None = None, timeout: float = 30) -> list[JobRecord] | None:
    """Parsed sacct records for a job, or None when sacct is missing or fails (accounting off, slurmdbd down)."""
    try:
        return query_sacct(job_id, env=env, timeout=timeout)
    except (SlurmNotFoundError, SlurmCommandError):
        return None
