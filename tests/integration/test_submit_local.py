"""`ddpslurm submit --local`: the same worker and job folder through submitit's LocalExecutor, no Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.layout import rank_file, rank_records

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"
FAULT = Path(__file__).resolve().parent / "scripts" / "fault.py"


def _records(attempt: Path, kind: str) -> dict[int, dict]:
    return rank_records(attempt, kind)


def _local(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + ":/usr/bin:/bin",  # no Slurm needed
               PYTHONPATH=str(REPO))
    env.pop("SLURM_CONF", None)
    return subprocess.run(
        [sys.executable, "-m", "ddpslurm.cli", "submit", str(script), "--local", "--tasks-per-node", "2",
         "--folder", str(tmp_path / "jobs"), "--", *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_local_runs_two_ranks_to_completion(tmp_path: Path) -> None:
    done = _local(tmp_path, TRAIN, "--epochs", "1", "--steps-per-epoch", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = (tmp_path / "jobs").glob("job_*")
    attempt = job / "attempt_0"
    finals = [json.loads(line) for rank in (0, 1) for line in rank_file(attempt, rank, ".log").read_text().splitlines()
              if line.startswith("{") and '"final"' in line]
    assert sorted(f["rank"] for f in finals) == [0, 1]
    assert len({f["params_sha256"] for f in finals}) == 1 and {f["step"] for f in finals} == {4}
    starts, exits = _records(attempt, "start"), _records(attempt, "exit")
    assert {r["launcher"] for r in starts.values()} == {"local"}
    assert {r["master_addr"] for r in starts.values()} == {"127.0.0.1"}
    assert {r["status"] for r in exits.values()} == {"ok"}
    assert (job / "ddpslurm.json").exists()


@pytest.mark.slow
def test_local_failure_exits_nonzero_and_records_the_rank(tmp_path: Path) -> None:
    done = _local(tmp_path, FAULT, "--mode", "raise", "--rank", "1", "--at", "2")
    assert done.returncode == 3
    assert "failed" in done.stderr and "ddpslurm analyze" in done.stderr
    (job,) = (tmp_path / "jobs").glob("job_*")
    culprit = _records(job / "attempt_0", "exit")[1]
    assert culprit["status"] == "exception" and culprit["exception"]["type"] == "RuntimeError"


def _status(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + ":/usr/bin:/bin", PYTHONPATH=str(REPO))
    env.pop("SLURM_CONF", None)  # no Slurm at all: the folder alone must answer
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", "status", *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


@pytest.mark.slow
def test_status_reads_a_local_job_by_folder_and_by_id(tmp_path: Path) -> None:
    done = _local(tmp_path, TRAIN, "--epochs", "1", "--steps-per-epoch", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = (tmp_path / "jobs").glob("job_*")
    assert f"status:  ddpslurm status {job} --wait" in done.stdout  # what submit tells the user to run
    shown = _status(tmp_path, str(job))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"job {job.name[4:]} (ddpslurm): COMPLETED  exit 0"), shown.stdout
    (tmp_path / "ddpslurm_jobs").symlink_to(tmp_path / "jobs")  # the default root, where a bare id is looked up
    waited = _status(tmp_path, job.name[4:], "--wait", "--json")
    assert waited.returncode == 0, waited.stderr
    record = json.loads(waited.stdout)
    assert (record["state"], record["exit_code"], record["source"]) == ("completed", 0, "local")


@pytest.mark.slow
def test_status_wait_of_a_failed_local_job_exits_3(tmp_path: Path) -> None:
    done = _local(tmp_path, FAULT, "--mode", "raise", "--rank", "1", "--at", "2")
    assert done.returncode == 3
    (job,) = (tmp_path / "jobs").glob("job_*")
    waited = _status(tmp_path, str(job), "--wait")
    assert waited.returncode == 3, waited.stdout + waited.stderr
    assert "FAILED  exit 1" in waited.stdout
