"""argv builders for the Slurm commands ddpslurm runs. Pure: they only build lists of strings.

Output formats are pinned here and read back by `parse.py`: `|`-separated, no header, and the one
field that may contain `|` (the job name) last, so a parser can split with a maximum count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ddpslurm.errors import UsageError

#: sacct fields, in the order `parse.parse_sacct` reads them (JobName last: it may contain `|`).
SACCT_FIELDS: tuple[str, ...] = (
    "JobID", "JobIDRaw", "State", "ExitCode", "Elapsed", "NNodes", "NTasks", "NodeList",
    "Start", "End", "Submit", "Partition", "JobName",
)
#: squeue --format codes: job id, long state, reason, time used, node count, nodelist, name (last).
SQUEUE_FORMAT = "%i|%T|%r|%M|%D|%N|%j"
SQUEUE_FIELDS: tuple[str, ...] = ("JobID", "State", "Reason", "Elapsed", "NNodes", "NodeList", "JobName")
#: sinfo --format codes: partition, availability, node count, node state, nodelist.
SINFO_FORMAT = "%P|%a|%D|%T|%N"

_JOB_ID = re.compile(r"^\d+(?:_\d+|_\[[\d,%\-]+\])?(?:\+\d+)?(?:\.(?:\d+|batch|extern|interactive))?$")
_SIGNAL = re.compile(r"^(?:SIG)?[A-Z0-9]+$|^\d+$")


def check_job_id(job_id: str | int) -> str:
    """A job id as Slurm writes it (`123`, `123_4`, `123+1`, `123.0`), or a UsageError."""
    text = str(job_id).strip()
    if not _JOB_ID.match(text):
        raise UsageError(f"{job_id!r} is not a Slurm job id",
                         "Give a number such as 1234 (array task: 1234_5), or a ddpslurm job folder")
    return text


def _job_ids(job_ids: str | int | Iterable[str | int]) -> list[str]:
    ids = [job_ids] if isinstance(job_ids, str | int) else list(job_ids)
    if not ids:
        raise UsageError("no job id given", "Give at least one Slurm job id")
    return [check_job_id(j) for j in ids]


def sacct_argv(job_ids: str | int | Iterable[str | int], fields: Sequence[str] = SACCT_FIELDS,
               duplicates: bool = True) -> list[str]:
    """sacct for some jobs, every step, machine-readable; `--duplicates` keeps requeued attempts."""
    argv = ["sacct", "--parsable2", "--noheader", f"--format={','.join(fields)}",
            f"--jobs={','.join(_job_ids(job_ids))}"]
    if duplicates:
        argv.append("--duplicates")
    return argv


def squeue_argv(job_ids: str | int | Iterable[str | int] | None = None, user: str | None = None) -> list[str]:
    """squeue with a fixed `|` format, no header; every state, so finishing jobs show too."""
    argv = ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}", "--states=all"]
    if job_ids is not None:
        argv.append(f"--jobs={','.join(_job_ids(job_ids))}")
    if user is not None:
        argv.append(f"--user={user}")
    return argv


def scontrol_show_job_argv(job_id: str | int) -> list[str]:
    """`scontrol show job` for one job (key=value text; `--details` adds per-node lines)."""
    return ["scontrol", "show", "job", check_job_id(job_id)]


def scontrol_show_partition_argv(partition: str) -> list[str]:
    """`scontrol show partition NAME` (key=value text: GraceTime, PreemptMode, ...)."""
    name = partition.strip()
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise UsageError(f"{partition!r} is not a Slurm partition name", "Give a name as `sinfo -s` lists it")
    return ["scontrol", "show", "partition", name]


def scontrol_requeue_argv(job_id: str | int, hold: bool = False) -> list[str]:
    """Requeue a job (the job must have been submitted requeueable)."""
    return ["scontrol", "requeuehold" if hold else "requeue", check_job_id(job_id)]


def scancel_argv(job_id: str | int, signal: str | int | None = None, batch: bool = False) -> list[str]:
    """Cancel a job, or only send it `signal` (`batch`: to the batch shell as well, as `--full`)."""
    argv = ["scancel"]
    if signal is not None:
        text = str(signal).strip().upper()
        if not _SIGNAL.match(text):
            raise UsageError(f"{signal!r} is not a signal name or number", "Give e.g. USR2, SIGTERM or 15")
        argv.append(f"--signal={text}")
        if batch:
            argv.append("--full")
    return [*argv, check_job_id(job_id)]


def sinfo_argv(partition: str | None = None) -> list[str]:
    """sinfo with a fixed `|` format, no header."""
    argv = ["sinfo", "--noheader", f"--format={SINFO_FORMAT}"]
    if partition is not None:
        argv.append(f"--partition={partition}")
    return argv


#: `squeue` format of the running job's end time and Comment (the Comment last: it may contain `|`).
SQUEUE_COMMENT_FORMAT = "%e|%k"


def squeue_comment_argv(job_id: str | int) -> list[str]:
    """The job's EndTime and exact Comment (`scontrol show job` cannot tell a blank in a Comment from its next
    key), one line."""
    return ["squeue", "--noheader", f"--jobs={check_job_id(job_id)}", f"--format={SQUEUE_COMMENT_FORMAT}"]


def _one_line_value(name: str, value: str) -> str:
    if any(ch in value for ch in "\n\r\x00"):
        raise UsageError(f"a {name} holds a line break", "Give a single line")
    return value


def scontrol_update_comment_argv(job_id: str | int, comment: str, admin: bool = False) -> list[str]:
    """Set a job's Comment (its owner may, while it runs) or AdminComment (SlurmUser or root only). The value is
    one argv word: nothing is parsed by a shell."""
    key = "AdminComment" if admin else "Comment"
    return ["scontrol", "update", f"JobId={check_job_id(job_id)}", f"{key}={_one_line_value(key, comment)}"]


def sacctmgr_modify_job_argv(job_id: str | int, comment: str | None = None,
                             admin_comment: str | None = None) -> list[str]:
    """Set a finished job's Comment and/or AdminComment in slurmdbd (`sacctmgr modify job`; `scontrol update`
    refuses a finished job). `--immediate`: no confirmation prompt."""
    values = [f"Comment={_one_line_value('Comment', comment)}"] if comment is not None else []
    if admin_comment is not None:
        values.append(f"AdminComment={_one_line_value('AdminComment', admin_comment)}")
    if not values:
        raise UsageError("nothing to set on the job", "Give a comment or an admin comment")
    return ["sacctmgr", "--immediate", "modify", "job", "where", f"JobID={check_job_id(job_id)}", "set", *values]


#: `sacct` fields `triage --sacct` reads, in order; the two free-text ones last.
SACCT_COMMENT_FIELDS: tuple[str, ...] = ("JobID", "State", "ExitCode", "NodeList", "User", "Partition", "End",
                                         "AdminComment", "Comment")
#: A field separator no Comment written by ddpslurm (and hardly any person) holds: ASCII's unit separator.
SACCT_COMMENT_DELIMITER = "\x1f"


def sacct_comments_argv(since: str, until: str = "now", user: str | None = None) -> list[str]:
    """Every job (allocations only, `-X`) that ended between `since` and `until`, of one user or of all, with
    the fields of SACCT_COMMENT_FIELDS split by SACCT_COMMENT_DELIMITER."""
    for name, value in (("since", since), ("until", until)):
        if not re.fullmatch(r"[0-9A-Za-z:+\-T]+", value):
            raise UsageError(f"--{name} {value!r} is not a time sacct takes",
                             "Give e.g. 2026-01-31, 2026-01-31T08:00, now-7days")
    who = [f"--user={user}"] if user else ["--allusers"]
    if user and not re.fullmatch(r"[A-Za-z0-9_.\-]+", user):
        raise UsageError(f"--user {user!r} is not a user name", "Give a login name such as alice")
    return ["sacct", "--parsable2", "--noheader", f"--delimiter={SACCT_COMMENT_DELIMITER}", "-X", *who,
            f"--starttime={since}", f"--endtime={until}", "--state=BF,CA,DL,F,NF,OOM,PR,TO",
            f"--format={','.join(SACCT_COMMENT_FIELDS)}"]
