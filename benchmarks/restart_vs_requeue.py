#!/usr/bin/env python3
"""Kill -> next training step: torchrun's in-place restart (`submit --max-restarts 1`) against a requeue of the job.

On a running local cluster (`slurm/cluster --name NAME up`), examples/train.py on 2 nodes (gloo, one rank a node,
rank 0 logging every step, a checkpoint every 5 steps). Once rank 0 is past step 10, rank 1's worker is SIGKILLed
and the clock runs until rank 0 logs its next training step:

- in place: `--max-restarts 1`: torchrun restarts both workers inside the same job and attempt;
- requeue: `--max-restarts 0` (fail-fast ends the job), then `scontrol requeue` of the same job id (what an
  operator, or Slurm for a node failure with `--requeue`, does) and its next attempt. `--release` lifts Slurm's
  requeue hold-off (BeginTime, about 2 minutes here) with `scontrol update StartTime=now` as the tests do: the
  figure then is the floor of a requeue on an idle cluster, with no queue wait at all.

    python benchmarks/restart_vs_requeue.py --cluster bench [--runs 2] [--release] [--no-requeue]

Prints one line per run and phase, then the medians. Job folders go to a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddpslurm import jobfolder  # noqa: E402

TRAIN = REPO / "examples" / "train.py"
STEP = re.compile(r"^\[train\] epoch \d+ step (\d+)", re.M)
ARGS = ["--epochs", "1", "--steps-per-epoch", "200", "--checkpoint-every", "5", "--step-sleep", "0.2",
        "--log-every", "1"]
POLL_S = 0.05


def cluster_env(name: str) -> dict[str, str]:
    done = subprocess.run([str(REPO / "slurm" / "cluster"), "--name", name, "env"], capture_output=True, text=True,
                          timeout=60)
    status = subprocess.run([str(REPO / "slurm" / "cluster"), "--name", name, "status"], capture_output=True,
                            text=True, timeout=60)
    if done.returncode or status.returncode:
        sys.exit(f"restart_vs_requeue: cluster {name!r} is not up: run `slurm/cluster --name {name} up --nodes 2`")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for line in done.stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
    return env


def run(env: dict[str, str], argv: list[str], check: bool = True) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    if check and done.returncode:
        sys.exit(f"restart_vs_requeue: {shlex.join(argv)} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def submit(env: dict[str, str], folder: Path, max_restarts: int) -> tuple[str, Path]:
    out = run(env, [sys.executable, "-m", "ddpslurm.cli", "submit", str(TRAIN), "--folder", str(folder), "--nodes",
                    "2", "--launcher", "torchrun", "--max-restarts", str(max_restarts), "--time", "10", "--json",
                    "--lint", "off", "--", *ARGS])
    record = json.loads(out.strip().splitlines()[-1])
    return record["job_id"], Path(record["folder"])


def wait_for(what: str, check, timeout: float = 400):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = check()
        if found:
            return found
        time.sleep(POLL_S)
    sys.exit(f"restart_vs_requeue: timed out after {timeout}s waiting for {what}")


def rank_log(attempt: Path, rank: int) -> Path | None:
    return jobfolder.rank_record_paths(attempt, jobfolder.LOG_SUFFIX).get(rank)


def steps(path: Path | None) -> list[int]:
    if path is None:
        return []
    try:
        return [int(s) for s in STEP.findall(path.read_text(errors="replace"))]
    except OSError:
        return []


def kill_rank1_past_step_10(attempt: Path) -> float:
    """SIGKILL rank 1's worker once rank 0 is past step 10; the kill's time."""
    wait_for("rank 0 past step 10", lambda: any(s > 10 for s in steps(rank_log(attempt, 0))))
    victim = wait_for("rank 1's start record", lambda: jobfolder.read_rank_records(attempt, "start").get(1))
    t0 = time.time()
    os.kill(int(victim["pid"]), signal.SIGKILL)  # the local cluster's nodes share this machine's process ids
    return t0


def job_state(env: dict[str, str], jid: str) -> str:
    return run(env, ["squeue", "-h", "-j", jid, "-o", "%T"], check=False).strip()


def in_place(env: dict[str, str], root: Path) -> dict[str, float]:
    jid, jdir = submit(env, root / "inplace", 1)
    attempt = jdir / "attempt_0"
    t0 = kill_rank1_past_step_10(attempt)

    def restarted() -> Path | None:
        host = (rank_log(attempt, 0) or attempt).parent
        return host if (host / "restart_0").is_dir() else None

    host = wait_for("the restart", restarted)
    t_restart = time.time()
    wait_for("rank 0's next step", lambda: steps(host / "rank_0.log"))
    t1 = time.time()
    entry = json.loads((host / "restarts.json").read_text())["restarts"][0]
    run(env, ["scancel", jid], check=False)
    return {"kill_to_step_s": t1 - t0, "kill_to_restart_record_s": float(entry["unix"]) - t0,
            "seen_restart_to_step_s": t1 - t_restart}


def requeued(env: dict[str, str], root: Path, release: bool) -> dict[str, float]:
    jid, jdir = submit(env, root / "requeue", 0)
    t0 = kill_rank1_past_step_10(jdir / "attempt_0")
    wait_for("the job to fail", lambda: job_state(env, jid) not in ("RUNNING", "COMPLETING"))
    t_failed = time.time()
    run(env, ["scontrol", "requeue", jid])
    t_requeued = time.time()
    if release:
        wait_for("the requeue hold", lambda: "BeginTime" in run(env, ["squeue", "-h", "-j", jid, "-o", "%r"],
                                                                check=False), timeout=30)
        time.sleep(2.1)  # not within the requeue's second: slurmd refuses a credential signed in it
        run(env, ["scontrol", "update", f"JobId={jid}", "StartTime=now"], check=False)
    attempt = jdir / "attempt_1"
    wait_for("the next attempt", attempt.is_dir, timeout=600)
    t_started = time.time()
    wait_for("rank 0's next step", lambda: steps(rank_log(attempt, 0)), timeout=600)
    t1 = time.time()
    run(env, ["scancel", jid], check=False)
    return {"kill_to_step_s": t1 - t0, "kill_to_job_failed_s": t_failed - t0,
            "requeue_to_attempt_start_s": t_started - t_requeued, "attempt_start_to_step_s": t1 - t_started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", required=True, help="the local cluster's name (slurm/cluster --name)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--release", action="store_true", help="lift Slurm's requeue hold-off (StartTime=now)")
    parser.add_argument("--no-requeue", action="store_true", help="time the in-place restart only")
    args = parser.parse_args()
    env = cluster_env(args.cluster)
    results: dict[str, list[dict[str, float]]] = {"in place": [], "requeue": []}
    with tempfile.TemporaryDirectory(prefix="restart_bench_") as tmp:
        for number in range(args.runs):
            for kind in ("in place", "requeue"):
                if kind == "requeue" and args.no_requeue:
                    continue
                root = Path(tmp) / f"run{number}"
                root.mkdir(exist_ok=True)
                found = in_place(env, root) if kind == "in place" else requeued(env, root, args.release)
                results[kind].append(found)
                print(f"run {number} {kind}: " + ", ".join(f"{k} {v:.2f}" for k, v in found.items()), flush=True)
    hold = "hold-off lifted (StartTime=now)" if args.release else "Slurm's requeue hold-off as it is"
    for kind, found in results.items():
        if found:
            median = statistics.median(f["kill_to_step_s"] for f in found)
            note = f"; {hold}" if kind == "requeue" else ""
            print(f"median kill -> next training step, {kind}: {median:.2f} s over {len(found)} run(s){note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
