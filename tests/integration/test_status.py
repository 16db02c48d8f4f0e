"""`ddpslurm status` against the real local Slurm cluster: completed, failed, requeued, folder, unknown."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def sbatch(cluster, tmp_path: Path, wrap: str, *options: str) -> str:
    """Submit `--wrap` and return the job id."""
    done = cluster.run(["sbatch", "--parsable", "--nodes=1", "--ntasks=1", "--cpus-per-task=1",
                        f"--output={tmp_path}/%j.out", *options, f"--wrap={wrap}"])
    return done.stdout.strip().split(";")[0]


def ddpslurm(cluster, *args: str, timeout: float = 300):
    return cluster.run([sys.executable, "-m", "ddpslurm.cli", "status", *args], check=False, timeout=timeout)


def status_json(cluster, job_id: str, *flags: str) -> dict:
    done = ddpslurm(cluster, job_id, "--json", *flags)
    assert done.returncode in (0, 3), done.stderr
    return json.loads(done.stdout)


def wait_until(cluster, job_id: str, state: str, limit: float = 30) -> dict:
    deadline = time.monotonic() + limit
    while True:
        data = status_json(cluster, job_id)
        if data["state"] == state or time.monotonic() > deadline:
            return data
        time.sleep(0.5)


def test_completed_job(slurm_cluster, tmp_path: Path) -> None:
    job_id = sbatch(slurm_cluster, tmp_path, "srun true")
    waited = ddpslurm(slurm_cluster, job_id, "--wait")
    assert waited.returncode == 0, waited.stderr
    last_head = [ln for ln in waited.stdout.splitlines() if ln.startswith(f"job {job_id} ")][-1]
    assert "COMPLETED  exit 0  requeued 0x" in last_head
    data = status_json(slurm_cluster, job_id)
    assert (data["state"], data["exit_code"], data["requeue_count"], data["terminal"]) == ("completed", 0, 0, True)
    assert {s["step"]: s["state"] for s in data["steps"]} == {"batch": "completed", "0": "completed"}
    assert data["nodelist"] and data["steps"][0]["nodes"]


def test_failed_job_exit_code_and_wait_exit_status(slurm_cluster, tmp_path: Path) -> None:
    job_id = sbatch(slurm_cluster, tmp_path, "srun bash -c 'exit 5'; exit 3")
    waited = ddpslurm(slurm_cluster, job_id, "--wait", "--json")
    assert waited.returncode == 3, waited.stderr
    data = json.loads(waited.stdout)
    assert (data["state"], data["slurm_state"], data["exit_code"]) == ("failed", "FAILED", 3)
    step = next(s for s in data["steps"] if s["step"] == "0")
    assert (step["state"], step["exit_code"]) == ("failed", 5)
    plain = ddpslurm(slurm_cluster, job_id)
    assert plain.returncode == 0  # without --wait the status was shown: success
    assert "FAILED  exit 3" in plain.stdout


def test_requeued_job_shows_requeue_count(slurm_cluster, tmp_path: Path) -> None:
    job_id = sbatch(slurm_cluster, tmp_path, "srun sleep 8", "--requeue")
    assert wait_until(slurm_cluster, job_id, "running")["state"] == "running"
    slurm_cluster.run(["scontrol", "requeue", job_id])
    pending = status_json(slurm_cluster, job_id)
    assert pending["requeue_count"] == 1
    assert pending["terminal"] is False
    # Slurm delays a requeued job's start by CredExpire + 1 s (BeginTime): slurmd revoked the first
    # attempt's credential, and refuses one signed in the same second ("Job credential revoked": the job
    # then really FAILS, exit 1). So wait until the requeue is done (the job is PENDING again, the old
    # attempt's credential revoked), then until the clock has passed that second, then start it now.
    assert wait_until(slurm_cluster, job_id, "pending")["state"] == "pending"
    time.sleep(math.floor(time.time()) + 1.1 - time.time())
    slurm_cluster.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"])
    done = status_json(slurm_cluster, job_id, "--wait")
    assert (done["state"], done["requeue_count"], done["exit_code"]) == ("completed", 1, 0)


def test_job_folder_and_cancelled_job(slurm_cluster, tmp_path: Path) -> None:
    job_id = sbatch(slurm_cluster, tmp_path, "srun sleep 60")
    folder = tmp_path / "ddpslurm_jobs" / f"job_{job_id}"
    folder.mkdir(parents=True)
    wait_until(slurm_cluster, job_id, "running")
    slurm_cluster.run(["scancel", job_id])
    waited = ddpslurm(slurm_cluster, str(folder), "--wait", "--json")
    assert waited.returncode == 3, waited.stderr
    data = json.loads(waited.stdout)
    assert (data["job_id"], data["state"], data["folder"]) == (job_id, "cancelled", str(folder))
    assert data["slurm_state"].startswith("CANCELLED")


def test_wait_prints_state_changes_as_plain_lines(slurm_cluster, tmp_path: Path) -> None:
    job_id = sbatch(slurm_cluster, tmp_path, "srun sleep 4")
    waited = ddpslurm(slurm_cluster, job_id, "--wait")
    assert waited.returncode == 0, waited.stderr
    heads = [ln for ln in waited.stdout.splitlines() if ln.startswith(f"job {job_id}")]
    assert any("RUNNING" in ln or "PENDING" in ln for ln in heads)
    assert "COMPLETED" in heads[-1]


def test_unknown_job_is_one_line_exit_1(slurm_cluster) -> None:
    done = ddpslurm(slurm_cluster, "99999999")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "ddpslurm: error: Slurm knows no job 99999999 (neither sacct nor scontrol). "
        "Check the id with `squeue --me` or `sacct -X`"]


def test_array_job_needs_a_task_id(slurm_cluster, tmp_path: Path) -> None:
    array_id = sbatch(slurm_cluster, tmp_path, "srun true", "--array=0-1")
    task = status_json(slurm_cluster, f"{array_id}_1", "--wait")
    assert (task["job_id"], task["state"]) == (f"{array_id}_1", "completed")
    status_json(slurm_cluster, f"{array_id}_0", "--wait")
    parent = ddpslurm(slurm_cluster, array_id)
    assert parent.returncode == 2
    assert f"job {array_id} is an array job with 2 tasks ({array_id}_0, {array_id}_1)" in parent.stderr
