"""Slurm job and step states mapped to ddpslurm's small vocabulary, through one table. Pure."""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    """What a Slurm state means for a person (and for `status --wait`)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    NODE_FAIL = "node_fail"
    OUT_OF_MEMORY = "out_of_memory"
    REQUEUED = "requeued"
    UNKNOWN = "unknown"


#: Slurm state name (long form as sacct/squeue %T/scontrol print it, and squeue's short %t code)
#: -> (ddpslurm state, terminal?). PREEMPTED is terminal for the attempt; a requeued job continues
#: as a new attempt, which sacct --duplicates lists as another record.
STATE_TABLE: dict[str, tuple[JobState, bool]] = {
    "PENDING": (JobState.PENDING, False), "PD": (JobState.PENDING, False),
    "REQUEUE_HOLD": (JobState.PENDING, False), "RH": (JobState.PENDING, False),
    "RESV_DEL_HOLD": (JobState.PENDING, False), "RD": (JobState.PENDING, False),
    "CONFIGURING": (JobState.RUNNING, False), "CF": (JobState.RUNNING, False),
    "RUNNING": (JobState.RUNNING, False), "R": (JobState.RUNNING, False),
    "COMPLETING": (JobState.RUNNING, False), "CG": (JobState.RUNNING, False),
    "SIGNALING": (JobState.RUNNING, False), "SI": (JobState.RUNNING, False),
    "STAGE_OUT": (JobState.RUNNING, False), "SO": (JobState.RUNNING, False),
    "RESIZING": (JobState.RUNNING, False), "RS": (JobState.RUNNING, False),
    "SUSPENDED": (JobState.RUNNING, False), "S": (JobState.RUNNING, False),
    "STOPPED": (JobState.RUNNING, False), "ST": (JobState.RUNNING, False),
    "COMPLETED": (JobState.COMPLETED, True), "CD": (JobState.COMPLETED, True),
    "FAILED": (JobState.FAILED, True), "F": (JobState.FAILED, True),
    "SPECIAL_EXIT": (JobState.FAILED, True), "SE": (JobState.FAILED, True),
    "CANCELLED": (JobState.CANCELLED, True), "CA": (JobState.CANCELLED, True),
    "REVOKED": (JobState.CANCELLED, True), "RV": (JobState.CANCELLED, True),
    "TIMEOUT": (JobState.TIMEOUT, True), "TO": (JobState.TIMEOUT, True),
    "DEADLINE": (JobState.TIMEOUT, True), "DL": (JobState.TIMEOUT, True),
    "PREEMPTED": (JobState.PREEMPTED, True), "PR": (JobState.PREEMPTED, True),
    "NODE_FAIL": (JobState.NODE_FAIL, True), "NF": (JobState.NODE_FAIL, True),
    "BOOT_FAIL": (JobState.NODE_FAIL, True), "BF": (JobState.NODE_FAIL, True),
    "OUT_OF_MEMORY": (JobState.OUT_OF_MEMORY, True), "OOM": (JobState.OUT_OF_MEMORY, True),
    "REQUEUED": (JobState.REQUEUED, False), "RQ": (JobState.REQUEUED, False),
    "REQUEUE_FED": (JobState.REQUEUED, False), "RF": (JobState.REQUEUED, False),
}

#: Terminal states that count as success (everything else terminal is a failure for `status --wait`).
SUCCESS = frozenset({JobState.COMPLETED})


def state_name(raw: str) -> str:
    """The bare Slurm state: `CANCELLED by 1000` -> CANCELLED, `CANCELLED+` (truncated) -> CANCELLED."""
    words = raw.strip().split()
    return words[0].rstrip("+").upper() if words else ""


def normalize_state(raw: str) -> tuple[JobState, bool]:
    """(ddpslurm state, terminal?) for a raw Slurm state; unknown names give (UNKNOWN, False)."""
    return STATE_TABLE.get(state_name(raw), (JobState.UNKNOWN, False))
