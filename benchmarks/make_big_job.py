"""Generate a large, realistic failed-job folder for the analyzer benchmark.

    python benchmarks/make_big_job.py --ranks 512 --gb 1.0 --out .bench/big_job [--seed 7] [--gpus-per-node 8]
                                      [--layout submitit|torchrun|logdir|merged] [--culprit R]
                                      [--scenario oom|straggler|memkill|ibfail|segv|inithang|latelost|desync]

`--layout submitit` (default) writes `<jobid>_<rank>_log.out/.err`, one task per GPU, as `ddpslurm submit` runs it;
`--layout torchrun` writes one pair per node (srun one task per node running torchrun --tee: lines prefixed
`[defaultL]:[rankR]:`, the agent's SIGTERM lines at the end); `--layout logdir` writes torchrun --log-dir's folder
per worker (`none_<random>/attempt_0/<local rank>/stdout.log` and `stderr.log`, one agent per node, srun's and the
agents' lines in `slurm-<jobid>.out`); `--layout merged` writes one `slurm-<jobid>.out` for
the whole job (sbatch's default output with srun --label: every line `R: `, start-up, training, then errors). Per
rank: an NCCL_DEBUG=INFO init of a few hundred
lines (bootstrap, NET/IB, Channel/Ring/Tree, Init COMPLETE with the comm rank mapping), training progress lines
with timestamps up to the requested size, occasional benign warnings, and one planted failure on `--culprit`
(default ranks/2 + 3; any rank, e.g. past the 20,000th file): a CUDA OOM (`oom`) or silence (`straggler`), with
torch 2.4 watchdog timeouts on every other rank and srun's exit lines; or (`memkill`, not under torchrun) its memory
cgroup's OOM killer: its log stops mid-training, slurmstepd's `Detected 1 oom_kill event` line, srun's
`task R: Out Of Memory` and one `tasks A-B: Terminated` line per other node, and no error from any other rank;
or (`ibfail`, 3 nodes or more) a failed HCA: its ring peers on two other nodes report InfiniBand completion errors
toward its address (planted: its node, no rank); or (`segv`, 3 nodes or more, srun without --kill-on-bad-exit) a
SIGSEGV: its log stops, srun names its segmentation fault first, the same two peers report the same InfiniBand errors
toward its address 8 s later, every other rank times out (planted: the rank); or (`inithang`, not under torchrun)
the culprit never starts NCCL's init, every other rank logs `Init START` and waits in it (no `Init COMPLETE`, no
training) until Slurm's time limit (planted: the rank, rendezvous_timeout); or (`latelost`, 2 nodes or more) a
straggler whose InfiniBand peer on the next node is gone when it comes back, 100 s after the others timed out and
aborted (planted: the rank, collective_timeout: its lost peer is their abort, not a broken link); or (`desync`,
2 nodes or more) a culprit that never issued the collective the others wait in: torch >= 2.5 with the flight
recorder's dump on timeout, the ranks of even nodes log their watchdog timeout and signal the dump, those of odd
nodes and the culprit log only the dump signal that reached them through the store, each with its last enqueued
work, the culprit's one behind (planted: the rank, collective_timeout).
The planted answer is written to `PLANTED.json` (outside the log layout's name patterns) so the benchmark can check
the diagnosis. Generated data stays out of git (.bench/).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

BUS = ["18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000"]
JOB_ID = 4817203
T0 = datetime(2025, 3, 14, 6, 0, 0, tzinfo=timezone.utc)


def host_of(rank: int, gpn: int) -> str:
    return f"gpu-{rank // gpn + 1:04d}"


def glog_time(when: datetime, rank: int) -> str:
    """torch's C++ log time (`MMDD hh:mm:ss.uuuuuu` and three more digits, here the rank's, to set ranks apart)."""
    return f"{when.month}{when.day:02d} {when:%H:%M:%S}.{when.microsecond:06d}{rank % 1000:03d}"


def address_of(rank: int, gpn: int) -> str:
    """The address NCCL bootstraps on for `rank` (one HCA, one address per GPU)."""
    node = rank // gpn
    return f"10.{100 + node // 250}.{node % 250}.{rank % gpn + 10}"


def ib_reporters(ranks: int, gpn: int, culprit: int) -> list[int]:
    """The ranks that lose their InfiniBand transfers when `culprit`'s HCA fails: its ring peers on the nodes before
    and after its own (`nccl_init`'s second ring), each on another node."""
    return [(culprit - gpn) % ranks, (culprit + gpn) % ranks]


def ib_failure(rank: int, gpn: int, peer: str, when: datetime) -> list[str]:
    """NCCL 2.21's completion error toward `peer` and torch 2.4's abort of the process group on it."""
    host, pid = host_of(rank, gpn), 100000 + rank * 7
    ts = glog_time(when, rank)
    ib = (f"NET/IB : Got completion from peer {peer}<36912> with status=12 opcode=0 len=0 vendor err 129 (Recv) "
          f"localGid ::ffff:{address_of(rank, gpn)} remoteGids::ffff:{peer}")
    return [f"{host}:{pid}:{pid + 70} [{rank % gpn}] transport/net_ib.cc:1696 NCCL WARN {ib}",
            f"[rank{rank}]:[E{ts} ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank {rank}] Process group watchdog "
            "thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL "
            "version 2.21.5",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
            "Last error:", ib]


def nccl_init(rank: int, world: int, gpn: int, nchan: int, rng: random.Random) -> list[str]:
    """NCCL 2.21-style INFO init of one rank: a few hundred lines on 8-GPU nodes."""
    host, dev = host_of(rank, gpn), rank % gpn
    pid = 100000 + rank * 7
    tid = pid + 61
    p0, p = f"{host}:{pid}:{pid} [{dev}] NCCL INFO ", f"{host}:{pid}:{tid} [{dev}] NCCL INFO "
    ip = address_of(rank, gpn)
    ptr = f"0x{rng.getrandbits(44):011x}"
    out = [p0 + f"Bootstrap : Using ib0:{ip}<0>",
           p0 + "NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No "
                "plugin found (libnccl-net.so), using internal implementation",
           p0 + "cudaDriverVersion 12040"]
    if rank == 0:
        out.append("NCCL version 2.21.5+cuda12.4")
    out += [p + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [4]mlx5_4:1/IB "
                f"[5]mlx5_5:1/IB [6]mlx5_6:1/IB [7]mlx5_7:1/IB ; OOB ib0:{ip}<0>",
            p + "Using network IB",
            p + f"ncclCommInitRank comm {ptr} rank {rank} nranks {world} cudaDev {dev} nvmlDev {dev} busId {BUS[dev]} "
                "commId 0x5f1d0c3b2a917e44 - Init START",
            p + f"Setting affinity for GPU {dev} to ffffffff,00000000,ffffffff",
            p + f"NVLS multicast support is not available on dev {dev}",
            p + f"comm {ptr} rank {rank} nRanks {world} nNodes {world // gpn} localRanks {gpn} localRank {dev} MNNVL 0"]
    if rank == 0:
        ring = " ".join(str(i) for i in range(world))
        out += [p + f"Channel {c:02d}/{nchan:02d} : {ring}" for c in range(nchan)]
    parent = -1 if rank == 0 else (rank - 1) // 2
    kids = [k for k in (2 * rank + 1, 2 * rank + 2) if k < world]
    tree = "/".join(str(k) for k in kids + [-1] * (3 - len(kids)))
    out.append(p + "Trees " + " ".join(f"[{c}] {tree}->{rank}->{parent}" for c in range(nchan)))
    out.append(p + "P2P Chunksize set to 524288")
    prev, nxt = (rank - 1) % world, (rank + 1) % world
    for c in range(nchan):
        for peer_prev, peer_next in ((prev, nxt), ((rank + gpn) % world, (rank - gpn) % world)):
            cross_in = peer_prev // gpn != rank // gpn
            cross_out = peer_next // gpn != rank // gpn
            via_in = f"NET/IB/{c % 8}/GDRDMA" if cross_in else "P2P/CUMEM/read"
            via_out = f"NET/IB/{c % 8}/GDRDMA" if cross_out else "P2P/CUMEM/read"
            out.append(p + f"Channel {c:02d}/0 : {peer_prev}[{peer_prev % gpn}] -> {rank}[{dev}] "
                       + ("[receive] " if cross_in else "") + f"via {via_in}")
            out.append(p + f"Channel {c:02d}/0 : {rank}[{dev}] -> {peer_next}[{peer_next % gpn}] "
                       + ("[send] " if cross_out else "") + f"via {via_out}")
    out += [p + "Connected all rings", p + "Connected all trees",
            p + "threadThresholds 8/8/64 | 4096/8/64 | 512 | 512",
            p + f"{nchan} coll channels, {nchan} collnet channels, 0 nvls channels, {nchan} p2p channels, "
                "2 p2p channels per peer",
            p + "TUNER/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file "
                "or directory : when loading libnccl-tuner.so",
            p + "TUNER/Plugin: Using internal tuner plugin.",
            p + f"ncclCommInitRank comm {ptr} rank {rank} nranks {world} cudaDev {dev} nvmlDev {dev} busId {BUS[dev]} "
                "commId 0x5f1d0c3b2a917e44 - Init COMPLETE",
            p + f"Init timings: rank {rank} nranks {world} total 1.84 (kernels 0.21, bootstrap 0.73, allgathers 0.05, "
                "topo 0.41, graphs 0.02, connections 0.40, rest 0.02)"]
    return out


WARNINGS = [
    "[W Utils.hpp:133] Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated; use "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING instead (function getCvarInt)",
    "/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:1399: FutureWarning: "
    "`torch.cpu.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cpu', args...)` instead.",
    "[W reducer.cpp:1400] Warning: find_unused_parameters=True was specified in DDP constructor, but did not find any "
    "unused parameters in the forward pass. This flag results in an extra traversal of the autograd graph every "
    "iteration,  which can adversely affect performance. (function operator())",
]


def progress_block(rank: int, first_step: int, n: int, rng: random.Random) -> str:
    """n training-progress lines (with timestamps) as one string."""
    parts = []
    t = T0 + timedelta(minutes=5, seconds=first_step * 1.5)
    for i in range(n):
        step = first_step + i
        ts = (t + timedelta(seconds=i * 1.5)).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        loss = 2.9 - step * 1e-5 + rng.random() * 0.05
        parts.append(f"{ts} INFO train [rank {rank}]: step {step} | loss {loss:.4f} | lr 3.000e-04 | "
                     f"grad_norm {0.8 + rng.random() * 0.4:.3f} | tokens/s {40000 + rng.randrange(3000)} | "
                     f"mem {61.2 + rng.random():.1f}GiB\n")
        if rng.random() < 0.002:
            parts.append(rng.choice(WARNINGS) + "\n")
    return "".join(parts)


def watchdog(rank: int, seq: int, when: datetime, v3: bool = False) -> list[str]:
    """torch 2.4's watchdog lines for a timeout in work `seq` (`v3`: torch >= 2.5's first two)."""
    ts = glog_time(when, rank)
    w = (f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
         f"NumelIn=25165824, NumelOut=25165824, Timeout(ms)=600000) ran for {600000 + rank % 97} milliseconds "
         "before timing out.")
    pre = f"[rank{rank}]:[E{ts} ProcessGroupNCCL.cpp:"
    if v3:
        return [f"{pre}632] {w}",
                f"{pre}2168] [PG ID 0 PG GUID 0(default_pg) Rank {rank}]  failure detected by watchdog at work "
                f"sequence id: {seq} PG status: last enqueued work: {seq}, last completed work: {seq - 1}"]
    return [f"{pre}607] {w}",
            f"{pre}1664] [PG 0 (default_pg) Rank {rank}] Exception (either an error or timeout) detected by "
            f"watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
            f"{pre}1709] [PG 0 (default_pg) Rank {rank}] Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq}, "
            f"last completed NCCL work: {seq - 1}.",
            f"{pre}621] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
            "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
            f"{pre}627] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  [PG 0 (default_pg) Rank {rank}] Process group watchdog thread terminated with exception: {w}"]


def dump_signal(rank: int, when: datetime, first: int | None, enqueued: int, completed: int) -> list[str]:
    """torch >= 2.5's heartbeat monitor on a rank once the flight recorder's dump signal reached it: from its own
    watchdog (`first` None) or through the TCPStore from rank `first`, with this rank's last enqueued and completed
    work of the default process group."""
    pre = f"[rank{rank}]:[E{glog_time(when, rank)} ProcessGroupNCCL.cpp:"
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
    source = "this local rank" if first is None else f" rank {first}"
    head = [f"{pre}2106] {pg} First PG on this rank to signal dumping."] if first is None else \
        [f"{pre}1922] {pg} Observed flight recorder dump signal from another rank via TCPStore."]
    return [*head,
            f"{pre}1987] {pg} Received a dump signal due to a collective timeout from {source} and we will try our "
            f"best to dump the debug info. Last enqueued NCCL work: {enqueued}, last completed NCCL work: "
            f"{completed}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used "
            "across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some "
            "reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network "
            "errors or bugs in the communications library (e.g. NCCL), etc.",
            f"{pre}1700] {pg} ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1, only active "
            "collectives: 0"]


def desync_first(ranks: int, gpn: int, culprit: int) -> int:
    """The rank whose watchdog fires first in `desync` (the lowest rank on an even node that is not the culprit):
    the one that signals every other rank to dump."""
    return next(r for r in range(ranks) if (r // gpn) % 2 == 0 and r != culprit)


def oom(rank: int, when: datetime) -> list[str]:
    ts = when.strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return [f"submitit ERROR ({ts}) - Submitted job triggered an exception",
            "Traceback (most recent call last):",
            '  File "/home/bench/llm/train.py", line 212, in __call__',
            "    loss = self.step(batch)",
            '  File "/home/bench/llm/model.py", line 88, in forward',
            "    att = (q @ k.transpose(-2, -1)) * self.scale",
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB. GPU {rank % 8} has a total "
            "capacity of 79.10 GiB of which 3.94 GiB is free. Including non-PyTorch memory, this process has "
            "75.15 GiB memory in use. Of the allocated memory 71.62 GiB is allocated by PyTorch, and 2.01 GiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"]


def rank_texts(r: int, ranks: int, gpn: int, per_rank: int, blocks: list[str], rng: random.Random,
               culprit: int, scenario: str, when: datetime, submitit: bool = True) -> tuple[str, list[str]]:
    """One rank's stdout (submitit's JobEnvironment when submitit started the rank, NCCL init, progress up to
    `per_rank` bytes) and its stderr lines."""
    host = host_of(r, gpn)
    stamp = f"submitit INFO ({T0:%Y-%m-%d %H:%M:%S},{r % 1000:03d}) - "
    head = [] if not submitit else [
        f"{stamp}Starting with JobEnvironment(job_id={JOB_ID}, hostname={host}, local_rank={r % gpn}({gpn}), "
        f"node={r // gpn}({ranks // gpn}), global_rank={r}({ranks}))",
        f"{stamp}Loading pickle: /bench/jobs/{JOB_ID}_submitted.pkl"]
    init = nccl_init(r, ranks, gpn, 16, rng)
    if scenario == "inithang":  # NCCL's init blocks every rank until all have joined: nothing after Init START
        init = [] if r == culprit else init[:next(i for i, line in enumerate(init) if "Init START" in line) + 1]
    head += init
    parts = ["\n".join(head) + "\n"]
    if scenario == "inithang":
        return parts[0], [WARNINGS[0]]
    written, k, mine = len(parts[0]), 0, f"[rank {r}]"
    while written < per_rank:
        parts.append(blocks[k % len(blocks)].replace("[rank 999999]", mine))
        written += len(parts[-1])
        k += 1
    err = [WARNINGS[0]]
    if scenario == "ibfail":
        if r in ib_reporters(ranks, gpn, culprit):
            err += ib_failure(r, gpn, address_of(culprit, gpn), when)
    elif scenario == "memkill":
        if r == culprit:  # SIGKILLed mid-training: its log stops early, slurmstepd tells why
            parts = parts[:max(1, len(parts) // 2)]
            err.append(f"slurmstepd: error: Detected 1 oom_kill event in StepId={JOB_ID}.0. Some of the step tasks "
                       "have been OOM Killed.")  # a production build names no node (`slurmstepd-<node>`: test builds)
    elif scenario == "segv":
        if r == culprit:  # SIGSEGV mid-training: the process prints nothing, its log stops; srun tells the signal
            parts = parts[:max(1, len(parts) // 2)]
        elif r in ib_reporters(ranks, gpn, culprit):  # its net peers: the dead process's queue pairs stop answering
            err += ib_failure(r, gpn, address_of(culprit, gpn), when + timedelta(seconds=8))  # IB retries run out
        else:  # the rest hang in their collective until the watchdog fires
            err += watchdog(r, 80001, when + timedelta(seconds=600, milliseconds=200 + r % 900))
    elif scenario == "desync":  # the culprit never issued collective 80001; the dump signal reaches every rank
        first = desync_first(ranks, gpn, culprit)
        signal_at = when + timedelta(seconds=600, milliseconds=200 + first % 900)
        if r == culprit:  # stuck before the collective (a data loader, a deadlock): it enqueued 80000 at most
            err += dump_signal(r, signal_at + timedelta(milliseconds=300), first, 80000, 80000)
        elif (r // gpn) % 2:  # the store's signal came before this rank's own watchdog fired
            err += dump_signal(r, signal_at + timedelta(milliseconds=300), first, 80001, 80000)
        else:
            at = when + timedelta(seconds=600, milliseconds=200 + r % 900)
            err += watchdog(r, 80001, at, v3=True)[:2] + dump_signal(r, at, None, 80001, 80000)
    elif r == culprit and scenario == "oom":
        err += oom(r, when)
    elif r == culprit:
        err.append(f"{when:%Y-%m-%d %H:%M:%S},000 INFO train [rank {r}]: evaluating and saving a checkpoint...")
        if scenario == "latelost":  # back from its checkpoint after the others aborted: its net peer is gone
            peer = address_of((r + gpn) % ranks, gpn)
            err += ib_failure(r, gpn, peer, when + timedelta(seconds=700))
    else:
        err += watchdog(r, 80001, when + timedelta(seconds=600, milliseconds=200 + r % 900))
    return "".join(parts), err


def srun_lines(ranks: int, gpn: int, culprit: int, layout: str, scenario: str = "oom") -> list[str]:
    """srun's exit lines: task ids are ranks (submitit) or node indexes (torchrun, one task per node)."""
    if scenario == "memkill":
        return killed_srun_lines(ranks, gpn, culprit, "Out Of Memory")
    if scenario == "inithang":  # the time limit ends the wait; srun terminates every task, the culprit's too
        at = f"{T0 + timedelta(hours=4, seconds=12):%Y-%m-%dT%H:%M:%S}"
        return [f"slurmstepd: error: *** JOB {JOB_ID} ON {host_of(0, gpn)} CANCELLED AT {at} DUE TO TIME LIMIT ***",
                f"slurmstepd: error: *** STEP {JOB_ID}.0 ON {host_of(0, gpn)} CANCELLED AT {at} DUE TO TIME LIMIT ***",
                *killed_srun_lines(ranks, gpn, culprit, "Terminated")[1:],
                f"srun: error: {host_of(culprit, gpn)}: task {culprit}: Terminated"]
    if scenario == "segv":  # no --kill-on-bad-exit: the signal first, the others' aborts when their watchdog fires
        return killed_srun_lines(ranks, gpn, culprit, "Segmentation fault (core dumped)", "Aborted (core dumped)")
    if scenario in ("desync", "latelost") and layout in AGENT_LAYOUTS:  # the first watchdog's node's agent gives up
        return agent_exit_lines(ranks, gpn, desync_first(ranks, gpn, culprit) // gpn)
    if scenario == "desync":  # every heartbeat monitor aborts its process after the dump, the first rank's first
        return killed_srun_lines(ranks, gpn, desync_first(ranks, gpn, culprit), "Aborted (core dumped)",
                                 "Aborted (core dumped)")
    if scenario == "latelost":  # the others abort at their watchdog timeouts; the straggler aborts 100 s later
        lines = killed_srun_lines(ranks, gpn, culprit, "Aborted (core dumped)", "Aborted (core dumped)")
        return [*lines[1:], lines[0]]
    if scenario == "ibfail":
        return killed_srun_lines(ranks, gpn, ib_reporters(ranks, gpn, culprit)[0], "Aborted (core dumped)")
    if layout in AGENT_LAYOUTS:
        node = culprit // gpn
        return [f"srun: error: {host_of(culprit, gpn)}: task {node}: Exited with exit code 1"]
    return [f"srun: error: {host_of(culprit, gpn)}: task {culprit}: Exited with exit code 1",
            f"srun: error: {host_of(0, gpn)}: tasks 0-{gpn - 1}: Aborted (core dumped)"]


def killed_srun_lines(ranks: int, gpn: int, culprit: int, status: str, others: str = "Terminated") -> list[str]:
    """srun when task `culprit` ended first with `status` (`Out Of Memory`: the OOM killer of the step's memory
    cgroup killed it): that task, then every other task ended with `others`, one line per node (its task ids as
    ranges). `Terminated`: --kill-on-bad-exit, srun aborts the step at once; otherwise the others end on their own."""
    lines = [f"srun: error: {host_of(culprit, gpn)}: task {culprit}: {status}"]
    if others == "Terminated":
        lines.append("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
    for node in range(ranks // gpn):
        first, last = node * gpn, node * gpn + gpn - 1
        if first <= culprit <= last:
            ids = [f"{first}-{culprit - 1}" if culprit - 1 > first else str(first)] if culprit > first else []
            ids += [f"{culprit + 1}-{last}" if last > culprit + 1 else str(last)] if culprit < last else []
            tasks = ",".join(ids)
        else:
            tasks = f"{first}-{last}" if last > first else str(first)
        if tasks:  # a node whose only task was the culprit has nothing left to end
            lines.append(f"srun: error: {host_of(first, gpn)}: {'tasks' if '-' in tasks or ',' in tasks else 'task'} "
                         f"{tasks}: {others}")
    return lines


def agent_exit_lines(ranks: int, gpn: int, first_node: int) -> list[str]:
    """srun under torchrun (one task per node): each node's agent exits 1 once a worker of its node failed and it
    tore the others down, `first_node`'s first, then the others in node order."""
    nodes = [first_node] + [n for n in range(ranks // gpn) if n != first_node]
    return [f"srun: error: {host_of(n * gpn, gpn)}: task {n}: Exited with exit code 1" for n in nodes]


#: torchrun's default run id; each node's agent makes `<run id>_<random>/` under --log-dir
RUN_ID = "none"
#: layouts whose srun tasks are nodes, each running torchrun's agent
AGENT_LAYOUTS = ("torchrun", "logdir")


def agent_suffix(node: int) -> str:
    """The random part of a node's agent folder under --log-dir (tempfile's 8 characters), fixed by the node."""
    return "".join(random.Random(node).choices("abcdefghijklmnopqrstuvwxyz0123456789_", k=8))


def agent_lines(node: int, gpn: int) -> list[str]:
    """torchrun's agent on one node: SIGTERM to its workers, then the failure summary (pids are per rank)."""
    when = T0 + timedelta(hours=17)
    out = []
    for local in range(gpn):
        r = node * gpn + local
        out.append(f"W{when:%m%d %H:%M:%S}.000000 {900000 + node} torch/distributed/elastic/multiprocessing/api.py:"
                   f"897] Sending process {100000 + r * 7} closing signal SIGTERM")
    return out


def generate(out: Path, ranks: int, gb: float, gpn: int, seed: int, *, layout: str = "submitit",
             culprit: int | None = None, scenario: str = "oom") -> dict:
    """Write the job folder; return the planted diagnosis.

    layout `submitit`: one `<job>_<rank>_log.out/.err` pair per rank. layout `torchrun`: one pair per node
    (`<job>_<node>_log.*`, srun one task per node), each rank's lines prefixed `[defaultL]:` (torchrun --tee) and
    C++ lines `[rankR]:`, the agent's SIGTERM lines at the end. layout `logdir`: torchrun --log-dir on a shared file
    system, one agent per node: each worker's `<run>/attempt_0/<local rank>/stdout.log` and `stderr.log` (a folder
    per worker, none naming its rank or node), srun's and the agents' lines in `slurm-<job>.out`. layout `merged`:
    one `slurm-<job>.out` (`_merged`).
    scenario `oom`: a CUDA OOM on `culprit`, watchdog timeouts everywhere else; `straggler`: `culprit` says nothing
    while every other rank times out; `memkill`: the OOM killer of the step's memory cgroup SIGKILLs `culprit`
    mid-training (slurmstepd says so in its log) and srun terminates every other task at once (no rank logs an
    error: NCCL's watchdog never fires); `ibfail`: `culprit`'s HCA fails, its ring peers on the nodes before and after
    its own report InfiniBand completion errors toward its address and abort, srun terminates the rest (the answer
    is its node, no rank: it reported nothing, and whose side of the link broke is not in the logs); `segv`: `culprit`
    dies of SIGSEGV without a word, srun names it first (no --kill-on-bad-exit), the same ring peers report the same
    InfiniBand errors toward its address (a dead process's queue pairs go quiet like a dead HCA's), the rest time out;
    `inithang`: `culprit` never starts NCCL's init (stuck before it: a hung import, a filesystem), every other rank
    logs NCCL's `Init START` and waits in it until Slurm's time limit; `latelost`: `straggler`, and 100 s after
    the others' watchdog timeouts the culprit reports an InfiniBand completion error toward its next node's address;
    `desync`: `culprit` never issues collective 80001; the ranks of even nodes time out in it and signal the flight
    recorder's dump, which reaches the odd nodes' ranks and the culprit through the store first (their last
    enqueued work: 80001, the culprit's 80000).
    """
    culprit = ranks // 2 + 3 if culprit is None else culprit
    if not 0 <= culprit < ranks:
        raise ValueError(f"culprit {culprit} is not a rank of a {ranks}-rank job")
    if scenario in ("memkill", "ibfail", "segv", "inithang") and layout in AGENT_LAYOUTS:
        raise ValueError(f"scenario {scenario} is written for srun tasks that are ranks (submitit, merged), not "
                         "torchrun's")
    if scenario in ("ibfail", "segv") and ranks // gpn < 3:
        raise ValueError(f"scenario {scenario} needs 3 nodes or more: rank {culprit}'s ring peers sit on two other "
                         "nodes")
    if scenario == "latelost" and ranks // gpn < 2:
        raise ValueError("scenario latelost needs 2 nodes or more: the straggler's net peer on another node")
    if scenario == "desync" and ranks // gpn < 2:
        raise ValueError("scenario desync needs 2 nodes or more: the ranks of odd nodes learn of the timeout "
                         "through the store")
    out.mkdir(parents=True, exist_ok=True)  # only now: a bad argument leaves an earlier job there
    for old in [*out.glob(f"{JOB_ID}_*_log.*"), *out.glob("slurm-*.out")]:
        old.unlink()
    for old in out.glob(f"{RUN_ID}_*"):
        shutil.rmtree(old)
    rng = random.Random(seed)
    per_rank = int(gb * 1e9 / ranks)
    when = T0 + timedelta(minutes=5, seconds=40000 * 1.5 + 0.8)
    # a few distinct progress blocks, re-used with the rank substituted: fast and still varied
    blocks = [progress_block(999999, k * 500, 500, random.Random(seed + k)) for k in range(8)]
    node_out: list[str] = []
    node_err: list[str] = []
    if layout == "merged":
        _merged(out, ranks, gpn, per_rank, blocks, rng, culprit, scenario, when)
    for r in range(ranks if layout != "merged" else 0):
        text, err = rank_texts(r, ranks, gpn, per_rank, blocks, rng, culprit, scenario, when, layout == "submitit")
        if r == 0:
            err += srun_lines(ranks, gpn, culprit, layout, scenario)
        if layout == "submitit":
            (out / f"{JOB_ID}_{r}_log.out").write_text(text)
            (out / f"{JOB_ID}_{r}_log.err").write_text("\n".join(err) + "\n")
            continue
        if layout == "logdir":
            worker = out / f"{RUN_ID}_{agent_suffix(r // gpn)}" / "attempt_0" / str(r % gpn)
            worker.mkdir(parents=True)
            (worker / "stdout.log").write_text(text)
            (worker / "stderr.log").write_text("".join(line + "\n" for line in err if not line.startswith("srun: ")))
            node_err += [line for line in err if line.startswith("srun: ")]
            if r % gpn == gpn - 1:
                node_err += agent_lines(r // gpn, gpn)
            continue
        tag = f"[default{r % gpn}]:"
        ranked = tag + (f"[rank{r}]:" if r else "")  # torch >= 2.2 names non-zero ranks; C++ lines already do
        node_out.append(ranked + text[:-1].replace("\n", "\n" + ranked) + "\n")
        node_err += [(tag if line.startswith("[rank") else ranked) + line for line in err
                     if not line.startswith("srun: ")]
        node_err += [line for line in err if line.startswith("srun: ")]
        if r % gpn == gpn - 1:
            node = r // gpn
            (out / f"{JOB_ID}_{node}_log.out").write_text("".join(node_out))
            node_err += agent_lines(node, gpn)
            (out / f"{JOB_ID}_{node}_log.err").write_text("\n".join(node_err) + "\n")
            node_out, node_err = [], []
    if layout == "logdir":
        (out / f"slurm-{JOB_ID}.out").write_text("\n".join(node_err) + "\n")
    cause = {"oom": "cuda_oom", "memkill": "host_oom", "ibfail": "infiniband_error",
             "segv": "segfault", "inithang": "rendezvous_timeout"}.get(scenario, "collective_timeout")
    planted = {"cause": cause, "first_failing_rank": None if scenario == "ibfail" else culprit,
               "first_failing_host": host_of(culprit, gpn),
               "ranks": ranks, "gpus_per_node": gpn, "seed": seed, "layout": layout, "scenario": scenario}
    (out / "PLANTED.json").write_text(json.dumps(planted, indent=2) + "\n")
    return planted


def _merged(out: Path, ranks: int, gpn: int, per_rank: int, blocks: list[str], rng: random.Random, culprit: int,
            scenario: str, when: datetime) -> None:
    """One `slurm-<job>.out` for the whole job (sbatch's default output, srun --label: every line `R: `): every
    rank's start-up lines, then every rank's training lines, then every rank's errors, then srun's exit lines, as
    time orders them. Written rank by rank, phase by phase, so that memory holds one rank's text at a time."""
    path = out / f"slurm-{JOB_ID}.out"
    texts = {}
    with path.open("w") as handle:
        for phase in ("init", "train", "errors"):
            for r in range(ranks):
                label = f"{r}: "
                if phase == "errors":
                    err = texts.pop(r)
                    handle.write("".join(label + line + "\n" for line in err))
                    continue
                text, err = rank_texts(r, ranks, gpn, per_rank, blocks, random.Random(r), culprit, scenario, when,
                                       False)
                texts[r] = err
                cut = text.find("INFO train")
                cut = text.rfind("\n", 0, cut) + 1 if cut >= 0 else len(text)
                part = text[:cut] if phase == "init" else text[cut:]
                handle.write(label + part[:-1].replace("\n", "\n" + label) + "\n" if part else "")
        handle.write("\n".join(srun_lines(ranks, gpn, culprit, "merged", scenario)) + "\n")


LAYOUTS = ("submitit", "torchrun", "logdir", "merged")
SCENARIOS = ("oom", "straggler", "memkill", "ibfail", "segv", "inithang", "latelost", "desync")


def main() -> None:
    parser = argparse.ArgumentParser(description="Generate a large failed-job folder for the analyzer benchmark.")
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--gb", type=float, default=1.0, help="approximate total size in GB (10^9 bytes)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(".bench/big_job"))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--layout", choices=LAYOUTS, default="submitit",
                        help="one file pair per rank (submitit), per node (srun one task per node + torchrun --tee), "
                             "per worker folder (torchrun --log-dir), or one slurm-<job>.out for every rank "
                             "(srun --label)")
    parser.add_argument("--culprit", type=int, default=None, help="the failing rank [default: ranks/2 + 3]")
    parser.add_argument("--scenario", choices=SCENARIOS, default="oom",
                        help="a CUDA OOM on the culprit, a culprit that is silent while every other rank times out, "
                             "a culprit SIGKILLed by its cgroup's OOM killer while srun terminates the others, or a "
                             "culprit whose HCA fails (its ring peers on two other nodes report it), or a culprit "
                             "killed by SIGSEGV (its ring peers report it, the rest time out), or a culprit that "
                             "never starts NCCL's init while the rest wait in it until the time limit, or a "
                             "straggler that loses its net peer after the others timed out and aborted, or a "
                             "culprit that never issued the collective the others time out in, told by the flight "
                             "recorder's dump signal (torch >= 2.5)")
    args = parser.parse_args()
    if args.ranks < 2 or args.ranks % args.gpus_per_node:
        raise SystemExit("--ranks must be a multiple of --gpus-per-node and at least 2")
    start = time.perf_counter()
    try:
        planted = generate(args.out, args.ranks, args.gb, args.gpus_per_node, args.seed, layout=args.layout,
                           culprit=args.culprit, scenario=args.scenario)
    except ValueError as error:  # a culprit outside the job, a scenario the layout or node count cannot hold
        raise SystemExit(f"make_big_job.py: {error}") from None
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out} ({size / 1e9:.2f} GB, {args.ranks} ranks) in {time.perf_counter() - start:.1f}s; "
          f"planted {planted['cause']} on rank {planted['first_failing_rank']} ({planted['first_failing_host']})")


if __name__ == "__main__":
    main()
