"""Preemption with a long grace, on the real local cluster: the checkpoint is never cut.

One job of `scripts/slow_save.py` on 2 nodes, in a partition like `debug` (PreemptMode=REQUEUE, the same
nodes and tier, so a job in `urgent` preempts it) but with GraceTime=120, created for the test and deleted
after it (changing `debug` itself would change what concurrent tests on the cluster see). Two real
preemptions by `urgent`:

1. mid-training; the save after the flag takes 100 s, longer than the 75 s the supervisor would allow from
   `--signal-delay` (90 - 15), and a second SIGTERM (`scancel --signal=TERM`, as an array or retry requeue
   sends) comes in the middle of it: the save completes, the job is requeued;
2. while both ranks of the next attempt are still starting: their logs (`attempt_1/<host>/rank_R.log`, on
   every node the job may get) are named pipes that the test opens only later, so each rank blocks in the
   open of its log, before the point where the worker used to
   install its handlers: the SIGTERM still sets the flag, the ranks save at once, the job is requeued;

and the last attempt resumes from that second checkpoint and finishes.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.layout import node_states
from tests.integration.test_submit import job_dir, read_records, release_when_held, start_async, wait_end

if TYPE_CHECKING:
    from tests.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

SCRIPT = Path(__file__).resolve().parent / "scripts" / "slow_save.py"
GRACE_S = 120
SAVE_S = 100
STEPS = 40


@pytest.fixture
def grace_partition(slurm_cluster: SlurmCluster):
    name = f"grace{os.getpid() % 100000}"
    slurm_cluster.run(["scontrol", "create", f"PartitionName={name}", "Nodes=ALL", "PriorityTier=1",
                       "PreemptMode=REQUEUE", f"GraceTime={GRACE_S}", "MaxTime=INFINITE", "State=UP"])
    try:
        yield name
    finally:
        slurm_cluster.run(["scontrol", "delete", f"PartitionName={name}"], check=False)


def events(text: str, name: str) -> dict[int, dict]:
    out = {}
    for line in text.splitlines():
        if line.startswith("{") and f'"event": "{name}"' in line:
            record = json.loads(line)
            out[record["rank"]] = record
    return out


def logs(attempt: Path) -> str:
    paths = sorted([*attempt.glob("rank_*.log*"), *attempt.glob("*/rank_*.log*")])  # in host folders
    return "".join(p.read_text(errors="replace") for p in paths if p.is_file())


def signal_records(attempt: Path) -> dict[int, dict]:
    """Each rank's signals, as its node's agent wrote them into the node file (ddpslurm.launch.node_live)."""
    return {rank: state["signal"] for rank, state in node_states(attempt).items() if state.get("signal")}


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(1)
    pytest.fail(f"timed out waiting for {what}")


def preempt(cluster: SlurmCluster, jid: str) -> None:
    """An exclusive job in `urgent` on the job's nodes; returns once Slurm has started the preemption."""
    nodes = cluster.run(["squeue", "-h", "-j", jid, "-o", "%N"]).stdout.strip()
    cluster.run(["sbatch", "-p", "urgent", "-N", "2", "-w", nodes, "--exclusive", "-o", "/dev/null", "--wrap", "true"])
    wait_for(lambda: "PreemptTime=None" not in cluster.run(["scontrol", "show", "job", jid]).stdout, 60,
             "Slurm to preempt the job")


def blocked_in_log_open(jid: str, attempt: int) -> list[tuple[str, int]]:
    """(node, rank) of the processes of the job's attempt that sleep in the open of a named pipe (their rank log)."""
    blocked = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc / "wchan").read_text() != "wait_for_partner":
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={jid}".encode() in environ and f"SLURM_RESTART_COUNT={attempt}".encode() in environ:
            found = dict(item.decode(errors="replace").partition("=")[::2] for item in environ if b"=" in item)
            blocked.append((found.get("SLURMD_NODENAME", "?"), int(found.get("SLURM_PROCID", "-1"))))
    return sorted(blocked)


def drain(fifo: Path, copy: Path) -> threading.Thread:
    def run() -> None:
        with open(fifo, "rb") as source, open(copy, "wb") as target:
            while chunk := source.read1(65536):
                target.write(chunk)
                target.flush()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_long_save_after_the_flag_completes_and_an_early_sigterm_still_requeues(
        slurm_cluster: SlurmCluster, grace_partition: str, tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    jid = start_async(slurm_cluster, folder, SCRIPT, ["--steps", str(STEPS), "--save-s", f"{SAVE_S},2"],
                      "--nodes", "2", "--partition", grace_partition)
    jdir = job_dir(folder)
    first, second, last = (jdir / f"attempt_{n}" for n in range(3))
    wait_for(lambda: re.search(r"^step 10$", logs(first), re.M), 180, "attempt 0 to reach step 10")
    # the next attempt's rank logs are named pipes, in place before it can start, in the host folder of every node
    # it may run on (the batch step makes the folders that are missing and leaves these)
    nodes = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()
    for node in set(nodes):
        (second / node).mkdir(parents=True)
        for rank in (0, 1):
            os.mkfifo(second / node / f"rank_{rank}.log")

    preempt(slurm_cluster, jid)
    wait_for(lambda: len(events(logs(first), "saving")) == 2, 60, "both ranks to start saving")
    time.sleep(SAVE_S / 3)
    slurm_cluster.run(["scancel", "--signal=TERM", jid])  # a second SIGTERM in the middle of the save
    wait_for(lambda: (first / "requeue.json").exists(), SAVE_S + 60, "the batch step to requeue")

    deadline = time.time() + 240
    while time.time() < deadline and len(blocked_in_log_open(jid, 1)) < 2:
        release_when_held(slurm_cluster, jid)
        time.sleep(1)
    blocked = blocked_in_log_open(jid, 1)
    assert sorted(rank for _, rank in blocked) == [0, 1], f"attempt 1's ranks did not open their logs: {blocked}"
    preempt(slurm_cluster, jid)
    time.sleep(3)  # the SIGTERM reaches the blocked ranks
    opened = time.time()
    drains = [drain(second / node / f"rank_{rank}.log", second / f"drained_{rank}.txt") for node, rank in blocked]
    assert wait_end(slurm_cluster, jid, timeout=400) == "COMPLETED"
    for thread in drains:
        thread.join(30)

    # 1: the 100 s save completed through the second SIGTERM; the supervisor waited for it
    saved, saving = events(logs(first), "saved"), events(logs(first), "saving")
    assert sorted(saved) == [0, 1], "attempt 0's save was cut"
    signals = signal_records(first)
    assert sorted(signals) == [0, 1] and {r["signal"] for r in signals.values()} == {"SIGTERM"}
    for rank, record in signals.items():
        assert saved[rank]["unix"] - record["unix"] >= SAVE_S  # the whole save ran after the signal
        later = [e for e in record.get("later", []) if e["signal"] == "SIGTERM"]
        assert later and later[0]["action"].startswith("recorded, not obeyed"), record
        assert saving[rank]["unix"] < later[0]["unix"] < saved[rank]["unix"]
    exits = read_records(first, "exit")
    assert {(r["status"], r["requeue"]) for r in exits.values()} == {("preempted", True)}, exits
    requeue = json.loads((first / "requeue.json").read_text())
    assert requeue["requeued"] and requeue["reason"] == "every task has ended after the signal", requeue

    # 2: the SIGTERM that came while the ranks were blocked before the old install point set the flag
    drained = "".join((second / f"drained_{rank}.txt").read_text(errors="replace") for rank in (0, 1))
    early = signal_records(second)
    assert sorted(early) == [0, 1] and all(r["unix"] < opened for r in early.values()), early
    assert all(r["unix"] > opened for r in read_records(second, "start").values())
    assert {r["step"] for r in events(drained, "resumed").values()} == {saved[0]["step"]}
    assert sorted(events(drained, "saved")) == [0, 1]
    assert {r["status"] for r in read_records(second, "exit").values()} == {"preempted"}
    assert json.loads((second / "requeue.json").read_text())["requeued"] is True

    # 3: the last attempt resumed from attempt 1's checkpoint and finished
    resumed = events(logs(last), "resumed")
    assert {r["step"] for r in resumed.values()} == {events(drained, "saved")[0]["step"]}
    final = events(logs(last), "final")
    assert sorted(final) == [0, 1] and {tuple(r["weights"]) for r in final.values()} == {(float(STEPS),) * 4}
