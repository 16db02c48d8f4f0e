"""In-place restarts (`submit --max-restarts N`, torchrun): their records in the attempt folder, and their summary.

torchrun restarts all workers of the job inside the same Slurm job and attempt. Each node's agent keeps the
files of restart K aside before restart K+1 starts, so the attempt folder's usual names always hold the latest
restart (what `analyze` and the batch step read) and the earlier ones stay whole::

    attempt_<N>/<host>/rank_<R>.log ...     the latest restart (as without restarts)
    attempt_<N>/<host>/restart_<K>/          restart K's rank files (0: the first start) and a copy of its
                                             node_<host>.json (its ranks' start and exit records): read it as
                                             an attempt folder (`jobfolder.read_rank_records`)
    attempt_<N>/<host>/restarts.json         one entry per restart of this node: when, why, which ranks failed

Names and `summary` are pure; `set_aside` and `append_record` touch disk. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder

#: what every rank of a torchrun job gets: the in-place restarts so far in this attempt (the same on every node;
#: torchrun's TORCHELASTIC_RESTART_COUNT counts only the restarts its own node's failures caused)
RESTART_ENV = "DDPSLURM_RESTART_COUNT"
MAX_RESTARTS_ENV = "DDPSLURM_MAX_RESTARTS"
RESTART_PREFIX = jobfolder.RESTART_PREFIX
RECORD_FILE = jobfolder.RESTARTS_FILE
RESTART_NAME = jobfolder.RESTART_NAME
#: what a node's folder holds per rank and restart: the rank files, and the flight recorder's dumps
_RANK_FILE_PREFIXES = (jobfolder.RANK_PREFIX, "nccl_trace_rank_")
WORKER_FAILED = "worker_failed"
MEMBERSHIP_CHANGED = "membership_changed"


def restart_folder(host_dir: Path, restart: int) -> Path:
    """`<attempt>/<host>/restart_<K>/`."""
    return host_dir / f"{RESTART_PREFIX}{restart}"


def record_path(host_dir: Path) -> Path:
    """`<attempt>/<host>/restarts.json`."""
    return host_dir / RECORD_FILE


def set_aside(host_dir: Path, restart: int, node_file: Path | None = None) -> int:
    """Move the rank files of restart `restart` (every `rank_*` and flight-recorder file straight in the node's
    folder) into `restart_<K>/`, with a copy of the node's file (`node_file`: the new workers' agent rewrites it);
    how many files were moved or copied. Called by the node's agent when its workers are stopped."""
    try:
        names = sorted(name for name in os.listdir(host_dir) if name.startswith(_RANK_FILE_PREFIXES))
    except OSError:
        return 0
    target = restart_folder(host_dir, restart)
    moved = 0
    if node_file is not None and node_file.is_file():
        with contextlib.suppress(OSError):
            target.mkdir(exist_ok=True)
            shutil.copyfile(node_file, target / node_file.name)
            moved += 1
    for name in names:
        source = host_dir / name
        if not source.is_file():
            continue
        with contextlib.suppress(OSError):
            target.mkdir(exist_ok=True)
            os.replace(source, target / name)
            moved += 1
    return moved


def read_records(host_dir: Path) -> list[dict[str, Any]]:
    """The node's restart entries (oldest first); [] when it has none or the file is unreadable."""
    data = jobfolder.read_object(record_path(host_dir))
    entries = data.get("restarts") if data is not None else None
    return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def append_record(host_dir: Path, entry: Mapping[str, Any]) -> None:
    """Add one entry to the node's `restarts.json` (only this node's agent writes it)."""
    entries = [*read_records(host_dir), dict(entry)]
    jobfolder.write_json(record_path(host_dir), {"schema": 1, "kind": "restarts", "restarts": entries})


def restart_entry(*, restart: int, max_restarts: int, host: str, reason: str, failed: Sequence[Mapping[str, Any]],
                  moved: int, unix: float | None = None) -> dict[str, Any]:
    """One restart as `restarts.json` keeps it. Pure (given `unix`)."""
    from ddpslurm.launch.records import timestamp

    now = time.time() if unix is None else unix
    return {"restart": restart, "max_restarts": max_restarts, "host": host, "reason": reason,
            "failed": [dict(item) for item in failed], "files_set_aside": moved, "unix": now,
            "time": timestamp(now)}


def latest_attempt(job_dir: Path) -> Path | None:
    """The attempt folder with the highest number, or None."""
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir(job_dir):
            match = jobfolder.ATTEMPT_NAME.fullmatch(name)
            if match:
                found.append((int(match["n"]), job_dir / name))
    return max(found)[1] if found else None


def _world_size(attempt_dir: Path) -> int | None:
    """The world size the newest start records give (the latest restart's), or None."""
    best: tuple[float, int] | None = None
    for record in jobfolder.read_rank_records(attempt_dir, "start").values():
        with contextlib.suppress(KeyError, ValueError, TypeError, AttributeError):
            key = (float(record.get("unix", 0)), int(record["world_size"]))
            best = key if best is None or key > best else best
    return best[1] if best else None


def summary(job_dir: Path) -> dict[str, Any] | None:
    """The latest attempt's in-place restarts: {attempt, restarts, max_restarts, world_size, last_reason,
    below_min} (`below_min`: the earlier attempts that ended below --nodes MIN, `below_min.summary`); None for a
    job folder with no torchrun restart budget recorded, no restart and no such attempt (every other job)."""
    from ddpslurm.launch import below_min

    attempt_dir = latest_attempt(job_dir)
    if attempt_dir is None:
        return None
    entries: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(attempt_dir):
            if entry.is_dir(follow_symlinks=False):
                entries += read_records(Path(entry.path))
    budget = _budget(job_dir)
    below = below_min.summary(job_dir)
    if not entries and not budget and not below:
        return None
    used = max((int(e.get("restart", 0)) for e in entries), default=0)
    # every node records each restart: a failure on one node is the cause, the others followed (membership)
    reasons = {e.get("reason") for e in entries if int(e.get("restart", 0)) == used}
    reason = WORKER_FAILED if WORKER_FAILED in reasons else next(iter(sorted(map(str, reasons))), None)
    return {"attempt": int(jobfolder.ATTEMPT_NAME.fullmatch(attempt_dir.name)["n"]),  # type: ignore[index]
            "restarts": used, "max_restarts": budget, "world_size": _world_size(attempt_dir),
            "last_reason": reason, "below_min": below}


def first_summary(job_dirs: Sequence[Path]) -> dict[str, Any] | None:
    """`summary` of the first of `job_dirs` that has one (where a job's folder may be), or None."""
    for job_dir in job_dirs:
        found = summary(job_dir)
        if found:
            return found
    return None


def _budget(job_dir: Path) -> int:
    """--max-restarts as the job record (`ddpslurm.json`) has it; 0 when absent."""
    record = jobfolder.read_object(jobfolder.job_record_path(job_dir)) or {}
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return int(record.get("spec", {}).get("max_restarts", 0) or 0)
    return 0


def summary_line(found: Mapping[str, Any]) -> str:
    """`status`'s line for `summary(...)`. Pure."""
    world = found.get("world_size")
    reason = found.get("last_reason")
    return (f"restarts in place: {found['restarts']} of {found['max_restarts']} used in attempt {found['attempt']}"
            + (f", last: {str(reason).replace('_', ' ')}" if reason else "")
            + (f"; world size now {world}" if world else "")
            + ("\n" + below_min_line(found["below_min"]) if found.get("below_min") else ""))


def below_min_line(entries: Sequence[Mapping[str, Any]]) -> str:
    """`below_min.summary_line` (no import of it at module level: status starts light)."""
    from ddpslurm.launch.below_min import summary_line as line

    return line(entries)
