"""At a failed job's end, in its batch step: analyze the job folder, write `diagnosis.json` and `diagnosis.md`
there, and put the one-line diagnosis on the job's Slurm record (`record.record_running`).

`ddpslurm.launch.batch` calls `at_job_end` once srun has returned, unless `submit --no-analyze`. It is skipped
when the job succeeded or is being requeued (the next attempt must start at once), bounded by a budget that
ends before the job's time limit, and it never raises: the job's exit status stays srun's.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.postmortem.analysis import DEFAULT_BUDGET_S, run_analysis
from ddpslurm.postmortem.comment import diagnosis_line
from ddpslurm.sanitize import terminal

#: Overrides the analysis budget at the job's end (seconds).
BUDGET_ENV = "DDPSLURM_ANALYZE_BUDGET"
#: Seconds kept free before the job's time limit (Slurm then kills the batch step).
END_MARGIN_S = 10.0


def should_analyze(code: int, requeue: Mapping[str, Any] | None) -> tuple[bool, str]:
    """Whether the job's end calls for a post-mortem, and why (pure): srun failed, or a preemption or time-limit
    signal reached the ranks and the job was not requeued (beyond --max-requeues, or it could not be); never
    while the job is being requeued."""
    if requeue is not None and requeue.get("requeued"):
        return False, "the job is being requeued: the next attempt goes on"
    if code != 0:
        return True, f"srun exited {code}"
    if requeue is not None:
        return True, f"a preemption or time-limit signal ended the job without a requeue ({requeue.get('why_not')})"
    return False, "the job succeeded"


def budget_s(environ: Mapping[str, str], end_time: str | None, now: float) -> float:
    """Seconds for the analysis: $DDPSLURM_ANALYZE_BUDGET or DEFAULT_BUDGET_S, and never past the job's time limit
    less END_MARGIN_S (`end_time` as Slurm prints it, the controller's local time). Pure."""
    try:
        wanted = float(environ.get(BUDGET_ENV, "") or DEFAULT_BUDGET_S)
    except ValueError:
        wanted = DEFAULT_BUDGET_S
    if end_time:
        with contextlib.suppress(ValueError):
            wanted = min(wanted, datetime.fromisoformat(end_time).timestamp() - now - END_MARGIN_S)
    return max(0.0, wanted)


def _read_requeue(attempt_dir: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(jobfolder.requeue_path(attempt_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _say(text: str) -> None:
    print(terminal(f"ddpslurm batch: {text}"), file=sys.stderr, flush=True)


def at_job_end(folder: str, environ: Mapping[str, str], code: int) -> None:
    """The post-mortem of this attempt of the job, when `should_analyze`; never raises."""
    try:
        _at_job_end(folder, environ, code)
    except Exception as error:  # the post-mortem must never change how the job ends
        _say(f"post-mortem skipped: {type(error).__name__}: {error}")


def _at_job_end(folder: str, environ: Mapping[str, str], code: int) -> None:
    from ddpslurm.postmortem.record import record_running, running_job

    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id:
        return
    job_dir = jobfolder.job_folder(folder, job_id)
    attempt = int(environ.get("SLURM_RESTART_COUNT", "0") or 0)
    wanted, why = should_analyze(code, _read_requeue(jobfolder.attempt_folder(job_dir, attempt)))
    if not wanted:
        return
    queued = running_job(job_id)
    budget = budget_s(environ, queued[0] if queued else None, time.time())
    _say(f"post-mortem of job {job_id} ({why}), at most {budget:.0f}s: ddpslurm analyze {job_dir}")
    outcome = run_analysis([job_dir], job_dir, budget)
    if outcome.diagnosis is None:
        _say(f"no diagnosis: {outcome.why_not}")
        return
    line = diagnosis_line(outcome.diagnosis, str(job_dir))
    _say(f"{line}  (see {job_dir / jobfolder.DIAGNOSIS_MD})")
    recorded = record_running(job_id, line, queued[1] if queued else None)
    where = [name for name, key in (("Comment", "comment"), ("AdminComment", "admin_comment")) if recorded[key]]
    if where:
        _say(f"recorded in the job's {' and '.join(where)} (sacct -j {job_id} -o JobID,State,Comment)")
    for reason in recorded["why_not"]:
        _say(f"not recorded: {reason}")
