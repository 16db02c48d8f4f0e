"""Per-rank start and exit records, and the job folder layout they live in.

Layout (a contract with `ddpslurm analyze`):
`<folder>/job_<jobid>/attempt_<N>/rank_<R>.{log,start.json,exit.json,signal.json}`, `attempt_<N>/requeue.json`
(the batch step's requeue), with --hang-timeout `rank_<R>.{heartbeat.json,stacks.txt}` and `hang.json`,
`ddpslurm.json`, `checkpoints/`.
The builders are pure; `write_json` writes atomically (temporary file + rename).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA = 1
STATUSES = ("ok", "exception", "exit", "signal", "preempted", "hang")
#: Variables copied into the start record (prefixes), so a post-mortem sees the transport settings.
RECORDED_ENV_PREFIXES = ("NCCL_", "TORCH_", "GLOO_")
#: Single variables copied too: which GPUs Slurm gave the rank and bound it to.
RECORDED_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
                      "SLURM_GPUS_PER_TASK")


def job_folder(root: str | os.PathLike[str], job_id: str) -> Path:
    return Path(root) / f"job_{job_id}"


def attempt_folder(job_dir: Path, attempt: int) -> Path:
    return job_dir / f"attempt_{attempt}"


def rank_paths(attempt_dir: Path, rank: int) -> dict[str, Path]:
    """The log, start, exit and first-signal record paths of one rank in one attempt."""
    base = attempt_dir / f"rank_{rank}"
    return {"log": Path(f"{base}.log"), "start": Path(f"{base}.start.json"), "exit": Path(f"{base}.exit.json"),
            "signal": Path(f"{base}.signal.json")}


def timestamp(unix: float) -> str:
    """ISO 8601 UTC with microseconds: `2026-11-22T17:45:01.123456+00:00`."""
    return datetime.fromtimestamp(unix, tz=timezone.utc).isoformat(timespec="microseconds")


def selected_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The NCCL_*/TORCH_*/GLOO_* variables and the GPU binding ones of `environ`, sorted."""
    return {k: environ[k] for k in sorted(environ) if k.startswith(RECORDED_ENV_PREFIXES) or k in RECORDED_ENV_NAMES}


def start_record(*, rank: int, local_rank: int, node_rank: int, world_size: int, local_world_size: int,
                 host: str, pid: int, job_id: str, step_id: str | None, attempt: int, launcher: str,
                 master_addr: str, master_port: int, unix: float, versions: Mapping[str, str | None],
                 env: Mapping[str, str]) -> dict[str, Any]:
    """The start record of one rank."""
    return {
        "schema": SCHEMA, "kind": "start", "rank": rank, "local_rank": local_rank, "node_rank": node_rank,
        "world_size": world_size, "local_world_size": local_world_size, "host": host, "pid": pid,
        "job_id": job_id, "step_id": step_id, "attempt": attempt, "launcher": launcher,
        "master_addr": master_addr, "master_port": master_port, "time": timestamp(unix), "unix": unix,
        "versions": dict(versions), "env": dict(env),
    }


def exit_record(*, rank: int, host: str, pid: int, job_id: str, attempt: int, status: str, exit_code: int,
                unix: float, signal: str | None = None, exception: Mapping[str, str] | None = None,
                **extra: Any) -> dict[str, Any]:
    """The exit record of one rank. `extra` adds fields (e.g. the preemption reason)."""
    if status not in STATUSES:
        raise ValueError(f"unknown exit status {status!r}")
    record = {
        "schema": SCHEMA, "kind": "exit", "rank": rank, "host": host, "pid": pid, "job_id": job_id,
        "attempt": attempt, "status": status, "exit_code": exit_code, "signal": signal,
        "exception": dict(exception) if exception else None, "time": timestamp(unix), "unix": unix,
    }
    record.update(extra)
    return record


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    """Write `obj` as JSON atomically, so a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(obj, handle, indent=1, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, path)
