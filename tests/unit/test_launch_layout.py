"""The attempt folder a real rank leaves (the worker run as submitit's local executor runs it): per-host folders,
one copy of the rank's output, one node file, the folders the batch step made left alone; and the readers of the
layout (jobfolder.rank_record_paths, local status) on both the new and the older layout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpslurm import jobfolder
from ddpslurm.launch.local_status import local_status
from ddpslurm.launch.node_live import node_record
from ddpslurm.launch.tee import FdTee

RANK = """
import os, sys
from ddpslurm.launch.plan import WorkerConfig
from ddpslurm.launch.worker import run_rank
cfg = WorkerConfig(script=sys.argv[1], script_args=(), launcher="local", folder=sys.argv[2], nodes=1,
                   tasks_per_node=2, max_requeues=0, time_limit_s=60, signal_delay_s=30, grace_s=15,
                   interface=None, env_defaults=(("DDPSLURM_HEARTBEAT_S", "0.1"),))
sys.exit(run_rank(cfg, "local"))
"""


def _run_ranks(tmp_path: Path, body: str, extra_env: dict[str, str] | None = None,
               job: str = "4242") -> list[subprocess.CompletedProcess]:
    script = tmp_path / "train.py"
    script.write_text(body)
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, SUBMITIT_LOCAL_JOB_ID=job, SUBMITIT_LOCAL_GLOBALID=str(rank),
                   SUBMITIT_LOCAL_LOCALID=str(rank), SUBMITIT_LOCAL_NTASKS="2", TMPDIR=str(tmp_path / "tmp"),
                   DDPSLURM_NODE_INTERVAL_S="0.2", **(extra_env or {}))
        env.pop("SLURMD_NODENAME", None)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(script), str(tmp_path / "jobs")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=60), *p.communicate(timeout=60)) for p in procs]


def test_a_rank_leaves_its_files_in_its_host_folder_and_the_node_one_file(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    done = _run_ranks(tmp_path, "import ddpslurm\nddpslurm.heartbeat(3)\nprint('trained', flush=True)\n")
    assert [d.returncode for d in done] == [0, 0], [d.stderr for d in done]
    assert all("trained" not in d.stdout for d in done)  # one copy: the rank's log, not the task's stdout too
    attempt = jobfolder.attempt_folder(jobfolder.job_folder(tmp_path / "jobs", "4242"), 0)
    host = jobfolder.folder_host(socket.gethostname())
    top = sorted(p.name for p in attempt.iterdir())
    assert top == sorted([host, f"node_{host}.json"])  # O(nodes) entries in the attempt folder
    files = sorted(p.name for p in (attempt / host).iterdir())
    assert files == ["rank_0.log", "rank_1.log"]  # per rank only its log: records and liveness are the node's
    assert "trained" in (attempt / host / "rank_1.log").read_text()
    node = json.loads((attempt / f"node_{host}.json").read_text())
    assert {r: s["exit"]["status"] for r, s in node["ranks"].items()} == {"0": "ok", "1": "ok"}
    starts, exits = jobfolder.read_rank_records(attempt, "start"), jobfolder.read_rank_records(attempt, "exit")
    assert {r: (s["kind"], s["world_size"], s["launcher"]) for r, s in starts.items()} == {
        0: ("start", 2, "local"), 1: ("start", 2, "local")}
    assert {r: (e["kind"], e["status"], e["exit_code"]) for r, e in exits.items()} == {
        0: ("exit", "ok", 0), 1: ("exit", "ok", 0)}
    assert jobfolder.rank_record_paths(attempt, jobfolder.EXIT_SUFFIX) == {}
    local = [Path(base, f"ddpslurm-{os.getuid()}", f"4242.x.0.{host}") for base in ("/dev/shm", tmp_path / "tmp")]
    deadline = time.time() + 10  # the node's agent removes its node-local folder once both ranks ended
    while time.time() < deadline and any(p.exists() for p in local):
        time.sleep(0.1)
    assert not any(p.exists() for p in local)


def test_ranks_make_no_folder_the_batch_step_made(tmp_path: Path) -> None:
    """DDPSLURM_FOLDERS_MADE names the attempt folder the batch step made: no rank makes `checkpoints/` then."""
    (tmp_path / "tmp").mkdir()
    attempt = jobfolder.attempt_folder(jobfolder.job_folder(tmp_path / "jobs", "4243"), 0)
    jobfolder.host_folder(attempt, socket.gethostname()).mkdir(parents=True)
    done = _run_ranks(tmp_path, "pass\n", {"DDPSLURM_FOLDERS_MADE": str(attempt)}, job="4243")
    assert [d.returncode for d in done] == [0, 0], [d.stderr for d in done]
    assert not (attempt.parent / "checkpoints").exists()


def test_rank_record_paths_reads_both_layouts(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    for rank in (0, 1):
        jobfolder.write_json(jobfolder.rank_paths(old, rank)["exit"], {"rank": rank})
        jobfolder.write_json(jobfolder.rank_paths(new, rank, f"n{rank}")["exit"], {"rank": rank})
    assert jobfolder.rank_record_paths(old, jobfolder.EXIT_SUFFIX) == {r: old / f"rank_{r}.exit.json" for r in (0, 1)}
    assert jobfolder.rank_record_paths(new, jobfolder.EXIT_SUFFIX) == {
        r: new / f"n{r}" / f"rank_{r}.exit.json" for r in (0, 1)}
    assert jobfolder.rank_record_paths(tmp_path / "missing", jobfolder.EXIT_SUFFIX) == {}


@pytest.mark.parametrize(("host", "folder"), [("n01", "n01"), ("a/b", "a_b"), ("..", "_."), ("", "unknown"),
                                              ("-x", "_x")])
def test_host_folder_names_are_safe(host: str, folder: str) -> None:
    assert jobfolder.folder_host(host) == folder


@pytest.mark.parametrize("layout", ["node", "new", "old"])
def test_local_status_reads_every_layout(tmp_path: Path, layout: str) -> None:
    job = jobfolder.job_folder(tmp_path, "1")
    jobfolder.write_json(jobfolder.job_record_path(job), {"job_id": "999999999", "executor": "local", "world_size": 2})
    attempt = jobfolder.attempt_folder(job, 0)
    states = {}
    for rank in (0, 1):
        end = {"kind": "exit", "exit_code": rank * 3, "unix": 5.0}
        start = {"kind": "start", "host": "h1"}
        if layout == "node":
            states[rank] = {"rank": rank, "start": start, "exit": end}
            continue
        paths = jobfolder.rank_paths(attempt, rank, "h1" if layout == "new" else None)
        jobfolder.write_json(paths["exit"], end)
        jobfolder.write_json(paths["start"], start)
    if states:
        jobfolder.write_json(jobfolder.node_file_path(attempt, "h1"), node_record("h1", states, 1, 5.0, 5.0))
    status = local_status(job)
    assert status.exit_code == 3 and status.nodelist == "h1"


def test_rank_records_come_from_node_files_then_from_the_ranks_own_files(tmp_path: Path) -> None:
    """A node file's whole records win; a rank it does not name (its agent did not confirm) has its own file; an
    older node file's summary of an end (no `kind`) is no record."""
    attempt = tmp_path / "attempt_0"
    jobfolder.write_json(jobfolder.node_file_path(attempt, "n1"), node_record("n1", {
        0: {"rank": 0, "exit": {"kind": "exit", "rank": 0, "status": "ok"}},
        1: {"rank": 1, "exit": {"status": "exception", "exit_code": 1}}}, 2, 5.0, 5.0))
    jobfolder.write_json(jobfolder.rank_paths(attempt, 0, "n1")["exit"], {"kind": "exit", "rank": 0, "status": "x"})
    jobfolder.write_json(jobfolder.rank_paths(attempt, 1, "n1")["exit"], {"kind": "exit", "rank": 1,
                                                                          "status": "exception"})
    jobfolder.write_json(jobfolder.rank_paths(attempt, 2)["exit"], {"kind": "exit", "rank": 2, "status": "signal"})
    (attempt / "node_n2.json").write_text("{not json")
    found = jobfolder.read_rank_records(attempt, "exit")
    assert {r: e["status"] for r, e in found.items()} == {0: "ok", 1: "exception", 2: "signal"}
    assert jobfolder.read_rank_records(attempt, "start") == {}
    assert jobfolder.read_rank_records(tmp_path / "missing", "exit") == {}


def test_tee_without_passthrough_writes_the_log_only(tmp_path: Path) -> None:
    code = f"""
import os
from pathlib import Path
from ddpslurm.launch.tee import FdTee
tee = FdTee(Path({str(tmp_path / "host" / "rank_0.log")!r}), passthrough=False)
tee.start()
os.write(1, b"captured out\\n")
os.write(2, b"captured err\\n")
tee.stop()
os.write(1, b"after the tee\\n")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "after the tee\n" and done.stderr == ""
    assert (tmp_path / "host" / "rank_0.log").read_text() == "captured out\ncaptured err\n"
    assert FdTee(tmp_path / "x.log").passthrough  # the default passes through
