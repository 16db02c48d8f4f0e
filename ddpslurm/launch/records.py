"""Per-rank start, signal and exit records: what they hold (their paths are in `ddpslurm.jobfolder`), and
`write_json`, which several threads of one rank may call on the same path at once.

The builders are pure.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
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



_tmp_serial = itertools.count()


def temporary_name(path: Path) -> Path:
    """A name beside `path` no other process, thread or call uses: `.NAME.PID.THREAD.N.tmp`."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{next(_tmp_serial)}.tmp")


def write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically: a reader sees the old or the new file, never part of one.

    Each call writes its own temporary file (the heartbeat thread, the signal thread and the main thread of a
    rank may write the same record at once: one shared temporary name would let one rename the other's
    half-written file)."""
    tmp = temporary_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:  # the folder is made only when missing: the batch step made it before srun
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    """Write a record as JSON atomically (see `write_text`)."""
    write_text(path, json.dumps(obj, indent=1) + "\n")
