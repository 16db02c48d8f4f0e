"""The batch step's grace after a signal: Slurm's GraceTime when it preempts, `--grace` at the time limit; and
the rank records several threads write at once. Without Slurm (the cluster runs are in
tests/integration/test_preemption_grace.py)."""

from __future__ import annotations

import json
import threading
from datetime import datetime
from pathlib import Path

import pytest

from ddpslurm.errors import UsageError
from ddpslurm.launch import records
from ddpslurm.launch.batch import (
    NONE,
    REQUEUE,
    WAIT,
    SlurmView,
    decide,
    grace_after_signal,
    preemption_margin_s,
    slurm_preemption,
)
from ddpslurm.scheduler.commands import scontrol_show_partition_argv
from ddpslurm.scheduler.parse import parse_scontrol_show

# Trimmed from `scontrol show job` / `show partition` of the local cluster (Slurm 22.05) during a preemption.
SHOW_JOB = """JobId=19867320 JobName=victim.sh
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   Partition=debug AllocNode:Sid=host:1
   PreemptEligibleTime=2026-12-02T01:45:54 PreemptTime=2026-12-02T01:45:58
"""
SHOW_PARTITION = """PartitionName=debug
   AllocNodes=ALL Default=YES QoS=N/A
   DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=120 Hidden=NO
   OverTimeLimit=NONE PreemptMode=REQUEUE
"""
PREEMPT_UNIX = datetime.fromisoformat("2026-12-02T01:45:58").timestamp()


def test_slurm_preemption_reads_preempt_time_and_grace_time() -> None:
    job, partition = parse_scontrol_show(SHOW_JOB)[0], parse_scontrol_show(SHOW_PARTITION)[0]
    assert slurm_preemption(job, partition) == (PREEMPT_UNIX, 120.0)
    assert slurm_preemption(dict(job, PreemptTime="None"), partition) is None  # the time limit
    assert slurm_preemption(dict(job, PreemptTime="garbage"), partition) is None
    assert slurm_preemption(job, {"GraceTime": "?"}) == (PREEMPT_UNIX, 0.0)


@pytest.mark.parametrize(("grace_time", "margin"), [(120, 12), (10, 2), (600, 15), (0, 2)])
def test_margin_is_a_tenth_of_the_grace_between_2_and_15_s(grace_time: float, margin: float) -> None:
    assert preemption_margin_s(grace_time) == margin


def test_grace_after_signal_follows_grace_time_when_preempted_else_signal_delay() -> None:
    """The issue's case: GraceTime=120, --signal-delay 90 (--grace 75). Preempted: requeue 108 s after
    PreemptTime, not 75 s after the signal; the time limit keeps --grace."""
    assert grace_after_signal(None, 1000.0, 75) == 75
    assert grace_after_signal((1000.0, 120.0), 1000.5, 75) == pytest.approx(107.5)
    assert grace_after_signal((1000.0, 10.0), 1001.0, 75) == pytest.approx(7.0)
    assert grace_after_signal((1000.0, 10.0), 1030.0, 75) == 0.0  # a late signal: the grace is gone


def _decide(**changes):
    args = {"exits": {}, "signal_unix": 100.0, "world_size": 2, "srun_running": True, "now": 150.0,
            "grace_s": 75.0, "attempt": 0, "max_requeues": 3, "signalled": frozenset({0, 1}), "preempted": False}
    args.update(changes)
    return decide(**args)


def test_ranks_saving_past_signal_delay_are_waited_for_within_grace_time() -> None:
    grace = grace_after_signal((100.0, 120.0), 100.0, 75)
    assert _decide(now=180.0, grace_s=grace, preempted=True).action == WAIT  # 80 s into a 100 s save
    assert _decide(now=100.0 + grace, grace_s=grace, preempted=True).action == REQUEUE
    assert _decide(now=180.0).action == REQUEUE  # the time limit: --grace 75 is the rule


def test_ranks_killed_before_taking_the_signal_are_a_preemption_when_slurm_preempts() -> None:
    """A SIGTERM before submitit or the worker had their handlers kills the rank (default action): no signal
    record, srun fails. Slurm's PreemptTime tells a preemption from a crash."""
    assert _decide(signal_unix=None, srun_running=False).action == NONE
    assert _decide(signal_unix=None, srun_running=False, preempted=True).action == REQUEUE
    assert _decide(signal_unix=None, srun_running=False, preempted=True, attempt=3).action == NONE
    assert _decide(signal_unix=None, srun_running=True, preempted=True).action == WAIT
    one_silent = {"srun_running": False, "signalled": frozenset({0}), "exits": {0: {"status": "preempted"}}}
    assert _decide(**one_silent).action == NONE  # srun's kill-on-bad-exit, not a preemption
    assert _decide(**one_silent, preempted=True).action == REQUEUE


def test_slurm_is_asked_once_when_needed() -> None:
    asked: list[str] = []
    view = SlurmView("42", query=lambda job: asked.append(job) or None)
    assert view.preemption(False) is None and asked == []  # no signal, srun running: no scontrol call
    assert view.preemption(True) is None and view.preemption(True) is None and asked == ["42"]
    assert view.preemption(True, failed=True) is None and asked == ["42", "42"]  # srun failed: once more
    assert view.preemption(True, failed=True) is None and asked == ["42", "42"]
    found = SlurmView("43", query=lambda job: (1.0, 120.0))
    assert found.preemption(True) == found.preemption(True, failed=True) == (1.0, 120.0)
    assert SlurmView("", query=lambda job: pytest.fail("no job id: nothing to ask")).preemption(True) is None


def test_show_partition_argv_refuses_what_is_not_a_name() -> None:
    assert scontrol_show_partition_argv("debug") == ["scontrol", "show", "partition", "debug"]
    with pytest.raises(UsageError):
        scontrol_show_partition_argv("debug;rm -rf /")


def test_records_written_by_many_threads_at_once_stay_whole(tmp_path: Path) -> None:
    """The heartbeat, signal and main threads of one rank may write the same record at once: every read sees
    a whole record, and no temporary file is left."""
    path = tmp_path / "rank_0.exit.json"
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(200):
                records.write_json(path, {"writer": n, "i": i, "pad": "x" * 4096})
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    reads = 0
    while any(t.is_alive() for t in threads):
        if path.exists():
            assert json.loads(path.read_text())["pad"] == "x" * 4096
            reads += 1
    for thread in threads:
        thread.join()
    assert not errors and reads > 0
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
