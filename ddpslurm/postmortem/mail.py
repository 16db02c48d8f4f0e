"""`ddpslurm mailprog`: slurm.conf's MailProg that puts the one-line diagnosis into a failed job's mail.

slurmctld runs MailProg as `MailProg -s SUBJECT USER` (agent.c), the body empty, with the job's facts in
SLURM_JOB_* variables (SLURM_JOB_ID, SLURM_JOB_STATE, SLURM_JOB_MAIL_TYPE, SLURM_JOB_COMMENT on Slurm versions
that pass it). For a job that did not complete, the diagnosis is the ddpslurm line of the job's Comment (the
batch step of a `ddpslurm submit` job sets it before the job ends), else the one the site epilog records in
accounting moments after the end (looked for in sacct until a deadline). The mail then goes on to the real mail
program with the diagnosis in its body and the cause in its subject. The mail is never lost: whatever fails here,
the original message is still handed on, and slurmctld's own time limit on MailProg is never reached.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpslurm.postmortem.comment import MARK, clean, parse_line

#: slurmctld kills MailProg after this many seconds (agent.c MAIL_PROG_TIMEOUT): the mail must be out before.
SLURM_MAIL_TIMEOUT_S = 120
#: Seconds kept for handing the mail on, of SLURM_MAIL_TIMEOUT_S.
DELIVERY_RESERVE_S = 30
#: Job states (SLURM_JOB_STATE, job_state_string) after which there is nothing to diagnose.
SUCCEEDED = ("COMPLETED",)
#: Mail types (SLURM_JOB_MAIL_TYPE, agent.c _mail_type_str) sent at a job's end.
END_MAIL_TYPES = ("Ended", "Failed", "Reached time limit", "Requeued")


@dataclass(frozen=True)
class Mail:
    """What slurmctld asked to send: `-s SUBJECT RECIPIENT...`, the body (empty from slurmctld) on stdin."""

    subject: str
    recipients: tuple[str, ...]
    body: str = ""


def parse_mail_argv(argv: Sequence[str], body: str = "") -> Mail | None:
    """`-s SUBJECT RECIPIENT...` (what slurmctld passes) as a Mail; None for anything else. Pure."""
    args = list(argv)
    if len(args) < 3 or args[0] != "-s":
        return None
    return Mail(args[1], tuple(args[2:]), body)


def wants_diagnosis(environ: Mapping[str, str]) -> bool:
    """Whether this mail is about a job that ended without completing (only those have a diagnosis). Pure."""
    state = environ.get("SLURM_JOB_STATE", "").strip().upper()
    mail_type = environ.get("SLURM_JOB_MAIL_TYPE", "").strip()
    return bool(environ.get("SLURM_JOB_ID")) and mail_type in END_MAIL_TYPES and state not in ("", *SUCCEEDED)


def diagnosis_in(comment: str | None) -> dict[str, Any] | None:
    """ddpslurm's diagnosis in a Comment or AdminComment, as parse_line reads it; None when it holds none."""
    return parse_line(comment) if comment and MARK in comment else None


def find_diagnosis(job_id: str, environ: Mapping[str, str], lookup: Callable[[str], tuple[str, str, str] | None],
                   wait_s: float, sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> tuple[dict[str, Any] | None, str]:
    """(the diagnosis, where it was found) from the job's Comment as slurmctld passed it, else from accounting
    (`lookup(job_id)` -> (State, AdminComment, Comment), AdminComment first: only an operator writes it),
    asked again every few seconds for up to `wait_s`; (None, why) when none came."""
    found = diagnosis_in(environ.get("SLURM_JOB_COMMENT"))
    if found:
        return found, "the job's Comment"
    deadline = clock() + max(0.0, wait_s)
    while True:
        known = lookup(job_id)
        if known is not None:
            for where, text in (("AdminComment", known[1]), ("Comment", known[2])):
                found = diagnosis_in(text)
                if found:
                    return found, f"accounting ({where})"
        if clock() >= deadline:
            return None, f"no diagnosis was recorded within {wait_s:g} s of the job's end"
        sleep(min(3.0, max(0.1, deadline - clock())))


def _culprit(found: Mapping[str, Any]) -> str:
    rank, node = found.get("rank"), found.get("node")
    if rank is not None and node:
        return f"rank {rank} on {node}"
    if rank is not None:
        return f"rank {rank}"
    if node:
        return f"a rank on {node}"
    return "no single rank"


def with_diagnosis(mail: Mail, job_id: str, found: Mapping[str, Any] | None, why: str) -> Mail:
    """The mail with the diagnosis in its body (and its cause in the subject); without one, a line saying where
    to look later. Log text never reaches the mail: only the recorded line's cleaned fields. Pure."""
    lines = [mail.body.rstrip("\n")] if mail.body.strip() else []
    if found:
        cause = clean(found.get("cause"), 80)
        lines += [f"ddpslurm diagnosis: {cause}, {_culprit(found)} (confidence {clean(found.get('confidence'), 20)})."]
        where = clean(found.get("where") or "", 600)
        if where:
            lines.append(f"The evidence: ddpslurm analyze {where}")
        lines.append(f"Status and culprit: ddpslurm status {job_id}")
        subject = f"{mail.subject} [ddpslurm: {cause}]"
    else:
        lines += [f"ddpslurm: {clean(why, 200)}.",
                  f"Look again later with: ddpslurm status {job_id}  (or: sacct -j {job_id} -o JobID,State,Comment)"]
        subject = mail.subject
    return Mail(subject, mail.recipients, "\n".join(lines) + "\n")


def deliver(program: Sequence[str], mail: Mail, timeout_s: float,
            runner: Callable[..., Any] | None = None) -> int:
    """Hand `mail` to the real mail program (`PROGRAM -s SUBJECT RECIPIENT...`, body on stdin); its exit status,
    or 1 when it could not be started or did not finish in time."""
    if runner is None:
        from ddpslurm.scheduler.run import run_program as runner
    try:
        done = runner([*program, "-s", mail.subject, *mail.recipients], timeout=timeout_s, input=mail.body)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 1
    return int(done.returncode)


def log_record(log: str | None, record: Mapping[str, Any]) -> None:
    """One JSON line appended to `log`; a log that cannot be written is given up quietly."""
    if not log:
        return
    try:
        with open(log, "a", encoding="utf-8") as out:
            out.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}, default=str) + "\n")
    except OSError:
        pass


def run_mailprog(argv: Sequence[str], body: str, *, environ: Mapping[str, str], program: Sequence[str],
                 wait_s: float, log: str | None,
                 lookup: Callable[[str], tuple[str, str, str] | None] | None = None) -> int:
    """The hook: the mail, with the diagnosis where the job failed, handed to `program`; its exit status."""
    started = time.monotonic()
    mail = parse_mail_argv(argv, body)
    if mail is None:  # not slurmctld's call: hand it on untouched
        return _pass_through(program, argv, body)
    job_id = environ.get("SLURM_JOB_ID", "")
    outgoing, record = mail, {"job_id": job_id, "outcome": "passed on"}
    try:
        if wants_diagnosis(environ):
            if lookup is None:
                from ddpslurm.postmortem.record import accounting_comment as lookup
            budget = min(wait_s, SLURM_MAIL_TIMEOUT_S - DELIVERY_RESERVE_S)
            found, why = find_diagnosis(job_id, environ, lookup, budget)
            outgoing = with_diagnosis(mail, job_id, found, why)
            record = {"job_id": job_id, "outcome": "diagnosed" if found else "no diagnosis", "why": why,
                      "cause": (found or {}).get("cause")}
    except Exception as error:  # never lose the mail: the original goes on
        outgoing, record = mail, {"job_id": job_id, "outcome": "error", "why": f"{type(error).__name__}: {error}"}
    left = SLURM_MAIL_TIMEOUT_S - 5 - (time.monotonic() - started)
    code = deliver(program, outgoing, max(5.0, left))
    log_record(log, {**record, "delivered": code == 0, "seconds": round(time.monotonic() - started, 2)})
    return code


def _pass_through(program: Sequence[str], argv: Sequence[str], body: str) -> int:
    from ddpslurm.scheduler.run import run_program

    try:
        return int(run_program([*program, *argv], timeout=SLURM_MAIL_TIMEOUT_S - 5, input=body).returncode)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 1
