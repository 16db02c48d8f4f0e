"""`ddpslurm submit` end to end on the real local Slurm cluster (slurm/cluster), real submitit, real gloo DDP.

Slurm holds a requeued job back (reason BeginTime, about 2 minutes); the preemption and time-limit
tests release it with `scontrol update JobId=J StartTime=now` to keep the suite short. Everything
else is what a person gets. Time-limit jobs use `--time 2 --signal-delay 40`: Slurm sends the signal
up to 60 s early (sbatch(1)), so it arrives 40-80 s into a 2-minute job.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.layout import node_states, rank_file, rank_files, rank_records

if TYPE_CHECKING:
    from tests.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
FAULT = SCRIPTS / "fault.py"
ECHO = SCRIPTS / "echo_args.py"
FAIL_FAST_S = 30


def submit(cluster: SlurmCluster, folder: Path, script: Path, args: list[str], *flags: str,
           timeout: float = 300, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "ddpslurm.cli", "submit", str(script), "--folder", str(folder), "--time", "5",
            *flags, "--", *args]
    env = dict(cluster.env, **(extra_env or {}), PYTHONPATH=str(REPO))  # this checkout, whatever is installed
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(folder.parent))


def job_dir(folder: Path) -> Path:
    dirs = sorted(folder.glob("job_*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def job_id(folder: Path) -> str:
    return job_dir(folder).name.removeprefix("job_")


def read_records(attempt: Path, kind: str) -> dict[int, dict]:
    """Every rank's `kind` record of the attempt (the node files', else the ranks' own files), keyed by the rank
    each record names."""
    return {record["rank"]: record for record in rank_records(attempt, kind).values()}


def finals(attempt: Path) -> dict[int, dict]:
    """The final JSON line examples/train.py prints, per rank, from the per-rank logs."""
    out = {}
    for log in rank_files(attempt, ".log").values():
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"final"' in line:
                record = json.loads(line)
                out[record["rank"]] = record
    return out


def assert_identical_finish(attempt: Path, world_size: int, steps: int) -> None:
    done = finals(attempt)
    assert sorted(done) == list(range(world_size)), f"final lines of ranks {sorted(done)} in {attempt}"
    assert {r["status"] for r in done.values()} == {"done"}
    assert {r["step"] for r in done.values()} == {steps}
    assert len({r["params_sha256"] for r in done.values()}) == 1, "ranks ended with different parameters"
    exits = read_records(attempt, "exit")
    assert {r["status"] for r in exits.values()} == {"ok"} and len(exits) == world_size


def sacct_end_unix(cluster: SlurmCluster, jid: str) -> float:
    text = cluster.run(["sacct", "-X", "-n", "-P", "-o", "End", "-j", jid]).stdout.split()[-1]
    return datetime.fromisoformat(text).timestamp()  # sacct prints local time; the node clock is the host's


def squeue_reason(cluster: SlurmCluster, jid: str) -> str:
    return cluster.run(["squeue", "-h", "-j", jid, "-o", "%T %r"], check=False).stdout.strip()


def release_when_held(cluster: SlurmCluster, jid: str) -> None:
    """Start a requeued job now instead of after Slurm's requeue hold-off (CredExpire + 1 s).

    Not within the second of the requeue: slurmd revoked the old attempt's credential at that second and
    refuses one signed in it ("Killing non-startable batch JobId: Job credential revoked": FAILED, exit 1).
    """
    if squeue_reason(cluster, jid).endswith("BeginTime"):
        time.sleep(2.1)
        cluster.run(["scontrol", "update", f"JobId={jid}", "StartTime=now"], check=False)


def wait_end(cluster: SlurmCluster, jid: str, timeout: float = 400) -> str:
    """Wait until the job leaves the queue (releasing requeue holds); its final sacct state."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        release_when_held(cluster, jid)
        if not squeue_reason(cluster, jid):
            time.sleep(1)
            if not squeue_reason(cluster, jid):
                break
        time.sleep(2)
    else:
        pytest.fail(f"job {jid} still queued after {timeout}s")
    return cluster.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", jid]).stdout.split()[-1]


def start_async(cluster: SlurmCluster, folder: Path, script: Path, args: list[str], *flags: str) -> str:
    done = submit(cluster, folder, script, args, *flags)
    assert done.returncode == 0, done.stderr
    return job_id(folder)


def test_two_nodes_train_finishes_with_identical_parameters(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    done = submit(slurm_cluster, folder, TRAIN, ["--epochs", "1", "--steps-per-epoch", "8"], "--nodes", "2", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    jdir = job_dir(folder)
    assert f"Submitted job {jdir.name.removeprefix('job_')}" in done.stdout
    assert "ddpslurm analyze" in done.stdout and "completed" in done.stdout
    attempt = jdir / "attempt_0"
    assert_identical_finish(attempt, 2, 8)
    starts = read_records(attempt, "start")
    assert {r["launcher"] for r in starts.values()} == {"srun"}
    assert len({r["host"] for r in starts.values()}) == 2
    assert starts[0]["master_addr"] == starts[0]["host"] == starts[1]["master_addr"]
    assert (jdir / f"{jdir.name.removeprefix('job_')}_submission.sh").exists()
    record = json.loads((jdir / "ddpslurm.json").read_text())
    assert record["spec"]["nodes"] == 2 and record["max_requeues"] == 3
    # the layout: one folder and one node file per node in the attempt folder, each rank's files in its host's
    # folder, made by the batch step; the script's output once (the rank log), not in submitit's task files too
    hosts = sorted({r["host"] for r in starts.values()})
    assert sorted(p.name for p in attempt.iterdir()) == sorted([*hosts, *(f"node_{h}.json" for h in hosts)])
    assert {r: p.parent.name for r, p in rank_files(attempt, ".log").items()} == {r: starts[r]["host"] for r in (0, 1)}
    assert {r: s["exit"]["status"] for r, s in node_states(attempt).items()} == {0: "ok", 1: "ok"}
    task_out = "".join(p.read_text(errors="replace") for p in jdir.glob("*_log.out"))
    assert '"final"' not in task_out and '"final"' in rank_file(attempt, 0, ".log").read_text()


@pytest.mark.slow
def test_three_nodes_two_tasks_each(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    done = submit(slurm_cluster, folder, TRAIN, ["--epochs", "1", "--steps-per-epoch", "4"],
                  "--nodes", "3", "--tasks-per-node", "2", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    attempt = job_dir(folder) / "attempt_0"
    assert_identical_finish(attempt, 6, 4)
    starts = read_records(attempt, "start")
    assert len({r["host"] for r in starts.values()}) == 3
    assert sorted((r["node_rank"], r["local_rank"]) for r in starts.values()) == [
        (n, lr) for n in range(3) for lr in range(2)]


@pytest.mark.slow
def test_torchrun_launcher(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    done = submit(slurm_cluster, folder, TRAIN, ["--epochs", "1", "--steps-per-epoch", "4"],
                  "--nodes", "2", "--tasks-per-node", "2", "--launcher", "torchrun", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    attempt = job_dir(folder) / "attempt_0"
    assert_identical_finish(attempt, 4, 4)
    starts = read_records(attempt, "start")
    assert {r["launcher"] for r in starts.values()} == {"torchrun"}
    assert sorted(r["local_rank"] for r in starts.values()) == [0, 0, 1, 1]
    for rank in range(4):  # every rank's output went to its own log, and only there
        lines = [ln for ln in rank_file(attempt, rank, ".log").read_text().splitlines() if '"final"' in ln]
        assert len(lines) == 1 and json.loads(lines[0])["rank"] == rank


ARGS = ["plain", "with space", "it's", 'dq"uote', "$(touch pwned_dollar)", "`touch pwned_tick`", "a;touch pwned_semi",
        "--flag=$HOME", "*", ""]


def test_arguments_and_script_path_arrive_verbatim_and_interface_is_the_veth(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    weird = tmp_path / "my dir $(touch pwned_dir) ;x"
    weird.mkdir()
    script = weird / "echo args.py"
    script.write_text(ECHO.read_text())
    folder = tmp_path / "jobs"
    # sbatch reads #SBATCH values itself (white space and quotes are refused before submission); what is
    # left of the shell's metacharacters must reach Slurm verbatim and never run.
    comment = "a$(touch${IFS}pwned_comment)`touch${IFS}pwned_comment2`;touch${IFS}pwned_comment3"
    done = submit(slurm_cluster, folder, script, ARGS, "--nodes", "2", "--sbatch-arg", f"comment={comment}", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    jdir = job_dir(folder)
    shown = slurm_cluster.run(["scontrol", "show", "job", jdir.name.removeprefix("job_")]).stdout
    assert f"Comment={comment}" in shown  # an #SBATCH value with metacharacters reaches Slurm verbatim
    for rank in (0, 1):
        seen = json.loads((jdir / f"argv_{rank}.json").read_text())
        assert seen["argv"] == ARGS
        non_loopback = [name for name in seen["interfaces"] if name != "lo"]
        assert len(non_loopback) == 1, seen["interfaces"]
        assert seen["env"]["GLOO_SOCKET_IFNAME"] == non_loopback[0]
        assert seen["env"]["NCCL_SOCKET_IFNAME"] is None  # NCCL chooses unless --interface says otherwise
    pwned = [p for p in list(tmp_path.rglob("pwned*")) + list(Path.cwd().glob("pwned*")) if p.is_file()]
    assert not pwned, f"a shell ran part of an argument: {pwned}"


@pytest.mark.parametrize("mode", ["raise", "sigkill"])
def test_failing_rank_ends_the_job_fast(slurm_cluster: SlurmCluster, tmp_path: Path, mode: str) -> None:
    folder = tmp_path / "jobs"
    done = submit(slurm_cluster, folder, FAULT, ["--mode", mode, "--rank", "1", "--at", "3"], "--nodes", "2", "--wait")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "failed" in done.stderr and "ddpslurm analyze" in done.stderr
    jdir = job_dir(folder)
    attempt = jdir / "attempt_0"
    fault = next(json.loads(ln) for ln in rank_file(attempt, 1, ".log").read_text().splitlines()
                 if ln.startswith('{"event": "fault"'))
    exits = read_records(attempt, "exit")
    if mode == "raise":
        culprit = exits[1]
        assert culprit["status"] == "exception" and culprit["exit_code"] == 1
        assert culprit["exception"]["type"] == "RuntimeError"
        assert "injected failure on rank 1" in culprit["exception"]["message"]
        assert "Traceback" in culprit["exception"]["traceback"]
    else:
        assert 1 not in exits, "a SIGKILLed rank cannot write an exit record"
    assert exits[0]["status"] != "ok"
    assert sacct_end_unix(slurm_cluster, jdir.name.removeprefix("job_")) - fault["unix"] <= FAIL_FAST_S


def test_unknown_partition_is_one_line(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    done = submit(slurm_cluster, tmp_path / "jobs", TRAIN, [], "--partition", "nosuchpartition")
    assert done.returncode == 1
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "partition" in lines[0].lower() and "sinfo -s" in lines[0]


URGENT_STEPS = 150


def preempt_through_urgent(cluster: SlurmCluster, tmp_path: Path, *submit_args: str) -> Path:
    """Train on 2 nodes without periodic checkpoints; once past step 20, a job in partition `urgent` takes
    the nodes (PreemptMode=REQUEUE, GraceTime=10). Waits for the end; the job folder."""
    folder = tmp_path / "jobs"
    jid = start_async(cluster, folder, TRAIN, ["--epochs", "1", "--steps-per-epoch", str(URGENT_STEPS),
                                               "--step-sleep", "0.1", "--checkpoint-every", "100000"], "--nodes", "2",
                      *submit_args)
    deadline = time.time() + 120
    while time.time() < deadline:
        log = rank_file(job_dir(folder) / "attempt_0", 0, ".log")
        if re.search(r"step ([2-9]\d|\d{3})\b", log.read_text() if log.exists() else ""):
            break
        time.sleep(1)
    nodes = cluster.run(["squeue", "-h", "-j", jid, "-o", "%N"]).stdout.strip()
    cluster.run(["sbatch", "-p", "urgent", "-N", "2", "-w", nodes, "--exclusive", "-o", "/dev/null",
                 "--wrap", "sleep 3"])
    assert wait_end(cluster, jid) == "COMPLETED"
    return job_dir(folder)


def assert_resumed_from_the_preemption(jdir: Path, signal_name: str) -> None:
    """Every rank stopped on the signal, the batch step requeued the running job, the next attempt resumed
    from the checkpoint taken at the preemption and finished with identical parameters."""
    first = jdir / "attempt_0"
    exits = read_records(first, "exit")
    assert sorted(exits) == [0, 1] and {r["status"] for r in exits.values()} == {"preempted"}, exits
    signals = {state["signal"]["signal"] for state in node_states(first).values()}  # the node files' (node_live)
    assert signals == {signal_name} and sorted(node_states(first)) == [0, 1]
    requeue = json.loads((first / "requeue.json").read_text())
    assert requeue["requeued"] is True and requeue["job_state"] == "RUNNING", requeue
    stopped_at = finals(first)[0]["step"]
    assert 0 < stopped_at < URGENT_STEPS
    resumed = re.search(r"resumed from .* at step (\d+)", rank_file(jdir / "attempt_1", 0, ".log").read_text())
    assert resumed and int(resumed.group(1)) == stopped_at, "no checkpoint taken at the preemption"
    assert_identical_finish(jdir / "attempt_1", 2, URGENT_STEPS)


@pytest.mark.slow
def test_preemption_through_urgent_partition_requeues_and_resumes(slurm_cluster: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    """Slurm's GraceTime preemption sends SIGCONT+SIGTERM to the tasks: the first SIGTERM is the flag."""
    assert_resumed_from_the_preemption(preempt_through_urgent(slurm_cluster, tmp_path), "SIGTERM")


@pytest.mark.slow
def test_preemption_with_preempt_send_user_signal(slurm_cluster: SlurmCluster, slurm_cluster_named,
                                                  tmp_path: Path) -> None:
    """With SlurmctldParameters=preempt_send_user_signal the tasks get the job's USR2 at preemption."""
    name = f"{slurm_cluster.name[:6]}usig"
    script = str(REPO / "slurm" / "cluster")
    up = subprocess.run([script, "--name", name, "up", "--nodes", "2", "--preempt-user-signal"],
                        capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        cluster = slurm_cluster_named(name)
        assert "preempt_send_user_signal" in cluster.run(["scontrol", "show", "config"]).stdout
        assert_resumed_from_the_preemption(preempt_through_urgent(cluster, tmp_path), "SIGUSR2")
    finally:
        subprocess.run([script, "--name", name, "down"], capture_output=True, timeout=300)


@pytest.mark.slow
def test_time_limit_requeues_until_the_cap(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    jid = start_async(slurm_cluster, folder, TRAIN,
                      ["--epochs", "1", "--steps-per-epoch", "1000", "--step-sleep", "0.3"],
                      "--nodes", "2", "--time", "2", "--signal-delay", "40", "--max-requeues", "1")
    assert wait_end(slurm_cluster, jid) == "FAILED"
    jdir = job_dir(folder)
    assert sorted(p.name for p in jdir.glob("attempt_*")) == ["attempt_0", "attempt_1"]
    first, last = read_records(jdir / "attempt_0", "exit"), read_records(jdir / "attempt_1", "exit")
    assert {(r["status"], r["reason"], r["requeue"]) for r in first.values()} == {("preempted", "time_limit", True)}
    assert {(r["status"], r["reason"], r["requeue"], r["exit_code"]) for r in last.values()} == {
        ("preempted", "time_limit", False, 75)}
    resumed = re.search(r"resumed from .* at step (\d+)", rank_file(jdir / "attempt_1", 0, ".log").read_text())
    assert resumed and int(resumed.group(1)) == finals(jdir / "attempt_0")[0]["step"]


@pytest.mark.slow
def test_time_limit_requeue_then_finish(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    folder, steps = tmp_path / "jobs", 200  # 100 s of training: more than one 2-minute attempt gives
    jid = start_async(slurm_cluster, folder, TRAIN,
                      ["--epochs", "1", "--steps-per-epoch", str(steps), "--step-sleep", "0.5"],
                      "--nodes", "2", "--time", "2", "--signal-delay", "40", "--max-requeues", "5")
    assert wait_end(slurm_cluster, jid, timeout=600) == "COMPLETED"
    jdir = job_dir(folder)
    attempts = sorted(jdir.glob("attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    assert len(attempts) >= 2
    assert read_records(attempts[0], "exit")[0]["reason"] == "time_limit"
    assert_identical_finish(attempts[-1], 2, steps)


def requeued_and_restarted(cluster: SlurmCluster, folder: Path, script: str) -> Path:
    """Submit a 2-node job of SCRIPTS/`script` that never ends by itself (2 min limit, USR2 40 s before it, one
    requeue), release it when Slurm holds it, wait until attempt 1's rank 0 starts, cancel it; its job folder."""
    jid = start_async(cluster, folder, SCRIPTS / script, [],
                      "--nodes", "2", "--time", "2", "--signal-delay", "40", "--max-requeues", "1")
    def restarted() -> bool:
        return 0 in rank_records(job_dir(folder) / "attempt_1", "start")

    deadline = time.time() + 300
    while time.time() < deadline and not restarted():
        release_when_held(cluster, jid)
        time.sleep(2)
    cluster.run(["scancel", jid], check=False)  # it never ends by itself; the restart is what counts
    assert restarted(), "the job was not requeued and restarted"
    return job_dir(folder)


@pytest.mark.slow
def test_script_ignoring_the_flag_is_still_requeued(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    jdir = requeued_and_restarted(slurm_cluster, tmp_path / "jobs", "ignore_flag.py")
    first = read_records(jdir / "attempt_0", "exit")
    assert sorted(first) == [0, 1]
    assert {(r["status"], r["requeue"]) for r in first.values()} == {("preempted", True)}
    assert {r["forced_stop"] for r in first.values()} == {True}, "a forced stop must be recorded as such"
    logs = rank_file(jdir / "attempt_0", 0, ".log").read_text() + rank_file(jdir / "attempt_0", 1, ".log").read_text()
    assert "ignored the preemption flag" in logs


@pytest.mark.slow
def test_time_limit_with_ranks_stuck_in_a_collective_is_still_requeued(slurm_cluster: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    """Every rank reads the flag, then hangs in C++ (rank 0 in an all_reduce): the batch step requeues when
    the grace after the signal runs out, before the time limit."""
    first = requeued_and_restarted(slurm_cluster, tmp_path / "jobs", "stuck_after_flag.py") / "attempt_0"
    assert "flag read" in rank_file(first, 0, ".log").read_text()
    requeue = json.loads((first / "requeue.json").read_text())
    assert requeue["requeued"] is True and "grace time" in requeue["reason"] and "[0, 1]" in requeue["reason"]


def test_gpu_job_slow_final_save_and_a_leaky_submitting_shell(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """One job, three facts: 2 GPUs per node through Slurm's GRES (one per rank, bound by Slurm); rank 0's
    final save takes 90 s after the other ranks returned and still completes (no srun --wait); the
    submitting shell's MASTER_ADDR=localhost / RANK=5 / WORLD_SIZE / MASTER_PORT change nothing."""
    folder = tmp_path / "jobs"
    leaky = {"MASTER_ADDR": "localhost", "RANK": "5", "WORLD_SIZE": "9", "MASTER_PORT": "1", "LOCAL_RANK": "3"}
    done = submit(slurm_cluster, folder, TRAIN, ["--epochs", "1", "--steps-per-epoch", "4", "--final-save-sleep", "90"],
                  "--nodes", "2", "--gpus-per-node", "2", "--tasks-per-node", "2", extra_env=leaky)
    assert done.returncode == 0, done.stdout + done.stderr
    assert wait_end(slurm_cluster, job_id(folder)) == "COMPLETED"
    attempt = job_dir(folder) / "attempt_0"
    assert_identical_finish(attempt, 4, 4)
    starts, exits = read_records(attempt, "start"), read_records(attempt, "exit")
    assert sorted(starts) == [0, 1, 2, 3] and {r["world_size"] for r in starts.values()} == {4}
    assert {r["master_addr"] for r in starts.values()} == {starts[0]["host"]} != {"localhost"}
    assert 1 not in {r["master_port"] for r in starts.values()}
    assert {r["env"].get("SLURM_GPUS_ON_NODE") for r in starts.values()} == {"2"}
    assert {r["env"].get("CUDA_VISIBLE_DEVICES") for r in starts.values()} == {"0,1"}
    assert exits[0]["unix"] - max(exits[r]["unix"] for r in (1, 2, 3)) >= 85
    bound = submit(slurm_cluster, tmp_path / "dry", TRAIN, [], "--nodes", "2", "--tasks-per-node", "2",
                   "--sbatch-arg", "gpus-per-task=1", "--dry-run")
    assert bound.returncode == 0 and "# warning: --sbatch-arg gpus-per-task" in bound.stdout, bound.stderr


@pytest.mark.slow
def test_torchrun_preemption_requeues_and_resumes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Slurm SIGTERMs torchrun's agent and its ranks together: the agent lets the first one pass (it would
    stop the ranks at once), the ranks checkpoint, the batch step requeues."""
    jdir = preempt_through_urgent(slurm_cluster, tmp_path, "--launcher", "torchrun")
    assert_resumed_from_the_preemption(jdir, "SIGTERM")
    assert {r["launcher"] for r in read_records(jdir / "attempt_1", "start").values()} == {"torchrun"}
