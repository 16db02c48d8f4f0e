"""A tiny env:// DDP training script with one injectable fault, for the failure lab.

It follows the pattern of examples/train.py (env:// init, gloo, a tiny model on synthetic data,
DistributedSampler) and knows nothing of ddpslurm. One rank (`--fault-rank`, its GLOBAL rank as
launched) gets the fault; every other rank trains normally, so what they log is what real victims log.

    ddp_fault.py --fault raise --fault-rank 3 --fault-step 5 --timeout 20
    ddp_fault.py --device cuda --backend nccl --fault cuda-oom --fault-rank 0   # on a GPU machine

With `--device cuda` every rank trains on `cuda:LOCAL_RANK % device count` (ranks share GPUs when there are
fewer GPUs than ranks: real NCCL refuses that with its duplicate-GPU error, gloo accepts it).

Faults before init (the rank's own configuration is wrong, or it is late):
  bad-master-addr ARG   MASTER_ADDR := ARG on the faulty rank (an address where nothing listens)
  bad-ifname ARG        GLOO_SOCKET_IFNAME := ARG on the faulty rank (an interface that does not exist)
  duplicate-rank ARG    RANK := ARG on the faulty rank (another rank's number)
  world-size ARG        WORLD_SIZE := ARG on EVERY rank (more ranks than were launched)
  late-start ARG        the faulty rank sleeps ARG seconds before init_process_group
Faults in the training loop at `--fault-step` on the faulty rank:
  raise                 raise an exception (the others wait in the gradient all_reduce)
  segfault              dereference NULL (SIGSEGV)
  sigkill               the rank SIGKILLs itself (what the OOM killer or an admin's `kill -9` does to it)
  sigabrt               os.abort(): the rank dies of SIGABRT (as on a failed native assertion)
  hang ARG              sleep ARG seconds inside the step (the others' collectives time out)
  shape-mismatch [ARG]  all_reduce a metric tensor of ARG (default 5) floats where the others use 4
  op-mismatch           broadcast where the other ranks all_reduce
  unused-params         skip a submodule in forward (DDP without find_unused_parameters)
  oom                   allocate and touch memory until the kernel / Slurm kills the rank
  oom-cgroup [ARG]      first confine the rank to a memory cgroup of ARG MiB (default 700, as Slurm's
                        task/cgroup would), then allocate: the kernel's OOM killer kills the rank
  dataloader-kill       the rank's DataLoader worker dies by SIGKILL while loading a batch
  dataloader-straggler ARG  the rank's DataLoader worker sleeps ARG seconds (default 600) loading the batch of
                        the fault step, so the rank never reaches that step's collectives: the others time out
  shm                   the rank's DataLoader worker gets a tiny private /dev/shm (mount namespace)
  cuda-oom              allocate 1 GiB blocks on the rank's GPU until the CUDA caching allocator raises
                        torch.OutOfMemoryError (needs --device cuda)
  device-assert         index out of bounds inside a CUDA kernel: "CUDA error: device-side assert triggered"
                        (needs --device cuda)
  gpu-hang ARG          a CUDA kernel that spins about ARG seconds (default 600) on the rank's stream: the step's
                        collectives queue behind it (a stuck kernel; needs --device cuda)
  none                  no fault (a healthy run; also what scancel/time-limit/node/external-kill scenarios use)
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import signal
import sys
import time

PRE_INIT_FAULTS = ("bad-master-addr", "bad-ifname", "duplicate-rank", "world-size", "late-start")
LOOP_FAULTS = ("raise", "segfault", "sigkill", "sigabrt", "hang", "shape-mismatch", "op-mismatch", "unused-params",
               "oom", "oom-cgroup", "dataloader-kill", "dataloader-straggler", "shm", "cuda-oom", "device-assert",
               "gpu-hang")
LOADER_FAULTS = ("dataloader-kill", "dataloader-straggler", "shm")  # faults that need a DataLoader worker
CUDA_FAULTS = ("cuda-oom", "device-assert", "gpu-hang")  # faults that need --device cuda
CGROUP_PREFIX = "ddpslurm-lab-"
FAULTS = ("none", *PRE_INIT_FAULTS, *LOOP_FAULTS)
METRIC_SIZE = 4
#: Slurm variables that stand in for torch's when the script runs under plain srun (no launcher).
SLURM_FALLBACK = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_NTASKS", "LOCAL_RANK": "SLURM_LOCALID"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: training knobs and the one fault."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--fault-rank", type=int, default=-1, help="global rank (as launched) that gets the fault")
    p.add_argument("--fault-step", type=int, default=3, help="training step at which a loop fault fires")
    p.add_argument("--fault-arg", default="", help="the fault's argument (address, interface, seconds, rank)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model trains (cuda: cuda:LOCAL_RANK modulo the GPUs this process sees)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="the process group's backend")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--step-sleep", type=float, default=0.2, help="seconds per step, to make a job last")
    p.add_argument("--timeout", type=float, default=20.0, help="process-group timeout in seconds")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (the dataloader faults use 1)")
    p.add_argument("--no-ddp", action="store_true",
                   help="average gradients with one all_reduce per parameter instead of DDP (TORCH_DISTRIBUTED_DEBUG="
                        "DETAIL crashes DDP's constructor on torch 2.13 CPU, but checks plain collectives)")
    p.add_argument("--ignore-usr2", action="store_true",
                   help="ignore SIGUSR2 (as scripts with their own signal handling do), so no launcher sees it")
    p.add_argument("--no-metric", action="store_true",
                   help="skip the per-step loss all_reduce (so DDP's own reducer is the only collective)")
    args = p.parse_args(argv)
    if args.device == "cpu" and (args.backend == "nccl" or args.fault in CUDA_FAULTS):
        p.error(f"--backend {args.backend} --fault {args.fault} needs --device cuda")
    return args


def fill_env_from_slurm(environ: dict[str, str]) -> None:
    """Under plain srun (no ddpslurm, no torchrun), take RANK and friends from Slurm's variables."""
    for torch_name, slurm_name in SLURM_FALLBACK.items():
        if torch_name not in environ and slurm_name in environ:
            environ[torch_name] = environ[slurm_name]


def inject_before_init(args: argparse.Namespace, faulty: bool) -> None:
    """Pre-init faults: a wrong setting in this rank's environment, or a late start."""
    if args.fault == "world-size":
        os.environ["WORLD_SIZE"] = args.fault_arg  # ddpslurm: ignore[DDP004] the injected fault
    if not faulty:
        return
    if args.fault == "bad-master-addr":
        os.environ["MASTER_ADDR"] = args.fault_arg  # ddpslurm: ignore[DDP004] the injected fault
    elif args.fault == "bad-ifname":
        os.environ["GLOO_SOCKET_IFNAME"] = args.fault_arg
    elif args.fault == "duplicate-rank":
        os.environ["RANK"] = args.fault_arg  # ddpslurm: ignore[DDP004] the injected fault
    elif args.fault == "late-start":
        time.sleep(float(args.fault_arg))


def eat_memory() -> None:
    """Allocate and touch 64 MiB chunks until the process is killed (by the kernel or by Slurm)."""
    hog = []
    while True:
        chunk = bytearray(64 << 20)
        for i in range(0, len(chunk), 4096):
            chunk[i] = 1
        hog.append(chunk)
        time.sleep(0.05)  # ~1 GiB/s: Slurm's memory accounting (every 2 s here) sees it before the host does


def confine_memory(limit_mib: int) -> None:
    """Move this process into a new memory cgroup (child of its own) capped at `limit_mib` MiB."""
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    with open("/proc/self/cgroup") as handle:
        entries = [line.rstrip("\n").split(":", 2) for line in handle]
    if v2:
        parent = next(path for _, controllers, path in entries if controllers == "")
        base, limit_file = "/sys/fs/cgroup", "memory.max"
    else:
        parent = next(path for _, controllers, path in entries if "memory" in controllers.split(","))
        base, limit_file = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
    group = os.path.join(base + parent, f"{CGROUP_PREFIX}{os.getpid()}")
    os.mkdir(group)
    with open(os.path.join(group, limit_file), "w") as handle:
        handle.write(str(limit_mib << 20))
    with open(os.path.join(group, "cgroup.procs"), "w") as handle:
        handle.write(str(os.getpid()))


def exhaust_gpu_memory(device) -> None:
    """Hold 1 GiB blocks on `device` until the caching allocator raises torch.OutOfMemoryError (not caught)."""
    import torch

    hog = []
    while True:
        hog.append(torch.empty(1 << 30, dtype=torch.uint8, device=device))


def trip_device_assert(device) -> None:
    """Gather with an out-of-range index inside a kernel; the synchronize surfaces the device-side assert."""
    import torch

    table = torch.arange(4, device=device)
    table[torch.tensor([4 + 1000], device=device)].sum()
    torch.cuda.synchronize(device)


def spin_gpu(device, seconds: float) -> None:
    """Queue a kernel that busy-waits about `seconds` on the current stream (torch's own test helper; ~2 GHz)."""
    import torch

    with torch.cuda.device(device):
        torch.cuda._sleep(int(seconds * 2e9))


def pick_device(args: argparse.Namespace):
    """cpu, or this rank's GPU: cuda:LOCAL_RANK modulo the GPUs it sees (set as the current device)."""
    import torch

    if args.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("ddp_fault.py: --device cuda, but torch sees no GPU (CUDA_VISIBLE_DEVICES, driver)")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def tiny_shm_worker_init(worker_id: int) -> None:
    """DataLoader worker_init_fn: give this worker a private 64 KiB /dev/shm (needs CAP_SYS_ADMIN).

    Runs in the freshly forked worker, which is single-threaded, so unshare(CLONE_NEWNS) is allowed.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_rec, ms_private = 0x00020000, 0x4000, 0x40000
    if libc.unshare(clone_newns) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    if libc.mount(b"none", b"/", None, ms_rec | ms_private, None) != 0:
        raise OSError(ctypes.get_errno(), "making / private failed")
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=64k") != 0:
        raise OSError(ctypes.get_errno(), "mounting a small /dev/shm failed")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fill_env_from_slurm(os.environ)  # type: ignore[arg-type]
    if args.ignore_usr2:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    launched_rank = int(os.environ["RANK"])
    faulty = launched_rank == args.fault_rank
    inject_before_init(args, faulty)

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    torch.set_num_threads(1)

    class Synthetic(Dataset):
        """A deterministic regression set; item `kill_at` SIGKILLs the worker that loads it, item `stall_at`
        makes it sleep `stall_s` seconds."""

        def __init__(self, n: int, width: int = 16) -> None:
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(n, width, generator=g)
            self.y = self.x.sum(dim=1, keepdim=True)
            self.kill_at = self.stall_at = -1
            self.stall_s = 0.0

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int):
            if i == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if i == self.stall_at:
                time.sleep(self.stall_s)
            return self.x[i], self.y[i]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(16, 16)
            self.extra = nn.Linear(16, 16)
            self.head = nn.Linear(16, 1)

        def forward(self, x, skip_extra: bool = False):
            h = torch.relu(self.body(x))
            if not skip_extra:
                h = h + torch.relu(self.extra(h))
            return self.head(h)

    device = pick_device(args)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} on {os.uname().nodename} pid {os.getpid()} device {device}: process group ready",
          flush=True)

    torch.manual_seed(0)
    net = Net().to(device)
    model = net if args.no_ddp else DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    workers = args.workers or (1 if faulty and args.fault in LOADER_FAULTS else 0)
    per_rank = args.batch_size * (args.steps + 1)
    data = Synthetic(per_rank * world)
    if faulty and args.fault in ("dataloader-kill", "dataloader-straggler"):
        sampler_order = list(DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False))
        first_item_of_fault_step = sampler_order[args.fault_step * args.batch_size]
        if args.fault == "dataloader-kill":
            data.kill_at = first_item_of_fault_step
        else:
            data.stall_at, data.stall_s = first_item_of_fault_step, float(args.fault_arg or 600)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    shm_fault = faulty and args.fault == "shm"
    batch_size = 4096 if shm_fault else args.batch_size  # a batch far larger than the 64 KiB /dev/shm
    if shm_fault:
        data = Synthetic(batch_size * 2)
        sampler = None
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler, num_workers=workers,
                        worker_init_fn=tiny_shm_worker_init if shm_fault else None)

    loss = torch.zeros((), device=device)
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        x, y = x[: args.batch_size].to(device), y[: args.batch_size].to(device)
        fire = faulty and step == args.fault_step
        if fire and args.fault == "raise":
            raise ValueError(f"lab fault: bad batch at step {step}")
        if fire and args.fault == "segfault":
            ctypes.string_at(0)
        if fire and args.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fire and args.fault == "sigabrt":
            os.abort()
        if fire and args.fault == "hang":
            time.sleep(float(args.fault_arg or 3600))
        if fire and args.fault == "oom-cgroup":
            confine_memory(int(args.fault_arg or 700))
        if fire and args.fault in ("oom", "oom-cgroup"):
            eat_memory()
        if fire and args.fault == "cuda-oom":
            exhaust_gpu_memory(device)
        if fire and args.fault == "device-assert":
            trip_device_assert(device)
        if fire and args.fault == "gpu-hang":
            spin_gpu(device, float(args.fault_arg or 600))
        out = model(x, skip_extra=fire and args.fault == "unused-params")
        loss = nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        if args.no_ddp:
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world
        opt.step()
        if args.no_metric:
            time.sleep(args.step_sleep)
            continue
        size = int(args.fault_arg or METRIC_SIZE + 1) if fire and args.fault == "shape-mismatch" else METRIC_SIZE
        metric = torch.full((size,), loss.item(), device=device)
        if fire and args.fault == "op-mismatch":
            dist.broadcast(metric, src=0)
        else:
            dist.all_reduce(metric)
        if rank == 0:
            print(f"step {step} loss {metric[0].item() / world:.4f}", flush=True)
        time.sleep(args.step_sleep)

    dist.barrier()
    print(f"rank {rank} done, final loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
