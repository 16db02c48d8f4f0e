"""`submit --max-restarts N` on the real local Slurm cluster: real torchrun, real gloo DDP, examples/train.py.

A rank SIGKILLed mid-training is back training from its checkpoint within the same Slurm job (same id, no requeue,
attempt 0 only), with the same world size; the killed restart's files are kept aside in the job folder, and
`ddpslurm status` says how many restarts were used. A node lost leaves the job completing on the others; a job left
with fewer than MIN nodes is requeued by its batch step and resumes from its checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ddpslurm import jobfolder
from ddpslurm.launch import below_min
from tests.integration.layout import wait_for
from tests.integration.test_submit import REPO, TRAIN, finals, job_id, submit, wait_end

if TYPE_CHECKING:
    from tests.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

STEPS = 60
ARGS = ["--epochs", "1", "--steps-per-epoch", str(STEPS), "--checkpoint-every", "5", "--step-sleep", "0.3"]


def rank0_steps(attempt: Path) -> list[int]:
    """The steps rank 0 has logged in the latest restart (examples/train.py logs every 10th)."""
    try:
        text = jobfolder.rank_record_paths(attempt, jobfolder.LOG_SUFFIX)[0].read_text(errors="replace")
    except (KeyError, OSError):
        return []
    return [int(m) for m in re.findall(r"\[train\] epoch \d+ step (\d+)", text)]


def start_record(attempt: Path, rank: int) -> dict | None:
    return jobfolder.read_rank_records(attempt, "start").get(rank)


def test_killed_rank_restarts_in_place_from_its_checkpoint(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    done = submit(slurm_cluster, folder, TRAIN, ARGS, "--nodes", "2", "--max-restarts", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    jid = job_id(folder)
    jdir = folder / f"job_{jid}"
    attempt = jdir / "attempt_0"
    wait_for(lambda: any(s >= 10 for s in rank0_steps(attempt)), 180, "rank 0 at step 10 (a checkpoint on disk)", 0.2)
    victim = wait_for(lambda: start_record(attempt, 1), 180, "rank 1's start record", 0.2)
    os.kill(int(victim["pid"]), signal.SIGKILL)  # the cluster's nodes share this machine's process ids

    state = wait_end(slurm_cluster, jid, timeout=300)
    assert state == "COMPLETED", state
    # no requeue: the same attempt (a requeued one would be attempt_1: SLURM_RESTART_COUNT)
    assert sorted(p.name for p in jdir.glob("attempt_*")) == ["attempt_0"]

    done_lines = finals(attempt)  # the latest restart's rank logs hold the end
    assert sorted(done_lines) == [0, 1]
    assert {r["status"] for r in done_lines.values()} == {"done"}
    assert {r["step"] for r in done_lines.values()} == {STEPS}
    assert {r["world_size"] for r in done_lines.values()} == {2}
    assert {r["restart"] for r in done_lines.values()} == {1}
    assert len({r["params_sha256"] for r in done_lines.values()}) == 1
    resumed = re.search(r"resumed from .* at step (\d+)", jobfolder.rank_record_paths(
        attempt, jobfolder.LOG_SUFFIX)[0].read_text(errors="replace"))
    # from a checkpoint, not from the start: step 10's may still be being written when rank 0 logs step 10
    assert resumed and int(resumed[1]) >= 5 and int(resumed[1]) % 5 == 0

    victim_host = jobfolder.host_folder(attempt, victim["host"])
    entries = json.loads((victim_host / "restarts.json").read_text())["restarts"]
    assert [(e["restart"], e["reason"]) for e in entries] == [(1, "worker_failed")]
    assert {"rank": 1, "exit_code": -9, "signal": "SIGKILL"} in entries[0]["failed"]
    kept = victim_host / "restart_0"
    assert (kept / "rank_1.log").is_file() and (kept / f"node_{victim['host']}.json").is_file()
    assert jobfolder.read_rank_records(kept, "start")[1]["pid"] == victim["pid"]  # restart 0's own records
    assert jobfolder.read_rank_records(attempt, "start")[1]["pid"] != victim["pid"]

    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    shown = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "status", str(jdir)], env=env, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "restarts in place: 1 of 2 used in attempt 0, last: worker failed; world size now 2" in shown.stdout


@pytest.mark.slow
def test_lost_node_leaves_the_job_completing_on_the_others(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """`--nodes 2:3`: the third node taken away (everything in its namespace SIGKILLed, slurmd included) mid-training;
    the two others restart in place with a world of 2 and finish the job, which Slurm keeps (`--no-kill`)."""
    folder = tmp_path / "jobs"
    nodes = sorted(set(slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()))[:3]
    assert len(nodes) == 3, nodes
    # --nodelist: all three (Slurm may start a range with fewer nodes than are idle)
    done = submit(slurm_cluster, folder, TRAIN, ARGS, "--nodes", "2:3", "--max-restarts", "2",
                  "--nodelist", ",".join(nodes))
    assert done.returncode == 0, done.stdout + done.stderr
    jid = job_id(folder)
    attempt = folder / f"job_{jid}" / "attempt_0"
    wait_for(lambda: any(s >= 10 for s in rank0_steps(attempt)), 180, "rank 0 at step 10", 0.2)
    starts = jobfolder.read_rank_records(attempt, "start")
    assert {r["world_size"] for r in starts.values()} == {3}  # the cluster's 3 idle nodes: Slurm gave the most
    lost = next(r["host"] for r in starts.values() if r["host"] != starts[0]["host"] and r["rank"] == 2)
    try:
        slurm_cluster.cluster("crash-node", lost)
        state = wait_end(slurm_cluster, jid, timeout=400)
    finally:
        slurm_cluster.cluster("restart-node", lost, check=False)
    done_lines = finals(attempt)
    assert sorted(done_lines) == [0, 1], done_lines
    assert {r["world_size"] for r in done_lines.values()} == {2}
    assert {r["step"] for r in done_lines.values()} == {STEPS}
    assert lost not in {r["host"] for r in done_lines.values()}
    assert len({r["params_sha256"] for r in done_lines.values()}) == 1
    assert state == "COMPLETED", state


@pytest.mark.slow
def test_below_min_nodes_requeues_and_resumes_from_the_checkpoint(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """`--nodes 2:3` with the third node excluded: Slurm gives 2 nodes (MIN). The second one taken away mid-training
    leaves 1 node, below MIN: the survivor's torchrun restarts its workers, waits the rendezvous' join timeout
    (20 s here) for a second node, gives up, and the batch step requeues the job (attempt 1). The node brought
    back, the requeued job runs on both nodes again and resumes from attempt 0's checkpoint."""
    folder = tmp_path / "jobs"
    nodes = sorted(set(slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()))[:3]
    assert len(nodes) == 3, nodes
    done = submit(slurm_cluster, folder, TRAIN, ARGS, "--nodes", "2:3", "--max-restarts", "2", "--exclude",
                  nodes[2], extra_env={below_min.JOIN_TIMEOUT_ENV: "20"})
    assert done.returncode == 0, done.stdout + done.stderr
    jid = job_id(folder)
    jdir = folder / f"job_{jid}"
    first = jdir / "attempt_0"
    wait_for(lambda: any(s >= 10 for s in rank0_steps(first)), 180, "rank 0 at step 10 (a checkpoint on disk)", 0.2)
    starts = jobfolder.read_rank_records(first, "start")
    assert {r["world_size"] for r in starts.values()} == {2}
    lost = next(r["host"] for r in starts.values() if r["host"] != starts[0]["host"])
    try:
        crashed = time.time()
        slurm_cluster.cluster("crash-node", lost)
        # the requeued job cannot start before the node is back (the third is excluded): wait for the requeue
        record = wait_for(lambda: below_min.read_record(first), 240, "the batch step's below-MIN requeue")
        print(f"node {lost} crashed -> job requeued below MIN: {record['unix'] - crashed:.1f}s "
              f"(join timeout 20s, SlurmdTimeout 15s)")
    finally:
        slurm_cluster.cluster("restart-node", lost, check=False)
    state = wait_end(slurm_cluster, jid, timeout=400)

    survivor = jobfolder.host_folder(first, starts[0]["host"])
    gave_up = json.loads((survivor / below_min.GAVE_UP_FILE).read_text())
    assert (gave_up["kind"], gave_up["error"], gave_up["min_nodes"]) == ("timeout", "RendezvousTimeoutError", 2)
    assert not (jobfolder.host_folder(first, lost) / below_min.GAVE_UP_FILE).exists()
    record = below_min.read_record(first)
    assert record is not None and record["requeued"] is True and record["lost_nodes"] == [lost], record
    requeue = json.loads(jobfolder.requeue_path(first).read_text())
    assert requeue["requeued"] is True and "fewer than --nodes MIN 2" in requeue["reason"], requeue

    assert state == "COMPLETED", state
    done_lines = finals(jdir / "attempt_1")
    assert sorted(done_lines) == [0, 1], done_lines
    assert {r["step"] for r in done_lines.values()} == {STEPS}
    assert {r["world_size"] for r in done_lines.values()} == {2}
    assert len({r["params_sha256"] for r in done_lines.values()}) == 1
    resumed = re.search(r"resumed from .* at step (\d+)", jobfolder.rank_record_paths(
        jdir / "attempt_1", jobfolder.LOG_SUFFIX)[0].read_text(errors="replace"))
    assert resumed and int(resumed[1]) >= 10, "attempt 1 did not resume from attempt 0's checkpoint"

    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    shown = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "status", str(jdir)], env=env, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "below --nodes MIN: attempt 0 requeued: 1 of 2 node(s) left" in shown.stdout, shown.stdout
