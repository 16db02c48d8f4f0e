"""What the hang monitor's heartbeat costs a training step (`submit --hang-timeout`), on examples/train.py.

    python benchmarks/heartbeat_overhead.py [--ranks 2] [--steps 300] [--repeats 3]

Runs examples/train.py as RANKS local gloo ranks (no Slurm), alternately with and without the heartbeat
thread the worker starts (same code: ddpslurm.launch.heartbeat, interval 1 s, files in a temporary attempt
folder), and prints the median time per step of each (between two optimizer steps, from a global optimizer
hook: robust to a shared machine's hiccups) and the difference. Also prints the cost of one
`ddpslurm.heartbeat()` call and of one look of the thread (collective count + an atomic file write).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train.py"

RANK_CODE = """
import os, runpy, statistics, sys, time
from pathlib import Path
from types import SimpleNamespace
import torch.optim.optimizer as optimizer_module
if os.environ["BENCH_HEARTBEAT"] == "1":
    from ddpslurm.launch import heartbeat
    from ddpslurm.launch.node_live import RankLink
    attempt = Path(os.environ["BENCH_ATTEMPT"])
    rank = int(os.environ["RANK"])
    state = SimpleNamespace(dist=SimpleNamespace(rank=rank), paths={"exit": attempt / f"rank_{rank}.exit.json"},
                            final_code=None, tee=None, exit_record=lambda *a, **k: None,
                            link=RankLink(attempt, rank, rank))
    assert heartbeat.start({"DDPSLURM_HEARTBEAT_S": "1"}, state) is not None
stamps = []
optimizer_module.register_optimizer_step_post_hook(lambda *args: stamps.append(time.perf_counter()))
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    steps = [b - a for a, b in zip(stamps[10:], stamps[11:])]
    print(f"BENCH_STEP_S {statistics.median(steps):.9f}", flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_once(ranks: int, steps: int, with_heartbeat: bool) -> float:
    """Median seconds between two optimizer steps of examples/train.py (slowest rank; a global optimizer hook)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(ranks),
                   GLOO_SOCKET_IFNAME="lo", BENCH_HEARTBEAT="1" if with_heartbeat else "0", BENCH_ATTEMPT=tmp,
                   PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        args = [str(TRAIN), "--epochs", "1", "--steps-per-epoch", str(steps), "--checkpoint-every", "1000000",
                "--checkpoint-dir", str(Path(tmp) / "ckpt")]
        procs = [subprocess.Popen([sys.executable, "-c", RANK_CODE, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
                 for r in range(ranks)]
        results = [p.communicate(timeout=900) for p in procs]
        outs = [out for out, _ in results]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}\n{results[0][1][-2000:]}")
        if with_heartbeat and not any(Path(tmp).glob("rank_*.heartbeat.json")):
            raise SystemExit("the heartbeat wrote no file: the benchmark would measure nothing")
        return max(float(line.split()[1]) for out in outs for line in out.splitlines()
                   if line.startswith("BENCH_STEP_S"))


def micro() -> tuple[float, float]:
    """ns per ddpslurm.heartbeat() call; us per thread look (count + atomic write of the progress file)."""
    import json

    from ddpslurm.launch import heartbeat

    calls = 1_000_000
    started = time.perf_counter()
    for _ in range(calls):
        heartbeat.heartbeat()
    per_call_ns = (time.perf_counter() - started) / calls * 1e9
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank_0.heartbeat.json"
        looks = 2000
        started = time.perf_counter()
        for i in range(looks):
            record = heartbeat.progress_record(0, heartbeat.collective_count(), i, time.time())
            heartbeat._write_atomic(path, json.dumps(record))
        per_look_us = (time.perf_counter() - started) / looks * 1e6
    return per_call_ns, per_look_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for with_heartbeat in (False, True):  # alternated, so drifts of a shared machine hit both alike
            times[with_heartbeat].append(run_once(args.ranks, args.steps, with_heartbeat) * 1e3)
    off, on = (statistics.median(times[flag]) for flag in (False, True))
    best_off, best_on = (min(times[flag]) for flag in (False, True))  # the least disturbed run of each
    per_call_ns, per_look_us = micro()
    print(f"examples/train.py, {args.ranks} gloo ranks on this machine ({os.cpu_count()} CPUs), {args.steps} steps a "
          f"run: median time between optimizer steps, median of {args.repeats} runs")
    print(f"  without heartbeat: {off:.3f} ms/step   repeats {[round(t, 3) for t in times[False]]}")
    print(f"  with heartbeat:    {on:.3f} ms/step   repeats {[round(t, 3) for t in times[True]]}")
    print(f"  difference:        {on - off:+.3f} ms/step ({(on - off) / off * 100:+.2f}%) of the medians, "
          f"{best_on - best_off:+.3f} ms/step ({(best_on - best_off) / best_off * 100:+.2f}%) of the fastest")
    print(f"  ddpslurm.heartbeat(): {per_call_ns:.0f} ns/call; one thread look (count + write): {per_look_us:.0f} us, "
          f"once per second = {per_look_us / 1e4:.4f}% of a core")


if __name__ == "__main__":
    main()
