"""Parsers for sacct, squeue and scontrol output in the formats `commands.py` asks for. Pure.

A line that does not fit raises SlurmOutputError naming the line, never an IndexError.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpslurm.errors import DdpSlurmError
from ddpslurm.scheduler.commands import SACCT_FIELDS, SQUEUE_FIELDS
from ddpslurm.scheduler.hostlist import expand_hostlist
from ddpslurm.scheduler.states import JobState, normalize_state

_EMPTY = {"", "None", "Unknown", "None assigned", "(null)", "N/A"}
_ELAPSED = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")
_SCONTROL_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][\w/:.()]*)=")


class SlurmOutputError(DdpSlurmError):
    """Slurm printed something ddpslurm cannot read (a version with another output format?)."""


def _bad(tool: str, line: str, why: str) -> SlurmOutputError:
    return SlurmOutputError(f"cannot read {tool} output line {line!r}: {why}",
                            "Report this with your Slurm version (`sinfo --version`)")


def _opt(value: str) -> str | None:
    value = value.strip()
    return None if value in _EMPTY else value


def parse_elapsed(text: str) -> int | None:
    """`1-02:03:04`, `02:03:04`, `03:04`, `0:00` -> seconds; empty/INVALID -> None."""
    match = _ELAPSED.match(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + int(float(seconds))


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct/scontrol `ExitCode=1:0` -> (exit status 1, signal 0); `0:9` -> killed by signal 9."""
    code, sep, sig = text.strip().partition(":")
    if not code.isdigit() or (sep and not sig.isdigit()):
        return None, None
    return int(code), int(sig) if sep else 0


def node_names(nodelist: str | None) -> tuple[str, ...]:
    """The node names of a Slurm nodelist; none for an empty one, a `(reason)` or one that cannot be expanded."""
    if nodelist is None or nodelist.startswith("("):
        return ()
    try:
        return tuple(expand_hostlist(nodelist))
    except DdpSlurmError:
        return ()


@dataclass(frozen=True)
class StepRecord:
    """One sacct step line: `123.batch`, `123.extern`, `123.0`, ..."""

    job_id: str
    step_id: str
    raw_state: str
    state: JobState
    terminal: bool
    exit_code: int | None
    signal: int | None
    elapsed_s: int | None
    nodelist: str | None
    nodes: tuple[str, ...]
    ntasks: int | None
    start: str | None
    end: str | None
    name: str


@dataclass(frozen=True)
class JobRecord:
    """One sacct job line (one attempt of the job) with the step lines that follow it."""

    job_id: str
    job_id_raw: str
    raw_state: str
    state: JobState
    terminal: bool
    exit_code: int | None
    signal: int | None
    elapsed_s: int | None
    nodelist: str | None
    nodes: tuple[str, ...]
    nnodes: int | None
    start: str | None
    end: str | None
    submit: str | None
    partition: str | None
    name: str
    steps: tuple[StepRecord, ...] = field(default=())


def _int_or_none(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def parse_sacct(text: str, fields: Sequence[str] = SACCT_FIELDS) -> list[JobRecord]:
    """`sacct --parsable2 --noheader --format=<SACCT_FIELDS>` output -> job records, steps attached.

    With `--duplicates` a requeued job gives one JobRecord per attempt, in sacct's order.
    """
    jobs: list[JobRecord] = []
    steps: list[StepRecord] = []

    def close() -> None:
        if jobs and steps:
            jobs[-1] = JobRecord(**{**jobs[-1].__dict__, "steps": (*jobs[-1].steps, *steps)})
        steps.clear()

    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", len(fields) - 1)
        if len(parts) != len(fields):
            raise _bad("sacct", line, f"expected {len(fields)} |-separated fields, found {len(parts)}")
        row = dict(zip(fields, parts, strict=True))
        job_field = row["JobID"].strip()
        state, terminal = normalize_state(row["State"])
        exit_code, signal = parse_exit_code(row["ExitCode"])
        nodelist = _opt(row.get("NodeList", ""))
        common = {
            "raw_state": row["State"].strip(), "state": state, "terminal": terminal, "exit_code": exit_code,
            "signal": signal, "elapsed_s": parse_elapsed(row.get("Elapsed", "")), "nodelist": nodelist,
            "nodes": node_names(nodelist), "start": _opt(row.get("Start", "")), "end": _opt(row.get("End", "")),
            "name": row.get("JobName", ""),
        }
        if "." in job_field:
            job_id, step_id = job_field.split(".", 1)
            if not jobs or jobs[-1].job_id != job_id:
                raise _bad("sacct", line, f"step of job {job_id} before any line of that job")
            steps.append(StepRecord(job_id=job_id, step_id=step_id, ntasks=_int_or_none(row.get("NTasks", "")),
                                    **common))
            continue
        close()
        jobs.append(JobRecord(
            job_id=job_field, job_id_raw=row.get("JobIDRaw", job_field).strip(),
            nnodes=_int_or_none(row.get("NNodes", "")), submit=_opt(row.get("Submit", "")),
            partition=_opt(row.get("Partition", "")), **common,
        ))
    close()
    return jobs


@dataclass(frozen=True)
class QueueRecord:
    """One squeue line."""

    job_id: str
    raw_state: str
    state: JobState
    terminal: bool
    reason: str | None
    elapsed_s: int | None
    nnodes: int | None
    nodelist: str | None
    nodes: tuple[str, ...]
    name: str


def parse_squeue(text: str) -> list[QueueRecord]:
    """`squeue --noheader --format=<SQUEUE_FORMAT>` output -> records."""
    out: list[QueueRecord] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(parts) != len(SQUEUE_FIELDS):
            raise _bad("squeue", line, f"expected {len(SQUEUE_FIELDS)} |-separated fields, found {len(parts)}")
        row = dict(zip(SQUEUE_FIELDS, parts, strict=True))
        state, terminal = normalize_state(row["State"])
        nodelist = _opt(row["NodeList"])
        out.append(QueueRecord(
            job_id=row["JobID"].strip(), raw_state=row["State"].strip(), state=state, terminal=terminal,
            reason=_opt(row["Reason"]), elapsed_s=parse_elapsed(row["Elapsed"]), nnodes=_int_or_none(row["NNodes"]),
            nodelist=nodelist, nodes=node_names(nodelist), name=row["JobName"],
        ))
    return out


def parse_scontrol_show(text: str) -> list[dict[str, str]]:
    """`scontrol show job` text -> one dict per record (records are separated by blank lines).

    Values may contain blanks (`Reason=...`, `Command=...`): a value runs until the next ` Key=`.
    """
    records: list[dict[str, str]] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        flat = " ".join(line.strip() for line in block.splitlines() if line.strip())
        if not flat:
            continue
        keys = list(_SCONTROL_KEY.finditer(flat))
        if not keys or keys[0].start() != 0:
            raise _bad("scontrol", flat[:80], "expected Key=Value pairs")
        record: dict[str, str] = {}
        for here, after in zip(keys, [*keys[1:], None], strict=True):
            end = after.start() if after is not None else len(flat)
            record[here.group(1)] = flat[here.end():end].strip()
        records.append(record)
    return records
