"""The one-line diagnosis put on the job's record through Slurm's own interfaces; never raises.

While the job runs (the batch step): `scontrol update JobId=J Comment=...`, which the job's owner may do, and
AdminComment too when this runs as root (slurmctld lets only SlurmUser and root set it). After the job ended
(the site epilog): `scontrol update` refuses a finished job, so `sacctmgr modify job` sets both in slurmdbd,
once slurmdbd has the job's end (else the end record, carrying the old Comment, would come after ours).
With `AccountingStoreFlags=job_comment` in slurm.conf the Comment reaches `sacct -o Comment`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ddpslurm.errors import DdpSlurmError
from ddpslurm.postmortem.comment import merge_comment, own_part
from ddpslurm.scheduler.commands import (
    SACCT_COMMENT_DELIMITER,
    sacct_argv,
    sacctmgr_modify_job_argv,
    scontrol_update_comment_argv,
    squeue_comment_argv,
)
from ddpslurm.scheduler.run import run

#: sacct states after which slurmdbd has the job's end (its Comment can be set for good).
ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "TIMEOUT", "REQUEUED")


def _first_line(error: Exception) -> str:
    text = error.one_line() if isinstance(error, DdpSlurmError) else str(error)
    return (text.splitlines() or [type(error).__name__])[0][:300]


def running_job(job_id: str) -> tuple[str | None, str] | None:
    """(EndTime as Slurm prints it or None, the exact Comment) of a job in the queue; None when not known."""
    try:
        out = run(squeue_comment_argv(job_id), timeout=20).stdout
    except (DdpSlurmError, OSError):
        return None
    line = out.splitlines()[0] if out.strip() else ""
    if "|" not in line:
        return None
    end, _, comment = line.partition("|")
    return (None if end in ("N/A", "Unknown", "NONE", "") else end), ("" if comment == "(null)" else comment)


def record_running(job_id: str, line: str, existing: str | None, admin: bool | None = None) -> dict[str, Any]:
    """Put `line` in the Comment of a running job, the user's own comment kept (and in AdminComment as root)."""
    outcome: dict[str, Any] = {"comment": None, "admin_comment": None, "why_not": []}
    merged = merge_comment(existing, line)
    if merged is None:
        outcome["why_not"].append("the job's own Comment leaves no room within Slurm's 1024 characters")
    else:
        try:
            run(scontrol_update_comment_argv(job_id, merged), timeout=20)
            outcome["comment"] = merged
        except (DdpSlurmError, OSError) as error:
            outcome["why_not"].append(f"Comment: {_first_line(error)}")
    if admin if admin is not None else os.geteuid() == 0:
        try:
            run(scontrol_update_comment_argv(job_id, line, admin=True), timeout=20)
            outcome["admin_comment"] = line
        except (DdpSlurmError, OSError) as error:
            outcome["why_not"].append(f"AdminComment: {_first_line(error)}")
    return outcome


def accounting_comment(job_id: str) -> tuple[str, str, str] | None:
    """(State, AdminComment, Comment) of a job as slurmdbd has it; None when sacct cannot tell."""
    argv = [*sacct_argv(job_id, ("State", "AdminComment", "Comment"), duplicates=False), "-X",
            f"--delimiter={SACCT_COMMENT_DELIMITER}"]
    try:
        out = run(argv, timeout=30).stdout
    except (DdpSlurmError, OSError):
        return None
    rows = [r.split(SACCT_COMMENT_DELIMITER, 2) for r in out.splitlines() if r.count(SACCT_COMMENT_DELIMITER) >= 2]
    return (rows[-1][0], rows[-1][1], rows[-1][2]) if rows else None


def record_finished(job_id: str, line: str, existing: str | None, admin: bool = True, wait_s: float = 45,
                    sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Put `line` on a finished job's accounting record (`sacctmgr modify job`): Comment, the user's comment kept,
    and AdminComment when `admin`; waits up to `wait_s` for slurmdbd to have the job's end, and checks."""
    outcome: dict[str, Any] = {"comment": None, "admin_comment": None, "why_not": []}
    deadline = time.monotonic() + wait_s
    known = accounting_comment(job_id)
    while (known is None or known[0].split()[0] not in ENDED) and time.monotonic() < deadline:
        sleep(2)
        known = accounting_comment(job_id)
    if known is None or known[0].split()[0] not in ENDED:
        outcome["why_not"].append(f"slurmdbd has not recorded the job's end within {wait_s:g}s")
        return outcome
    user_part, ours = own_part(known[2] or existing or "")
    if ours:  # ddpslurm's batch step (or an earlier run) already recorded it
        outcome["why_not"].append("the job's Comment already holds a ddpslurm diagnosis")
        return outcome
    merged = merge_comment(user_part, line)
    if merged is None:
        outcome["why_not"].append("the job's own Comment leaves no room within Slurm's 1024 characters")
    for with_admin in ((True, False) if admin else (False,)):
        try:
            run(sacctmgr_modify_job_argv(job_id, comment=merged, admin_comment=line if with_admin else None),
                timeout=30)
            outcome.update(comment=merged, admin_comment=line if with_admin else None)
            break
        except (DdpSlurmError, OSError) as error:  # AdminComment refused (not an operator): the Comment alone
            outcome["why_not"].append(_first_line(error))
    return outcome
