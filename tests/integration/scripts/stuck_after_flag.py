"""A DDP loop that reads the preemption flag and then hangs in mismatched collectives on every rank.

Rank 0 enters an all_reduce, the others wait for a message rank 0 never sends: as when rank 0 is stuck
in a collective at the time limit. Nothing returns to Python, so only the batch step can still requeue the job.
"""

import time

import torch
import torch.distributed as dist

import ddpslurm

dist.init_process_group("gloo")  # ddpslurm: ignore[DDP010] the tests rely on the worker's DDPSLURM_PG_TIMEOUT
rank = dist.get_rank()
value = torch.zeros(1)
step = 0
while True:
    value.fill_(1.0 if ddpslurm.preemption_requested() else 0.0)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    if value.item():
        print(f"rank {rank}: flag read at step {step}; now stuck in a collective", flush=True)
        if rank == 0:
            dist.all_reduce(torch.ones(1))  # ddpslurm: ignore[DDP002] the hang this script exists to cause
        else:
            dist.recv(torch.zeros(1), src=0)
    step += 1
    if step % 10 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.2)
