"""Slurm state table: every spelling Slurm prints maps to one ddpslurm state and a terminal flag."""

from __future__ import annotations

import pytest

from ddpslurm.scheduler.states import STATE_TABLE, JobState, normalize_state, state_name


@pytest.mark.parametrize(
    ("raw", "state", "terminal"),
    [
        ("PENDING", JobState.PENDING, False),
        ("PD", JobState.PENDING, False),
        ("RUNNING", JobState.RUNNING, False),
        ("COMPLETING", JobState.RUNNING, False),
        ("CONFIGURING", JobState.RUNNING, False),
        ("COMPLETED", JobState.COMPLETED, True),
        ("FAILED", JobState.FAILED, True),
        ("CANCELLED", JobState.CANCELLED, True),
        ("CANCELLED by 0", JobState.CANCELLED, True),
        ("CANCELLED by 1000", JobState.CANCELLED, True),
        ("CANCELLED+", JobState.CANCELLED, True),
        ("TIMEOUT", JobState.TIMEOUT, True),
        ("DEADLINE", JobState.TIMEOUT, True),
        ("PREEMPTED", JobState.PREEMPTED, True),
        ("NODE_FAIL", JobState.NODE_FAIL, True),
        ("BOOT_FAIL", JobState.NODE_FAIL, True),
        ("OUT_OF_MEMORY", JobState.OUT_OF_MEMORY, True),
        ("REQUEUED", JobState.REQUEUED, False),
        ("REQUEUE_HOLD", JobState.PENDING, False),
        ("SUSPENDED", JobState.RUNNING, False),
        (" running ", JobState.RUNNING, False),
        ("", JobState.UNKNOWN, False),
        ("SOMETHING_NEW", JobState.UNKNOWN, False),
    ],
)
def test_normalize_state(raw: str, state: JobState, terminal: bool) -> None:
    assert normalize_state(raw) == (state, terminal)


@pytest.mark.parametrize(
    ("raw", "name"), [("CANCELLED by 0", "CANCELLED"), ("FAILED", "FAILED"), ("TIMEOUT+", "TIMEOUT")]
)
def test_state_name(raw: str, name: str) -> None:
    assert state_name(raw) == name


def test_every_state_of_the_vocabulary_except_unknown_is_reachable() -> None:
    assert {state for state, _ in STATE_TABLE.values()} == set(JobState) - {JobState.UNKNOWN}


def test_only_completed_cancelled_and_failures_are_terminal() -> None:
    terminal = {state for state, done in STATE_TABLE.values() if done}
    assert JobState.PENDING not in terminal and JobState.RUNNING not in terminal
    assert JobState.REQUEUED not in terminal
