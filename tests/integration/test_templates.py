"""The sbatch templates on the real local Slurm cluster: sbatch --test-only for all of them, real 2-node
gloo DDP runs of the CPU variant of each launch model, a failing run, and the requeue template surviving
a USR2 (checkpoint, `scontrol requeue`, resume at a step > 0, finish).

The cluster's nodes have 2 fake GPUs each (GRES on /dev/null-like devices, no CUDA): GPU templates are
rendered with `--gpus-per-node 0` for the --test-only of every template and the real runs, and one test
shows their GPU request going through Slurm's GRES allocation (2 per node accepted, 3 refused).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from ddpslurm import templates

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"
SMALL = {"cpus_per_task": 1, "time": "5"}  # the local nodes have 4 cores and 4 GB each
IFNAME = os.environ.get("DDPSLURM_TEST_IFNAME", "eth0")  # the interface slurm/cluster gives every node


def _values(name: str, **extra: object) -> dict:
    """Small resources, this interpreter, the real example script, the nodes' interface."""
    values = {**SMALL, "python": sys.executable, "script": str(TRAIN)}
    params = templates.TEMPLATES[name].params
    if "gpus_per_node" in params:
        values.update(gpus_per_node=0, nccl_socket_ifname=IFNAME)
    if "tasks_per_node" in params:
        values["tasks_per_node"] = 1
    if "nodes" in params:
        values["nodes"] = 2 if name != "sweep" else 1
    values.update(extra)
    return values


def _write(tmp_path: Path, name: str, values: dict, args: list[str]) -> Path:
    path = tmp_path / f"{name}.sbatch"
    path.write_text(templates.render(name, values, args))
    return path


def _state(cluster, job_id: str) -> tuple[str, str]:
    """(state of the job allocation, its ExitCode) from sacct."""
    out = cluster.run(["sacct", "-X", "-n", "-P", "-j", job_id, "--format=State,ExitCode"], check=False).stdout
    line = next((ln for ln in out.splitlines() if ln.strip()), "|")
    state, _, code = line.partition("|")
    return state.split()[0] if state else "", code


def _story(cluster, job_id: str, batch_file: Path | None = None) -> str:
    """One line for a failure message: every attempt in sacct (-D) and the batch output, lines joined by |."""
    out = cluster.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "--format=State,ExitCode,Start,End"],
                      check=False).stdout
    attempts = "; ".join(ln for ln in out.splitlines() if ln.strip()) or "none in sacct"
    batch = batch_file.read_text() if batch_file and batch_file.exists() else "(no batch output)"
    return f"job {job_id} attempts: {attempts} || batch: {' | '.join(batch.splitlines())}"


def _wait_gone(cluster, job_id: str, limit: float, on_pending=None, batch_file: Path | None = None) -> tuple[str, str]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        queued = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], check=False).stdout.strip()
        if not queued:
            return _state(cluster, job_id)
        if on_pending and queued.startswith("PENDING"):
            on_pending(queued)
        time.sleep(1)
    story = _story(cluster, job_id, batch_file)
    cluster.run(["scancel", job_id], check=False)
    pytest.fail(f"job {job_id} still queued after {limit:.0f}s: {story}")


def _finals(lines: list[str]) -> list[dict]:
    """The training script's final JSON records in log lines (torchrun's [defaultN]: prefix removed)."""
    out = []
    for line in lines:
        text = re.sub(r"^\[default\d+\]:", "", line).strip()
        if text.startswith('{"event": "final"'):
            out.append(json.loads(text))
    return out


def _analyze(cluster, log_dir: Path) -> None:
    done = cluster.run([sys.executable, "-m", "ddpslurm.cli", "analyze", str(log_dir), "--json"], check=False)
    if "No such command" in done.stderr:
        pytest.skip("`ddpslurm analyze` is not there yet")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "cause" in report and "ranks" in report


# --- sbatch --test-only ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(templates.TEMPLATES))
def test_sbatch_test_only_accepts_every_template(slurm_cluster, tmp_path: Path, name: str) -> None:
    script = _write(tmp_path, name, _values(name), [])
    done = slurm_cluster.run(["sbatch", "--test-only", script.name], cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert "to start at" in done.stderr


def test_gpu_rendering_goes_through_the_clusters_gres(slurm_cluster, tmp_path: Path) -> None:
    """The nodes have Gres=gpu:2: a template asking for 2 GPUs per node is accepted, one asking for 3 is not."""
    fits = _write(tmp_path, "srun-gpu", _values("srun-gpu", gpus_per_node=2), [])
    done = slurm_cluster.run(["sbatch", "--test-only", fits.name], cwd=tmp_path, check=False)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr
    too_many = _write(tmp_path, "srun-gpu", _values("srun-gpu", gpus_per_node=3), [])
    done = slurm_cluster.run(["sbatch", "--test-only", too_many.name], cwd=tmp_path, check=False)
    assert done.returncode != 0
    assert "requested node configuration is not available" in done.stderr.lower()


# --- real runs, submitted together so that they share the cluster's time ----------------------------

TIME_LIMIT_STEPS = 320
RUNS = {  # name -> (template, values, training arguments, extra sbatch options)
    "requeue": ("requeue", {}, ["--epochs", "2", "--steps-per-epoch", "15", "--step-sleep", "0.3",
                                "--checkpoint-every", "0"], []),
    "requeue-cap": ("requeue", {"max_requeues": 0}, ["--epochs", "1", "--steps-per-epoch", "600", "--step-sleep", "0.3",
                                                      "--checkpoint-every", "0"], []),
    # Slurm itself sends USR2 (--signal=B:USR2@100) into a 3-minute limit: asked for at 80 s, and Slurm may send it
    # up to 60 s early, so at 20-80 s (TIME_LIMIT_S - delay - 60 > 0: never before the batch shell runs). 320 steps
    # of 0.3 s outlast the latest signal; the next attempt gets a 10-minute limit (_release_requeued).
    "time-limit": ("requeue", {"time": "3", "signal_delay": 100},
                   ["--epochs", "1", "--steps-per-epoch", str(TIME_LIMIT_STEPS), "--step-sleep", "0.3",
                    "--checkpoint-every", "0"], []),
    "sweep": ("sweep", {"tasks_per_node": 2, "array": "0-1"},
              ["--epochs", "1", "--steps-per-epoch", "6", "--step-sleep", "0.5"], ["--nodelist={last_node}"]),
    "srun-cpu": ("srun-cpu", {"tasks_per_node": 2}, ["--epochs", "1", "--steps-per-epoch", "8"], []),
    "torchrun-cpu": ("torchrun-cpu", {"tasks_per_node": 2}, ["--epochs", "1", "--steps-per-epoch", "8"], []),
    "failing": ("srun-cpu", {}, ["--epochs", "0"], []),  # argparse error on every rank, exit 2
}


def _last_node(cluster) -> str:
    """The cluster's last node: the sweep is pinned there, away from the 2-node runs that start first."""
    return cluster.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()[-1]


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """Every real run rendered and submitted at once: name -> (job id, its submit folder)."""
    jobs = {}
    for key, (name, extra, args, options) in RUNS.items():
        folder = tmp_path_factory.mktemp(key)
        values = _values(name, **extra)
        if name == "requeue":
            values["checkpoint_dir"] = str(folder / "ckpt")
        else:
            args = [*args, "--checkpoint-dir", str(folder / "ckpt")]
        script = _write(folder, name, values, args)
        opts = [o.format(last_node=_last_node(slurm_cluster)) for o in options]
        done = slurm_cluster.run(["sbatch", "--parsable", *opts, script.name], cwd=folder)
        jobs[key] = (done.stdout.strip().split(";")[0], folder)
    stop = threading.Event()
    watcher = threading.Thread(target=_release_requeued, args=(slurm_cluster, jobs["time-limit"][0], stop), daemon=True)
    watcher.start()
    cap_id, cap_folder = jobs["requeue-cap"]
    cap_batch = cap_folder / f"ddp-requeue_{cap_id}.out"
    early = threading.Thread(target=_signal_at_start, args=(slurm_cluster, cap_id, cap_batch, stop), daemon=True)
    early.start()
    yield jobs
    stop.set()
    slurm_cluster.run(["scancel", *(job for job, _ in jobs.values())], check=False)


def _signal_at_start(cluster, job_id: str, batch_file: Path, stop: threading.Event) -> None:
    """USR2 to the batch shell as soon as it starts srun: the ranks are still importing torch."""
    while not stop.wait(0.2):
        if batch_file.exists() and "=== job" in batch_file.read_text():
            cluster.run(["scancel", "--signal=USR2", "--batch", job_id], check=False)
            return


def _release_requeued(cluster, job_id: str, stop: threading.Event) -> None:
    """Once the time-limit job has requeued itself, let its next attempt start now and run to the end.

    Test-only acceleration: Slurm holds a requeued job ~2 minutes (EligibleTime), and the 3-minute
    limit that made Slurm send USR2 would signal the next attempt too; a user would give a real limit.
    """
    while not stop.wait(1):
        queued = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], check=False).stdout.strip()
        if not queued and _state(cluster, job_id)[0] not in ("", "REQUEUED", "PENDING", "RUNNING"):
            return
        if queued.startswith("PENDING") and "BeginTime" in queued:  # requeued, not merely waiting for nodes
            _past_the_requeue_second()
            cluster.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10", "StartTime=now"], check=False)
        elif queued.startswith("RUNNING"):  # a later attempt that started with the 3-minute limit still set
            shown = cluster.run(["scontrol", "show", "job", "-o", job_id], check=False).stdout
            if re.search(r"\bRestarts=[1-9]", shown) and "TimeLimit=00:03:00" in shown:
                cluster.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"], check=False)


def _past_the_requeue_second() -> None:
    """Wait until the clock has left the second in which a pending, requeued job was seen.

    slurmd revokes the old attempt's credential at the second of the requeue and refuses one signed in that
    same second ("Killing non-startable batch JobId: Job credential revoked": the job FAILS, exit 1), so a
    requeued job released with StartTime=now within it dies. Slurm's own hold-off (CredExpire + 1 s) avoids it.
    """
    time.sleep(math.floor(time.time()) + 1.1 - time.time())


# The requeue test comes first: its job must still be training when the test sends USR2.
def test_requeue_template_checkpoints_on_usr2_requeues_and_resumes(slurm_cluster, submitted) -> None:
    job_id, tmp_path = submitted["requeue"]
    first = tmp_path / "logs" / job_id / "attempt_0"
    deadline = time.monotonic() + 120
    while "step 10 " not in "".join(f.read_text() for f in first.glob("*_0_log.out")):  # training is under way
        assert time.monotonic() < deadline, "the first attempt never reached step 10"
        time.sleep(0.5)
    slurm_cluster.run(["scancel", "--signal=USR2", "--batch", job_id])

    def skip_requeue_delay(_: str) -> None:
        # Slurm makes a requeued job wait ~2 minutes (EligibleTime); the test does not need that pause.
        _past_the_requeue_second()
        slurm_cluster.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)

    state, code = _wait_gone(slurm_cluster, job_id, 170, on_pending=skip_requeue_delay)
    batch = (tmp_path / f"ddp-requeue_{job_id}.out").read_text()
    assert (state, code) == ("COMPLETED", "0:0"), batch
    assert "batch shell got SIGUSR2" in batch and f"requeueing job {job_id} (restart 1 of at most 3)" in batch
    assert "attempt 0: training step ended with status 0 " in batch  # the ranks stopped cleanly
    assert batch.count("=== job") == 2  # --open-mode=append kept both attempts

    stopped = _finals([ln for f in first.glob("*_log.out") for ln in f.read_text().splitlines()])
    assert {r["status"] for r in stopped} == {"preempted"} and len(stopped) == 2
    stop_step = stopped[0]["step"]
    assert 10 <= stop_step < 30

    second = tmp_path / "logs" / job_id / "attempt_1"
    rank0 = (second / f"{job_id}_0_log.out").read_text()
    assert f"resumed from {tmp_path / 'ckpt' / job_id / 'last.pt'} at step {stop_step}" in rank0
    done = _finals([ln for f in second.glob("*_log.out") for ln in f.read_text().splitlines()])
    assert sorted(r["rank"] for r in done) == [0, 1]
    assert {r["status"] for r in done} == {"done"} and {r["step"] for r in done} == {30}
    assert len({r["params_sha256"] for r in done}) == 1
    assert f"=== job {job_id} attempt 1 (requeue cap 3)" in batch  # SLURM_RESTART_COUNT reached the script
    _analyze(slurm_cluster, tmp_path / "logs" / job_id)  # the attempt_<N> folders read without error


def test_requeue_cap_reached_stops_with_a_checkpoint_and_no_requeue(slurm_cluster, submitted) -> None:
    """USR2 at the very start (the fixture's _signal_at_start, while the ranks still import torch): not
    fatal, not lost; with --max-requeues 0 the job stops with its checkpoint instead of requeueing."""
    job_id, tmp_path = submitted["requeue-cap"]
    first = tmp_path / "logs" / job_id / "attempt_0"
    state, code = _wait_gone(slurm_cluster, job_id, 120)
    batch = (tmp_path / f"ddp-requeue_{job_id}.out").read_text()
    assert (state, code) == ("FAILED", "1:0"), batch
    assert "requeue cap 0 reached, not requeueing" in batch and "requeueing job" not in batch
    assert "attempt 0: training step ended with status 0 " in batch
    assert not (tmp_path / "logs" / job_id / "attempt_1").exists()
    stopped = _finals([ln for f in first.glob("*_log.out") for ln in f.read_text().splitlines()])
    assert {r["status"] for r in stopped} == {"preempted"} and 1 <= stopped[0]["step"] < 60
    started, signalled = (time.strptime(re.search(pat, batch)[1], "%Y-%m-%d %H:%M:%S")
                          for pat in (r"on \S+ at (\S+ \S+),", r"got SIGUSR2 at (\S+ \S+),"))
    assert time.mktime(signalled) - time.mktime(started) <= 5  # it really came before the ranks were up
    assert (tmp_path / "ckpt" / job_id / "last.pt").is_file()  # resubmitting can go on from here


def test_requeue_template_survives_its_time_limit(slurm_cluster, submitted) -> None:
    """The real path: Slurm sends USR2 from --signal, the ranks checkpoint, the job requeues and finishes."""
    job_id, tmp_path = submitted["time-limit"]
    batch_file = tmp_path / f"ddp-requeue_{job_id}.out"
    # Slack for a loaded 2-core machine: attempt 0 (USR2 at 20-80 s), the requeue, attempt 1 (at most ~90 s of steps).
    state, code = _wait_gone(slurm_cluster, job_id, 420, batch_file=batch_file)
    story = _story(slurm_cluster, job_id, batch_file)
    batch = batch_file.read_text()
    assert (state, code) == ("COMPLETED", "0:0"), story
    assert batch.count("batch shell got SIGUSR2") == 1 and f"requeueing job {job_id} (restart 1" in batch, story
    assert "attempt 0: training step ended with status 0 " in batch, story  # no rank died of an early USR2
    stopped = _finals((tmp_path / "logs" / job_id / "attempt_0" / f"{job_id}_0_log.out").read_text().splitlines())
    assert stopped and stopped[0]["status"] == "preempted" and 0 < stopped[0]["step"] < TIME_LIMIT_STEPS, (stopped,
                                                                                                           story)
    rank0 = (tmp_path / "logs" / job_id / "attempt_1" / f"{job_id}_0_log.out").read_text()
    assert f"at step {stopped[0]['step']}" in rank0, (rank0[-2000:], story)
    done = _finals([ln for f in (tmp_path / "logs" / job_id / "attempt_1").glob("*_log.out")
                    for ln in f.read_text().splitlines()])
    assert {(r["status"], r["step"]) for r in done} == {("done", TIME_LIMIT_STEPS)}, (done, story)
    assert len({r["params_sha256"] for r in done}) == 1, done


@pytest.mark.parametrize("name", ["srun-cpu", "torchrun-cpu"])
def test_cpu_template_runs_two_node_ddp_to_completion(slurm_cluster, submitted, name: str) -> None:
    job_id, tmp_path = submitted[name]
    state, code = _wait_gone(slurm_cluster, job_id, 150)
    log_dir = tmp_path / "logs" / job_id
    batch = (tmp_path / f"ddp-{name}_{job_id}.out").read_text()
    assert (state, code) == ("COMPLETED", "0:0"), batch
    pattern = "*_log.out" if name == "srun-cpu" else "*_node*.out"
    files = sorted(log_dir.glob(pattern))
    assert len(files) == (4 if name == "srun-cpu" else 2)  # one per rank / one per node
    finals = _finals([ln for f in files for ln in f.read_text().splitlines()])
    assert sorted(r["rank"] for r in finals) == [0, 1, 2, 3]
    assert {r["world_size"] for r in finals} == {4} and {r["status"] for r in finals} == {"done"}
    assert len({r["params_sha256"] for r in finals}) == 1
    assert len({r["host"] for r in finals}) == 2
    if name == "srun-cpu":  # %t = global rank: the rank in the file name is the rank that wrote it
        for f in files:
            assert _finals(f.read_text().splitlines())[0]["rank"] == int(f.name.split("_")[1])
    else:  # torchrun's own per-worker tree, one per node
        assert len(list(log_dir.glob("node_rank*_*/*/attempt_0/*/stdout.log"))) == 4
    _analyze(slurm_cluster, log_dir)


def test_failing_step_fails_the_job_and_points_at_the_post_mortem(slurm_cluster, submitted) -> None:
    job_id, tmp_path = submitted["failing"]
    state, code = _wait_gone(slurm_cluster, job_id, 150)
    # srun reports the worst task: 2 from the failing rank, or 15 for its peer that --kill-on-bad-exit ended
    assert state == "FAILED" and code in ("2:0", "15:0")
    batch = (tmp_path / f"ddp-srun-cpu_{job_id}.out").read_text()
    assert f"Post-mortem: ddpslurm analyze logs/{job_id}" in batch
    assert "--epochs must be at least 1" in (tmp_path / "logs" / job_id / f"{job_id}_0_log.err").read_text()
    _analyze(slurm_cluster, tmp_path / "logs" / job_id)


def test_sweep_array_tasks_on_one_node_get_their_own_ports_and_arguments(slurm_cluster, submitted) -> None:
    """Two array tasks, each a 2-rank DDP run, pinned to one node: distinct ports and SWEEP entries, both finish."""
    array_id, tmp_path = submitted["sweep"]
    node = _last_node(slurm_cluster)
    state, code = _wait_gone(slurm_cluster, array_id, 150)
    assert (state, code) == ("COMPLETED", "0:0")
    ports, lrs, own_ids = set(), set(), set()
    for task in (0, 1):
        batch = (tmp_path / f"ddp-sweep_{array_id}_{task}.out").read_text()
        ports.add(re.search(r"master \S+:(\d+)", batch)[1])
        own_ids.add(int(re.search(r"\(job (\d+)\)", batch)[1]))
        lrs.add(re.search(r"--lr (\S+);", batch)[1])
        finals = _finals([ln for f in (tmp_path / "logs" / f"{array_id}_{task}").glob("*_log.out")
                          for ln in f.read_text().splitlines()])
        assert sorted(r["rank"] for r in finals) == [0, 1] and len({r["params_sha256"] for r in finals}) == 1
        assert {r["host"] for r in finals} == {node}
    assert len(own_ids) == 2 and ports == {str(10000 + job % 20000) for job in own_ids}  # each task's own job id
    assert lrs == {"0.1", "0.03"}  # each array task took its own SWEEP entry
