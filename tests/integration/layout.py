"""The attempt folder's files as the tests read them: per-rank files in the ranks' host folders
(`attempt_N/<host>/rank_R.*`), the ranks' signals, progress and records in the node files
(`attempt_N/node_<host>.json`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ddpslurm import jobfolder


def rank_file(attempt: Path, rank: int, suffix: str) -> Path:
    """Rank `rank`'s file of one kind (`.log`, `.exit.json`) in whichever host folder holds it; while none does, a
    path that does not exist (callers poll `.exists()`)."""
    return jobfolder.rank_record_paths(attempt, suffix).get(rank, attempt / f"rank_{rank}{suffix}")


def rank_files(attempt: Path, suffix: str) -> dict[int, Path]:
    return jobfolder.rank_record_paths(attempt, suffix)


def rank_records(attempt: Path, kind: str) -> dict[int, dict[str, Any]]:
    """Every rank's start or exit record (`kind`), from the node files or the ranks' own files, as every reader
    takes them (`jobfolder.read_rank_records`)."""
    return jobfolder.read_rank_records(attempt, kind)


def node_states(attempt: Path) -> dict[int, dict[str, Any]]:
    """Every rank's last state, as its node's agent wrote it."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(attempt.glob(f"{jobfolder.NODE_FILE_PREFIX}*{jobfolder.NODE_FILE_SUFFIX}")):
        for rank, state in json.loads(path.read_text())["ranks"].items():
            out[int(rank)] = state
    return out


def wait_for(predicate, timeout: float, what: str, interval: float = 1.0):
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
