"""A tiny gloo DDP job for ddpslurm's integration tests: env:// init, N steps, checkpoint + resume.

Every rank prints a final JSON line {"rank", "steps", "start_step", "param_hash"}. On the preemption
flag (agreed across ranks through an all_reduce, so all ranks stop at the same step) it saves a
checkpoint and returns; the worker then requeues the job.
"""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist

import ddpslurm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt_dir = os.path.join(os.environ.get("DDPSLURM_JOB_FOLDER", "."), "checkpoints")
    ckpt = os.path.join(ckpt_dir, "state.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    print(json.dumps({"event": "resume", "rank": rank, "start_step": start}), flush=True)
    step = start
    while step < args.steps:
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 8, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if args.step_sleep:
            time.sleep(args.step_sleep)
        stop = torch.tensor([1 if ddpslurm.preemption_requested() else 0])
        dist.all_reduce(stop)
        if step % args.checkpoint_every == 0 or stop.item():
            if rank == 0:
                os.makedirs(ckpt_dir, exist_ok=True)
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            dist.barrier()
        if stop.item():
            print(json.dumps({"event": "preempted", "rank": rank, "step": step}), flush=True)
            dist.destroy_process_group()
            return
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(json.dumps({"event": "done", "rank": rank, "world_size": world, "steps": step, "start_step": start,
                      "param_hash": digest}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
