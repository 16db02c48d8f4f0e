"""`ddpslurm status` for a `submit --local` job: Slurm never heard of it, its folder says everything.

The job id of a local job is the pid of submitit's local controller; the job record says `executor:
local`, and every rank leaves a start and an exit record (`ddpslurm.jobfolder`). The state is read from
those records and from whether the controller still runs.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.scheduler.states import JobState
from ddpslurm.scheduler.status import JobStatus, poll_until_terminal


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def local_job_folder(ref: str, root: str = jobfolder.DEFAULT_ROOT) -> Path | None:
    """The folder of the `--local` job `ref` names (its folder, or its id under ./`root`), else None."""
    text = ref.strip()
    folder = jobfolder.job_folder(root, text) if re.fullmatch(r"[0-9]+", text) else Path(text)
    record = _read(jobfolder.job_record_path(folder))
    return folder.resolve() if record is not None and record.get("executor") == "local" else None


def _controller_alive(pid: int) -> bool:
    """Whether submitit's local controller `pid` still runs (a reused pid running something else does not)."""
    from ddpslurm.launch.node_live import pid_exists

    if not pid_exists(pid):
        return False
    try:
        return b"submitit" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc to ask: the pid exists


def status_from_records(job: Mapping[str, Any], exits: list[dict[str, Any] | None],
                        starts: list[dict[str, Any] | None], alive: bool, now: float) -> JobStatus:
    """A local job's status from its job record, its ranks' exit and start records, and whether its
    controller runs (pure)."""
    codes = [int(e.get("exit_code", 1)) if e is not None else None for e in exits]
    hosts = sorted({str(s["host"]) for s in starts if s is not None and s.get("host")})
    reason = None
    if all(code is not None for code in codes):
        failed = next((code for code in codes if code), 0)
        state, exit_code = (JobState.FAILED, failed) if failed else (JobState.COMPLETED, 0)
        ended = max(float(e.get("unix", now)) for e in exits if e is not None) if exits else now
    elif alive:
        state, exit_code, ended = JobState.RUNNING, None, now
    else:
        state, exit_code, ended = JobState.FAILED, None, now
        missing = [rank for rank, code in enumerate(codes) if code is None]
        reason = f"rank(s) {', '.join(map(str, missing[:8]))} ended without an exit record (killed?)"
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    submitted = job.get("submit_unix")
    return JobStatus(
        job_id=str(job.get("job_id", "?")), state=state, raw_state=state.value.upper(),
        terminal=state is not JobState.RUNNING, exit_code=exit_code, signal=None, requeue_count=0,
        nodelist=",".join(hosts) or None, reason=reason,
        elapsed_s=int(ended - float(submitted)) if isinstance(submitted, int | float) else None,
        source="local", name=spec.get("job_name"), folder=str(job.get("folder")) if job.get("folder") else None,
    )


def local_status(folder: Path, now: Callable[[], float] = time.time) -> JobStatus:
    """The status of the `--local` job in `folder` (see `local_job_folder`)."""
    job = dict(_read(jobfolder.job_record_path(folder)) or {})
    job["folder"] = str(folder)
    world = int(job.get("world_size") or 1)
    attempt = jobfolder.attempt_folder(folder, 0)
    found_exits = jobfolder.read_rank_records(attempt, "exit")  # the node files, the ranks' own files, older layouts
    found_starts = jobfolder.read_rank_records(attempt, "start")
    exits = [found_exits.get(rank) for rank in range(world)]
    starts = [found_starts.get(rank) for rank in range(world)]
    pid = str(job.get("job_id", ""))
    alive = pid.isdigit() and _controller_alive(int(pid))
    return status_from_records(job, exits, starts, alive, now())


def wait_local_job(folder: Path, on_update: Callable[[JobStatus], None] = lambda s: None) -> JobStatus:
    """`status --wait` for a `--local` job: its status until it has ended (the intervals of `status --wait`)."""
    return poll_until_terminal(lambda: local_status(folder), on_update=on_update)
