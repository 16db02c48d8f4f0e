"""`submit --hang-timeout` on the real local Slurm cluster: a rank that hangs is found live, every rank's stack is
dumped, the job ends long before the process-group timeout, and `analyze` names the stuck rank and its frame."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.layout import node_states, rank_file, rank_records

if TYPE_CHECKING:
    from tests.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
FAULT = REPO / "slurm" / "lab" / "ddp_fault.py"
HANG_TIMEOUT_S = 30
PG_TIMEOUT_S = 600  # ddpslurm's default process-group timeout (DDPSLURM_PG_TIMEOUT)


def _records(attempt: Path, kind: str) -> dict[int, dict]:
    return rank_records(attempt, kind)


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_rank_sleeping_before_a_collective_is_ended_and_named(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                              launcher: str) -> None:
    """srun: one task per rank; torchrun: one agent per node, whose children take the stack signal and leave."""
    folder = tmp_path / "jobs"
    args = ["--fault", "hang", "--fault-rank", "1", "--fault-step", "3", "--fault-arg", "100000",
            "--timeout", str(PG_TIMEOUT_S), "--steps", "8"]
    argv = [sys.executable, "-m", "ddpslurm.cli", "submit", str(FAULT), "--folder", str(folder), "--time", "15",
            "--nodes", "2", "--launcher", launcher, "--hang-timeout", str(HANG_TIMEOUT_S), "--wait", "--json", "--",
            *args]
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    started = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=PG_TIMEOUT_S, cwd=str(tmp_path))
    assert done.returncode != 0, done.stdout + done.stderr  # the job failed: ended by the monitor
    assert time.time() - started < PG_TIMEOUT_S / 2, "the job ran into the process-group timeout"
    (job,) = folder.glob("job_*")
    attempt = job / "attempt_0"
    exits = _records(attempt, "exit")
    assert {r: e["status"] for r, e in exits.items()} == {0: "hang", 1: "hang"}
    assert {e["exit_code"] for e in exits.values()} == {124}
    last_progress = node_states(attempt)[1]["progress"]["unix"]  # rank 1's last step before it hung (its node file)
    ended = max(e["unix"] for e in exits.values())
    assert HANG_TIMEOUT_S <= ended - last_progress < 90, f"ended {ended - last_progress:.0f}s after the hang"
    request = json.loads((attempt / "hang.json").read_text())
    assert request["timeout_s"] == HANG_TIMEOUT_S
    stacks = {r: rank_file(attempt, r, ".stacks.txt").read_text() for r in (0, 1)}
    assert "ddp_fault.py" in stacks[1] and "in main" in stacks[1]
    assert "torch/" in stacks[0]  # rank 0 waits inside torch (DDP's backward or a collective)

    analyzed = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", str(job), "--json"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr
    diagnosis = json.loads(analyzed.stdout)
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_timeout", 1), diagnosis["summary"]
    assert any("ddp_fault.py:" in e["text"] and ":main" in e["text"] for e in diagnosis["evidence"])
    assert any("flight recorder" in e["text"] for e in diagnosis["evidence"])  # rank 1's last collective is behind


def test_ranks_in_mismatched_collectives_are_named_from_the_flight_recorder(slurm_cluster: SlurmCluster,
                                                                            tmp_path: Path) -> None:
    """Rank 2 of 4 broadcasts where the others all-reduce: gloo waits for ever; the monitor ends the job, every
    rank's flight recorder (JSON) shows the same sequence number in a different collective, analyze names rank 2."""
    folder = tmp_path / "jobs"
    args = ["--fault", "op-mismatch", "--fault-rank", "2", "--fault-step", "3", "--timeout", str(PG_TIMEOUT_S),
            "--steps", "8"]
    argv = [sys.executable, "-m", "ddpslurm.cli", "submit", str(FAULT), "--folder", str(folder), "--time", "15",
            "--nodes", "2", "--tasks-per-node", "2", "--hang-timeout", str(HANG_TIMEOUT_S), "--wait", "--json",
            "--", *args]
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    started = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=PG_TIMEOUT_S, cwd=str(tmp_path))
    assert done.returncode != 0, done.stdout + done.stderr
    assert time.time() - started < PG_TIMEOUT_S / 2, "the job ran into the process-group timeout"
    (job,) = folder.glob("job_*")
    attempt = job / "attempt_0"
    assert {r: e["status"] for r, e in _records(attempt, "exit").items()} == dict.fromkeys(range(4), "hang")
    last = {}
    for rank in range(4):
        entries = json.loads(rank_file(attempt, rank, ".fr_trace.json").read_text())["entries"]
        last[rank] = max((e for e in entries if not e["is_p2p"]), key=lambda e: e["collective_seq_id"])
    assert len({e["collective_seq_id"] for e in last.values()}) == 1  # the same collective number on every rank
    assert {r: e["profiling_name"] for r, e in last.items()} == \
        {0: "gloo:all_reduce", 1: "gloo:all_reduce", 2: "gloo:broadcast", 3: "gloo:all_reduce"}

    analyzed = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", str(job), "--json"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr
    diagnosis = json.loads(analyzed.stdout)
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_mismatch", 2), diagnosis["summary"]
    assert any("flight recorder" in e["text"] and "broadcast" in e["text"] for e in diagnosis["evidence"]), \
        diagnosis["evidence"]
