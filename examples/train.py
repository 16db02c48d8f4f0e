#!/usr/bin/env python3
"""A small but real PyTorch DDP training script. It knows nothing about Slurm or ddpslurm's launcher.

Run it the way any DDP script runs: with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK)
in the environment (torchrun, `ddpslurm submit`, or an sbatch script that exports them), or alone as a
single process:

    python examples/train.py --epochs 2 --steps-per-epoch 20
    torchrun --nproc-per-node 2 examples/train.py
    ddpslurm submit examples/train.py --nodes 2 -- --epochs 3 --step-sleep 0.5

What it shows:
- env:// initialisation; gloo on CPU, NCCL when CUDA is available (one GPU per rank, LOCAL_RANK).
- a deterministic synthetic dataset, DistributedSampler and `set_epoch` so every epoch reshuffles.
- rank-0 checkpoints every `--checkpoint-every` steps, written atomically (temporary file + rename),
  followed by a barrier; on start every rank resumes from the last checkpoint in `--checkpoint-dir`
  (default `$DDPSLURM_JOB_FOLDER/checkpoints`, else `./checkpoints`). A resumed run ends with exactly
  the parameters of an uninterrupted one.
- preemption at step boundaries: when `import ddpslurm` works, `ddpslurm.preemption_requested()` is
  asked after every step; the ranks agree on it with one all-reduce, rank 0 saves a checkpoint and
  the script exits with status 0 (PREEMPTED_EXIT_CODE). The launcher requeues the job; the next attempt
  resumes from that checkpoint.
- in-place restarts (`ddpslurm submit --max-restarts N`): torchrun starts the script again after a worker failed,
  in the same job; it resumes from its checkpoint exactly as after a requeue, and logs DDPSLURM_RESTART_COUNT.
- at the end every rank prints one JSON line, e.g.
  {"event": "final", "status": "done", "rank": 1, "world_size": 4, "step": 40, "params_sha256": "..."}
  so a test (or a person) can check that all ranks ended with identical parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

#: Exit status after a preemption checkpoint: a normal exit, the launcher decides to requeue.
PREEMPTED_EXIT_CODE = 0
CHECKPOINT_NAME = "last.pt"
FEATURES = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=20, help="batches per rank per epoch")
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (slow jobs for tests)")
    parser.add_argument("--log-every", type=int, default=10, help="rank 0 logs the loss every this many steps")
    parser.add_argument("--checkpoint-every", type=int, default=10,
                        help="steps between checkpoints (0: at the end only)")
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for init and each collective")
    parser.add_argument("--final-save-sleep", type=float, default=0.0,
                        help="seconds rank 0's final save takes on top, while the other ranks return without "
                             "waiting for it (tests: a slow final save or evaluation on rank 0 only)")
    args = parser.parse_args(argv)
    if args.checkpoint_dir is None:
        job_folder = os.environ.get("DDPSLURM_JOB_FOLDER")
        args.checkpoint_dir = Path(job_folder) / "checkpoints" if job_folder else Path("checkpoints")
    for name in ("epochs", "steps_per_epoch", "batch_size", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


_stop_signal_received = False


def _on_stop_signal(signum: int, frame: object) -> None:
    global _stop_signal_received
    _stop_signal_received = True
    # The sbatch template repeats USR2 until the step ends; ignore the repeats, also during interpreter
    # shutdown (which would otherwise put the default, fatal action back).
    signal.signal(signum, signal.SIG_IGN)


def install_stop_handler() -> None:
    """Under a plain sbatch script (sbatch_templates/requeue.sbatch forwards USR2 to every rank, which
    start with USR2 ignored) nobody handles USR2: make it set a flag. ddpslurm's worker's handler is kept."""
    if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, signal.SIG_IGN):
        signal.signal(signal.SIGUSR2, _on_stop_signal)


def preemption_requested() -> bool:
    """USR2 seen by our own handler, or ddpslurm's flag when ddpslurm is installed."""
    if _stop_signal_received:
        return True
    try:
        import ddpslurm
    except ImportError:
        return False
    return ddpslurm.preemption_requested()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(timeout_s: float) -> tuple[int, int, torch.device]:
    """env:// initialisation; a plain `python train.py` becomes a world of one."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", str(_free_port())))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), device


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    """y = x @ w + noise, the same on every rank and every run."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    y = x @ w + 0.1 * torch.randn(samples, 1, generator=gen)
    return TensorDataset(x, y)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def params_sha256(model: nn.Module) -> str:
    """sha256 of the bytes of all parameters, in order: equal on all ranks iff the replicas agree."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_checkpoint(folder: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / CHECKPOINT_NAME
    tmp = folder / f".{CHECKPOINT_NAME}.{os.getpid()}.tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, final)
    return final


def load_checkpoint(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore the last checkpoint if there is one; returns the step to continue from."""
    path = folder / CHECKPOINT_NAME
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)  # weights_only: never unpickle code
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def agree(flag: bool, device: torch.device) -> bool:
    """True on every rank if it is true on any rank, so all ranks stop at the same step."""
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def log(rank: int, message: str) -> None:
    if rank == 0:
        print(f"[train] {message}", flush=True)


def train(args: argparse.Namespace) -> int:
    install_stop_handler()
    rank, world_size, device = init_distributed(args.timeout)
    dataset = synthetic_dataset(args.steps_per_epoch * args.batch_size * world_size, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = make_model(args.seed).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = load_checkpoint(args.checkpoint_dir, model, optimizer)
    if step:
        log(rank, f"resumed from {args.checkpoint_dir / CHECKPOINT_NAME} at step {step}")
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss_fn = nn.MSELoss()
    total_steps = args.epochs * args.steps_per_epoch
    restart = int(os.environ.get("DDPSLURM_RESTART_COUNT", "0"))  # in-place restarts so far (torchrun)
    log(rank, f"world_size={world_size} backend={dist.get_backend()} steps={step}->{total_steps} restart={restart}")

    status, loss = "done", float("nan")
    while step < total_steps:
        epoch, skip = divmod(step, args.steps_per_epoch)
        sampler.set_epoch(epoch)
        for index, (x, y) in enumerate(loader):
            if index < skip:  # the part of this epoch done before the checkpoint we resumed from
                continue
            optimizer.zero_grad(set_to_none=True)
            batch_loss = loss_fn(ddp(x.to(device)), y.to(device))
            batch_loss.backward()
            optimizer.step()
            step, loss = step + 1, batch_loss.item()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if step % args.log_every == 0 or step == total_steps:
                log(rank, f"epoch {epoch} step {step} loss {loss:.5f}")

            stop = agree(preemption_requested(), device)
            if stop or step == total_steps or (args.checkpoint_every and step % args.checkpoint_every == 0):
                if rank == 0:
                    save_checkpoint(args.checkpoint_dir, step, model, optimizer)
                    if step == total_steps and args.final_save_sleep:
                        time.sleep(args.final_save_sleep)
                if step < total_steps or not args.final_save_sleep:
                    dist.barrier()  # nobody goes on (or exits) before the checkpoint is on disk
            if stop:
                status = "preempted"
                log(rank, f"preemption requested: checkpoint at step {step} saved, exiting for requeue")
                break
        if status == "preempted":
            break

    print(json.dumps({"event": "final", "status": status, "rank": rank, "world_size": world_size, "step": step,
                      "loss": loss, "params_sha256": params_sha256(model), "host": socket.gethostname(),
                      "restart": restart}),
          flush=True)
    # DDP holds the process group: drop it first, so that the group (and gloo's worker threads) is torn down here,
    # not during interpreter shutdown, where torch's gloo may abort ("terminate called without an active exception")
    del ddp
    dist.destroy_process_group()
    return PREEMPTED_EXIT_CODE if status == "preempted" else 0


def main(argv: list[str] | None = None) -> int:
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
