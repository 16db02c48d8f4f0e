"""A DDP loop whose checkpoint save, once it has read the preemption flag, takes `--save-s` seconds.

`--save-s 100,2`: 100 s in attempt 0, 2 s from attempt 1 on (the last value repeats). Each rank writes
its shard to a temporary file, sleeps out the save time (a large sharded save to a slow filesystem), then
renames it; after a barrier rank 0 writes `step.json`, which is what makes the checkpoint. A rank cut
during the save leaves no new `step.json`: the next attempt starts from the checkpoint before (step 0).
Prints JSON events (`resumed`, `saving`, `saved`, `final`) into the rank logs.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import ddpslurm

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--step-sleep", type=float, default=0.2)
parser.add_argument("--save-s", default="100")
args = parser.parse_args()

dist.init_process_group("gloo")  # ddpslurm: ignore[DDP010] the worker's DDPSLURM_PG_TIMEOUT outlasts the save
rank = dist.get_rank()
attempt = int(os.environ.get("DDPSLURM_ATTEMPT", "0"))
save_times = [float(v) for v in args.save_s.split(",")]
save_s = save_times[min(attempt, len(save_times) - 1)]
folder = Path(os.environ["DDPSLURM_JOB_FOLDER"]) / "checkpoints"
marker = folder / "step.json"
step = json.loads(marker.read_text())["step"] if marker.exists() else 0
weights = torch.load(folder / f"shard_{rank}.pt", weights_only=True) if step else torch.zeros(4)


def event(name: str, **fields: object) -> None:
    print(json.dumps({"event": name, "rank": rank, "attempt": attempt, "step": step, "unix": time.time(),
                      **fields}), flush=True)


def save() -> None:
    event("saving", seconds=save_s)
    tmp = folder / f".shard_{rank}.pt.partial"
    torch.save(weights, tmp)
    deadline = time.time() + save_s
    while time.time() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.time())))
    os.replace(tmp, folder / f"shard_{rank}.pt")
    dist.barrier()
    if rank == 0:
        partial = folder / ".step.json.partial"
        partial.write_text(json.dumps({"step": step}))
        os.replace(partial, marker)
    dist.barrier()
    event("saved")


event("resumed")
while step < args.steps:
    flag = torch.tensor([1.0 if ddpslurm.preemption_requested() else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        save()
        break
    weights += 1
    step += 1
    if step % 5 == 0:
        print(f"step {step}", flush=True)
    time.sleep(args.step_sleep)
else:
    event("final", weights=weights.tolist())
dist.destroy_process_group()
