"""A launcher's word on a rank's death: Open MPI's `%s noticed that process rank N with PID P on node H exited on
signal S (NAME).` (orte's help-orterun.txt, PRRTE's help-prun.txt that wraps it before `signal`) gives that rank,
its host and the signal; Ray's worker-died lines name the dead worker's pid and address, never a rank. Launcher
names, ranks, hosts and pids varied; noise lines around them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from tests.unit.test_analyze_families import scan_text

SIGNALS = {6: "Aborted", 9: "Killed", 11: "Segmentation fault", 7: "Bus error"}
NOISE = ("--------------------------------------------------------------------------",
         "[1,0]<stdout>:Epoch 1/1", "[1,2]<stdout>:step 120 loss 0.41")


def noticed(launcher: str, rank: int, pid: int, host: str, signum: int, wrapped: bool) -> list[str]:
    head = f"{launcher} noticed that process rank {rank} with PID {pid} on node {host} exited on"
    tail = f"signal {signum} ({SIGNALS[signum]})."
    return [head, tail] if wrapped else [f"{head} {tail}"]


@pytest.mark.parametrize("launcher", ["mpirun", "mpiexec", "orterun", "prterun"])
@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_launcher_names_the_rank_its_host_and_the_signal(tmp_path: Path, sigs, launcher: str, wrapped: bool,
                                                              seed: int) -> None:
    rng = random.Random(seed)
    rank, pid, host = rng.randrange(64), rng.randrange(1000, 99999), rng.choice(("gpu-c12", "node0413", "hgx7"))
    signum = rng.choice(sorted(SIGNALS))
    lines = [*rng.sample(NOISE, 2), *noticed(launcher, rank, pid, host, signum, wrapped), NOISE[0]]
    [death] = [e for e in scan_text(tmp_path, sigs, "\n".join(lines) + "\n") if e.signature == "mpirun-rank-signal"]
    assert (death.rank, death.host, death.pid, death.get("signum")) == (rank, host, pid, str(signum))
    assert death.kind == "agent_failed" and death.role == "culprit"


def test_pid_0_is_no_pid_and_a_masked_pid_is_none(tmp_path: Path, sigs) -> None:
    text = ("mpirun noticed that process rank 4 with PID 0 on node smc-gpu-04 exited on signal 6 (Aborted).\n"
            "mpirun noticed that process rank 1 with PID xxxxxx on node n2 exited on signal 9 (Killed).\n")
    deaths = [e for e in scan_text(tmp_path, sigs, text) if e.signature == "mpirun-rank-signal"]
    assert [(e.rank, e.pid, e.host) for e in deaths] == [(4, None, "smc-gpu-04"), (1, None, "n2")]


def test_the_launchers_death_report_is_the_ranks_own(tmp_path: Path, sigs) -> None:
    """One rank's death by SIGSEGV, named by mpiexec: that rank, that host, a segfault (not a rankless one)."""
    log = tmp_path / "job.log"
    log.write_text("\n".join([*NOISE, *noticed("mpiexec", 5, 0, "gpu-c13", 11, wrapped=False), NOISE[0]]) + "\n")
    d = analyze_paths([log], signatures=sigs)
    assert (d.cause, d.first_failing_rank, d.first_failing_host) == ("segfault", 5, "gpu-c13")


def test_mpiruns_summaries_name_no_rank(tmp_path: Path, sigs) -> None:
    """`Primary job  terminated normally, but 1 process returned / a non-zero exit code.` and the order mpirun
    noticed exits in (`The first process to do so was: Process name: [[J,1],R]`) are not a rank's failure."""
    text = ("Primary job  terminated normally, but 1 process returned\n"
            "a non-zero exit code. Per user-direction, the job has been aborted.\n"
            "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
            "the job to be terminated. The first process to do so was:\n\n"
            "  Process name: [[41822,1],2]\n  Exit code:    1\n")
    assert [e for e in scan_text(tmp_path, sigs, text) if e.role is not None] == []


RAY_V2 = ("(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot "
          "the problem, check the logs for the dead worker. Lease ID: 0100 Worker ID: 12a6 Node ID: 0b6a Worker IP "
          "address: {ip} Worker port: 45555 Worker PID: {pid} Worker exit type: SYSTEM_ERROR Worker exit detail: "
          "Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root "
          "causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage.")
RAY_V1 = ("2021-10-07 10:44:51,234 WARNING worker.py:1215 -- A worker died or was killed while executing a task by an "
          "unexpected system error. To troubleshoot the problem, check the logs for the dead worker. RayTask ID: 0826 "
          "Worker ID: 3f66 Node ID: 80cb Worker IP address: {ip} Worker port: 43659 Worker PID: {pid}")


@pytest.mark.parametrize("line", [RAY_V2, RAY_V1])
@pytest.mark.parametrize(("ip", "pid"), [("10.80.8.181", 26103), ("172.28.74.251", 22751)])
def test_ray_names_the_dead_workers_pid_and_address_never_a_rank(tmp_path: Path, sigs, line: str, ip: str,
                                                                 pid: int) -> None:
    log = tmp_path / "driver.log"
    log.write_text(f"(WorkerDict pid={pid + 1}) step 3\n{line.format(ip=ip, pid=pid)}\n")
    [died] = [e for e in scan_text(tmp_path, sigs, log.read_text()) if e.signature == "ray-worker-died"]
    assert (died.get("peer_ip"), died.get("worker_pid"), died.rank) == (ip, str(pid), None)
    d = analyze_paths([log], signatures=sigs)
    assert d.first_failing_rank is None and f"{ip} (pid {pid})" in d.summary


def test_a_loopback_worker_address_names_no_other_node(tmp_path: Path, sigs) -> None:
    log = tmp_path / "driver.log"
    log.write_text(RAY_V2.format(ip="127.0.0.1", pid=827161) + "\n")
    d = analyze_paths([log], signatures=sigs)
    assert d.first_failing_rank is None and d.first_failing_host is None and "127.0.0.1" not in d.summary
