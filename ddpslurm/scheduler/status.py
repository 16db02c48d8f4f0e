"""`ddpslurm status`: one job's state from sacct (steps, exit codes, attempts) and the controller
(scontrol: the live state, which slurmdbd records a moment later, requeue count, pending reason).

Exit codes of `ddpslurm status` (see `exit_code_for`): 0 the status was shown (with `--wait`: the
job COMPLETED), 1 a ddpslurm error (unknown job, Slurm missing), 2 usage error, 3 with `--wait` only:
the job ended in failure (failed, cancelled, timeout, out of memory, node failure, preempted).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddpslurm.errors import JobNotFoundError, SlurmCommandError, SlurmNotFoundError, UsageError
from ddpslurm.jobfolder import DEFAULT_ROOT, JOB_FOLDER_NAME, SHOWN_JOB_ID, SUBMITIT_SUBMISSION_NAME, job_folder_name
from ddpslurm.sanitize import terminal as _t
from ddpslurm.scheduler.accounting import JobAccounting, accounting_from_records, array_tasks, sacct_records, step_dict
from ddpslurm.scheduler.commands import check_job_id, scontrol_show_job_argv
from ddpslurm.scheduler.hostlist import compress_hostlist
from ddpslurm.scheduler.parse import StepRecord, parse_elapsed, parse_exit_code, parse_scontrol_show
from ddpslurm.scheduler.run import run
from ddpslurm.scheduler.states import SUCCESS, JobState, normalize_state

EXIT_JOB_FAILED = 3


@dataclass(frozen=True)
class JobStatus:
    """What `ddpslurm status` shows about one job."""

    job_id: str
    state: JobState
    raw_state: str
    terminal: bool
    exit_code: int | None
    signal: int | None
    requeue_count: int
    nodelist: str | None
    reason: str | None
    elapsed_s: int | None
    source: str
    name: str | None = None
    steps: tuple[StepRecord, ...] = field(default=())
    folder: str | None = None
    #: The controller says the job ended but sacct does not know yet (its steps may be out of date).
    accounting_lags: bool = False
    #: Slurm state of the attempt before the current one (why it was requeued), when sacct knows it.
    previous_state: str | None = None
    #: A failed job's post-mortem (ddpslurm.postmortem.lookup): cause, rank, node, confidence, line, source.
    diagnosis: dict[str, object] | None = None
    #: The job's StdOut as the controller has it (a ddpslurm job's lies in its folder), when it still knows the job.
    stdout: str | None = None

    @property
    def failed(self) -> bool:
        """Ended, and not successfully."""
        return self.terminal and self.state not in SUCCESS

    def to_dict(self) -> dict[str, object]:
        return {
            "job_id": self.job_id, "name": self.name, "state": self.state.value, "slurm_state": self.raw_state,
            "terminal": self.terminal, "exit_code": self.exit_code, "signal": self.signal,
            "requeue_count": self.requeue_count, "nodelist": self.nodelist, "reason": self.reason,
            "elapsed_s": self.elapsed_s, "folder": self.folder, "source": self.source,
            "accounting_lags": self.accounting_lags, "previous_state": self.previous_state,
            "steps": [step_dict(s) for s in self.steps], "diagnosis": self.diagnosis,
        }


def resolve_job(ref: str) -> tuple[str, str | None]:
    """A job id, or a ddpslurm job folder `<root>/job_<jobid>/` -> (job id, folder or None)."""
    text = ref.strip()
    if re.fullmatch(r"\d+(?:_\d+)?", text):
        return text, None
    path = Path(text)
    match = JOB_FOLDER_NAME.match(path.name)
    if match:
        return match.group(1), str(path.resolve()) if path.is_dir() else None
    if path.is_dir():
        ids = sorted({m.group(1) for p in path.iterdir() if (m := SUBMITIT_SUBMISSION_NAME.match(p.name))})
        if len(ids) == 1:
            return ids[0], str(path.resolve())
    if path.exists():
        raise JobNotFoundError(f"cannot tell the job id of {text!r}",
                               f"Give a job id, or a ddpslurm job folder named {job_folder_name(SHOWN_JOB_ID)}")
    raise JobNotFoundError(f"{text!r} is neither a Slurm job id nor an existing job folder",
                           f"Give a job id such as 1234, or a folder such as {DEFAULT_ROOT}/{job_folder_name('1234')}/")


def status_from_accounting(acc: JobAccounting, folder: str | None = None) -> JobStatus:
    """JobStatus from sacct records (pure)."""
    cur = acc.current
    return JobStatus(
        job_id=acc.job_id, state=cur.state, raw_state=cur.raw_state, terminal=cur.terminal,
        exit_code=cur.exit_code, signal=cur.signal, requeue_count=acc.requeue_count, nodelist=cur.nodelist,
        reason=None, elapsed_s=cur.elapsed_s, source="sacct", name=cur.name, steps=cur.steps, folder=folder,
        previous_state=acc.attempts[-2].raw_state if len(acc.attempts) > 1 else None,
    )


def _nodelist(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "None assigned") else value


def status_from_scontrol(job_id: str, record: Mapping[str, str], folder: str | None = None) -> JobStatus:
    """JobStatus from one `scontrol show job` record (pure); no step details there."""
    state, terminal = normalize_state(record.get("JobState", ""))
    exit_code, signal = parse_exit_code(record.get("ExitCode", ""))
    restarts = record.get("Restarts", "0")
    reason = record.get("Reason")
    return JobStatus(
        job_id=job_id, state=state, raw_state=record.get("JobState", ""), terminal=terminal,
        exit_code=exit_code if terminal else None, signal=signal if terminal else None,
        requeue_count=int(restarts) if restarts.isdigit() else 0, nodelist=_nodelist(record.get("NodeList")),
        reason=None if reason in (None, "None") else reason, elapsed_s=parse_elapsed(record.get("RunTime", "")),
        source="scontrol", name=record.get("JobName"), folder=folder,
    )


def _scontrol_records(job_id: str, env: Mapping[str, str] | None) -> list[dict[str, str]]:
    """`scontrol show job` records ([] for a job the controller does not know); an array's id gives one
    record per task, its own (the task that kept the array's id) first."""
    done = run(scontrol_show_job_argv(job_id), env=env, check=False, timeout=30)
    if done.returncode != 0:
        if "invalid job id" in (done.stderr + done.stdout).lower():
            return []
        raise SlurmCommandError(scontrol_show_job_argv(job_id), done.returncode, done.stderr or done.stdout)
    return parse_scontrol_show(done.stdout)


def controller_array_tasks(job_id: str, records: Iterable[Mapping[str, str]]) -> list[str]:
    """The task ids (`123_0`, `123_[2-5]` for tasks still pending together) when the controller's records
    say `job_id` is an array's id, else [] (pure). A task's own id (`124` = `123_0`) is not an array's id."""
    ids = []
    for record in records:
        task = record.get("ArrayTaskId", "")
        if record.get("ArrayJobId") == job_id and task not in ("", "N/A"):
            ids.append((0, int(task), f"{job_id}_{task}") if task.isdigit() else (1, 0, f"{job_id}_[{task}]"))
    return [text for *_, text in sorted(set(ids))]


def merge(sacct: JobStatus, live: JobStatus) -> JobStatus:
    """A job sacct still sees as unfinished: the controller's state (slurmdbd lags behind it), requeue
    count and pending reason, with sacct's steps (pure)."""
    return JobStatus(**{
        **sacct.__dict__, "state": live.state, "raw_state": live.raw_state, "terminal": live.terminal,
        "exit_code": live.exit_code, "signal": live.signal, "nodelist": live.nodelist or sacct.nodelist,
        "elapsed_s": live.elapsed_s if live.elapsed_s is not None else sacct.elapsed_s,
        "requeue_count": max(sacct.requeue_count, live.requeue_count), "reason": live.reason,
        "source": "sacct+scontrol", "accounting_lags": live.terminal,
    })


#: Terminal in sacct for the attempt, but Slurm may have requeued the job: ask the controller too.
MAY_REQUEUE = frozenset({JobState.PREEMPTED, JobState.NODE_FAIL})


def needs_controller(from_sacct: JobStatus | None) -> bool:
    """Whether scontrol must be asked after sacct (pure)."""
    return from_sacct is None or not from_sacct.terminal or from_sacct.state in MAY_REQUEUE


def combine(from_sacct: JobStatus | None, live: JobStatus | None) -> JobStatus | None:
    """One status from what sacct and the controller said (either may be None). Pure."""
    if from_sacct is None or live is None:
        return from_sacct or live
    if from_sacct.terminal and (from_sacct.state not in MAY_REQUEUE or live.terminal):
        return from_sacct
    return merge(from_sacct, live)


def job_status(job_ref: str, *, env: Mapping[str, str] | None = None) -> JobStatus:
    """The status of a job id or job folder: sacct first; scontrol for jobs it does not (yet) know.

    An array's id alone is no job (UsageError naming its tasks). sacct alone cannot always tell: for a
    few seconds after an array's tasks ran, slurmdbd may list the task that kept the array's id as a
    plain job `123` (no `_1`) and not list the other tasks at all. So for a plain id the controller is
    asked too, while it still remembers the job (MinJobAge); if it cannot answer, sacct's word stands.
    The controller's task list wins over sacct's, which may still lack some tasks.
    """
    job_id, folder = resolve_job(job_ref)
    check_job_id(job_id)
    answered = sacct_records(job_id, env=env)
    records = answered or []
    tasks = array_tasks(job_id, records)
    acc = accounting_from_records(job_id, records) if not tasks else None
    from_sacct = status_from_accounting(acc, folder) if acc is not None else None
    controller: list[dict[str, str]] = []
    if needs_controller(from_sacct) or "_" not in job_id:
        try:
            controller = _scontrol_records(job_id, env)
        except (SlurmCommandError, SlurmNotFoundError):
            if needs_controller(from_sacct) and not tasks:
                raise
        tasks = controller_array_tasks(job_id, controller) or tasks
    if tasks:
        shown = ", ".join(tasks[:4]) + (", ..." if len(tasks) > 4 else "")
        raise UsageError(f"job {job_id} is an array job with {len(tasks)} tasks ({shown})",
                         f"Give one task, e.g. `ddpslurm status {tasks[0]}`")
    live = None
    if needs_controller(from_sacct) and controller:
        live = status_from_scontrol(job_id, controller[0], folder)
    status = combine(from_sacct, live)
    if status is None:
        raise JobNotFoundError(f"Slurm knows no job {job_id} (neither sacct nor scontrol)",
                               "Check the id with `squeue --me` or `sacct -X`")
    if from_sacct is None and answered is not None and status.terminal:
        # sacct works but has not heard of the ended job yet (slurmdbd lags): its steps are still to come
        status = JobStatus(**{**status.__dict__, "accounting_lags": True})
    if controller and controller[0].get("StdOut"):
        status = JobStatus(**{**status.__dict__, "stdout": controller[0]["StdOut"]})
    return status


def poll_until_terminal(
    poll: Callable[[], JobStatus],
    *,
    on_update: Callable[[JobStatus], None] = lambda s: None,
    first_interval: float = 1.0,
    factor: float = 1.5,
    max_interval: float = 30.0,
    timeout: float | None = None,
    done: Callable[[JobStatus], bool] = lambda s: s.terminal,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> JobStatus:
    """Call `poll` until `done(status)` (default: terminal) or `timeout` seconds passed (the last status).

    The interval grows from 1 s to 30 s, so a long wait does not hammer slurmctld (submitit#1759).
    """
    start, interval = clock(), first_interval
    while True:
        status = poll()
        on_update(status)
        if done(status) or (timeout is not None and clock() - start >= timeout):
            return status
        sleep(interval)
        interval = min(interval * factor, max_interval)


#: How long `wait_for_job` gives sacct to catch up with a job the controller says has ended.
ACCOUNTING_GRACE_S = 15.0


def wait_for_job(job_ref: str, *, env: Mapping[str, str] | None = None,
                 on_update: Callable[[JobStatus], None] = lambda s: None, timeout: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> JobStatus:
    """`job_status` until the job has ended and sacct knows its steps (or ACCOUNTING_GRACE_S passed)."""
    ended_at: list[float] = []

    def done(status: JobStatus) -> bool:
        if not status.terminal:
            return False
        if not ended_at:
            ended_at.append(clock())
        return not status.accounting_lags or clock() - ended_at[0] >= ACCOUNTING_GRACE_S

    return poll_until_terminal(lambda: job_status(job_ref, env=env), on_update=on_update, timeout=timeout,
                               done=done, clock=clock, sleep=sleep)


def exit_code_for(status: JobStatus, waited: bool) -> int:
    """The exit code of `ddpslurm status` (see the module docstring)."""
    return EXIT_JOB_FAILED if waited and status.failed else 0


def _exit_text(code: int | None, signal: int | None) -> str:
    if code is None:
        return "-"
    return f"{code}" if not signal else f"{code} (signal {signal})"


def progress_line(status: JobStatus) -> str:
    """The first line of `render_text` without the elapsed time: `--wait` prints it when it changes."""
    return render_text(status, with_elapsed=False).splitlines()[0]


def render_text(status: JobStatus, with_elapsed: bool = True) -> str:
    """Plain-text status for a terminal or a log (pure). Every Slurm-given text (job name, reason, states,
    nodes) goes through ddpslurm.sanitize: a job name is chosen by whoever submits and must not drive the
    terminal or forge a line."""
    head = f"job {_t(status.job_id)}" + (f" ({_t(status.name)})" if status.name else "")
    parts = [f"{head}: {_t(status.raw_state or status.state.value.upper())}"]
    if status.terminal:
        parts.append(f"exit {_exit_text(status.exit_code, status.signal)}")
    parts.append(f"requeued {status.requeue_count}x"
                 + (f" (previous attempt {_t(status.previous_state)})" if status.previous_state else ""))
    if status.nodelist:
        parts.append(f"nodes {_t(status.nodelist)}")
    if status.elapsed_s is not None and with_elapsed:
        parts.append(f"elapsed {status.elapsed_s}s")
    if status.reason:
        parts.append(f"reason {_t(status.reason)}")
    lines = ["  ".join(parts)]
    if status.steps:
        lines.append(f"  {'step':<12} {'state':<22} {'exit':<16} nodes")
        for step in status.steps:
            nodes = compress_hostlist(step.nodes) if step.nodes else (step.nodelist or "-")
            lines.append(f"  {_t(step.step_id):<12} {_t(step.raw_state):<22} "
                         f"{_exit_text(step.exit_code, step.signal):<16} {_t(nodes)}")
    if status.folder:
        lines.append(f"folder: {_t(status.folder)}")
    lines += diagnosis_lines(status.diagnosis)
    return "\n".join(lines)


def diagnosis_lines(diagnosis: Mapping[str, object] | None) -> list[str]:
    """The post-mortem's lines of `render_text`: cause, culprit, confidence, and where the report is (pure)."""
    if not diagnosis:
        return []
    rank = diagnosis.get("rank")
    culprit = f"rank {rank}" if rank is not None else "no single rank"
    node = diagnosis.get("node")
    lines = [f"diagnosis: {_t(diagnosis.get('cause'))}  culprit {culprit}"
             + (f" on {_t(node)}" if node else "") + f"  confidence {_t(diagnosis.get('confidence'))}"
             + f"  (from {_t(diagnosis.get('source'))})"]
    if diagnosis.get("summary"):
        lines.append(f"  {_t(diagnosis['summary'])}")
    if diagnosis.get("report"):
        lines.append(f"  report: {_t(diagnosis['report'])}")
    return lines
