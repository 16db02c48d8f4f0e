"""A DDP loop that knows nothing of ddpslurm: it never looks at the preemption flag and never ends."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # ddpslurm: ignore[DDP010] the tests rely on the worker's DDPSLURM_PG_TIMEOUT
value = torch.ones(1)
step = 0
while True:
    dist.all_reduce(value)
    value.fill_(1.0)
    step += 1
    if step % 10 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.2)
