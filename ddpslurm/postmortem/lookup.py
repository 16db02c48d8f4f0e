"""Where `ddpslurm status` finds a failed job's post-mortem: `diagnosis.json` in its folder, else the one-line
diagnosis on its Slurm record (Comment / AdminComment, which need no shared file system)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddpslurm.jobfolder import DEFAULT_ROOT, DIAGNOSIS_JSON, DIAGNOSIS_MD, job_folder_name
from ddpslurm.postmortem.comment import MARK, diagnosis_line, parse_line
from ddpslurm.scheduler.status import JobStatus


def summary_of(diagnosis: Mapping[str, Any], folder: Path | None) -> dict[str, Any]:
    """What status shows of an `analyze --json` object (pure)."""
    line = diagnosis_line(diagnosis, str(folder) if folder else "")
    return {"cause": diagnosis.get("cause"), "rank": diagnosis.get("first_failing_rank"),
            "node": diagnosis.get("first_failing_host"), "confidence": diagnosis.get("confidence"),
            "summary": diagnosis.get("summary"), "line": line, "source": "diagnosis.json",
            "report": str(folder / DIAGNOSIS_MD) if folder else None}


def from_folder(folder: Path) -> dict[str, Any] | None:
    """The post-mortem in a job folder, None when there is none (or it cannot be read)."""
    try:
        found = json.loads((folder / DIAGNOSIS_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary_of(found, folder) if isinstance(found, dict) else None


def from_comments(admin_comment: str, comment: str) -> dict[str, Any] | None:
    """The one-line diagnosis from a job's AdminComment (set by root or SlurmUser: a user cannot forge it), else
    its Comment (pure)."""
    for source, text in (("AdminComment", admin_comment), ("Comment", comment)):
        found = parse_line(text)
        if found:
            return {**found, "summary": None, "line": text[text.find(MARK):], "source": source, "report": None}
    return None


def job_folders(job_id: str, folder: str | None, stdout: str | None) -> list[Path]:
    """Where a job's folder may be (pure): the one given, the folder of its StdOut when that is a ddpslurm job
    folder (`<root>/job_<id>/<id>_0_log.out`), and ./ddpslurm_jobs/job_<id>."""
    found = [Path(folder)] if folder else []
    if stdout and Path(stdout).parent.name == job_folder_name(job_id):
        found.append(Path(stdout).parent)
    return [*found, Path(DEFAULT_ROOT) / job_folder_name(job_id)]


def with_diagnosis(status: JobStatus) -> JobStatus:
    """`status` with the post-mortem of a failed job (unchanged for any other)."""
    if not status.failed:
        return status
    found = find_diagnosis(status.job_id, job_folders(status.job_id, status.folder, status.stdout))
    return replace(status, diagnosis=found)


def find_diagnosis(job_id: str, folders: list[Path]) -> dict[str, Any] | None:
    """The post-mortem of a job: the first folder with a diagnosis.json, else its Slurm record (one sacct call)."""
    for folder in folders:
        found = from_folder(folder)
        if found:
            return found
    from ddpslurm.postmortem.record import accounting_comment

    known = accounting_comment(job_id)
    return from_comments(known[1], known[2]) if known else None
