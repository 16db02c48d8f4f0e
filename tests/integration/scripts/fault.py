"""Fault injection for ddpslurm's integration tests: a gloo DDP loop in which one rank fails.

--mode raise: rank --rank raises RuntimeError at step --at; --mode sigkill: it SIGKILLs itself;
--mode exit: it calls sys.exit(3). Every rank prints the unix time of the fault it causes or sees.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["raise", "sigkill", "exit"], required=True)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--at", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    dist.init_process_group("gloo")  # ddpslurm: ignore[DDP010] the tests rely on the worker's DDPSLURM_PG_TIMEOUT
    rank = dist.get_rank()
    value = torch.ones(4)
    for step in range(args.steps):
        if rank == args.rank and step == args.at:
            print(json.dumps({"event": "fault", "rank": rank, "mode": args.mode, "unix": time.time()}), flush=True)
            if args.mode == "raise":
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            if args.mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.exit(3)
        dist.all_reduce(value)
        value.fill_(1.0)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
