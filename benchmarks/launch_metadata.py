"""Metadata requests a job's launch and liveness put on the shared file system, before and after issue 43.

    python benchmarks/launch_metadata.py [--ranks 1024 8192] [--per-node 8] [--seconds 30]

For each job size it builds an attempt folder in a temporary directory (the "shared file system") and counts
every call that asks its metadata server something (a create, an open, a rename, a stat, a mkdir, a listing, an
unlink) on a path under it, by wrapping `os` and `open` for the run, over `--seconds` simulated seconds of an
attempt with `--hang-timeout` on: start, training with progress every second, a preemption signal at 2/3 of the
time, every rank's end two seconds later.

after: the code of this tree, run for real on a simulated clock: the batch step's `make_folders` before srun;
per rank its log's open, and its start record, progress, signals and exit record through the worker's own
`rank_state.RankState` and `node_live.RankLink` (node-local: /dev/shm or $TMPDIR, not counted; they are what the
main, heartbeat and signal threads call), its stack dump file node-local too; per node a `node_live.NodeAgent`
ticking every `TICK_S`, which writes the records into the node's one file; the supervisor's `AttemptReader.poll`
and `HangMonitor.poll` once a second.

per-rank: the same, with the start and exit records and the stack file of each rank in its host folder (commit
31741a0, the first half of issue 43: per-node liveness, per-rank records).

before: the calls the launcher made before issue 43 (commit e02d548), one for one: every rank made the attempt and
checkpoint folders, opened its log, wrote start, signal, exit and stack files, rewrote `rank_R.heartbeat.json`
every second (folder made if missing, a temporary file, a rename) and looked for `hang.json` every second; the
supervisor listed the attempt folder and stat-ed every heartbeat file every second, and listed it again for
`rank_*.signal.json`.

Printed per size: metadata requests per second while training (mean), in the busiest second, in the start
burst (the attempt's first second: folders, logs, start records) and in all; the directory entries the
supervisor's listings read per second; the files of the attempt, the entries of its largest folder and of the
attempt folder itself. Then, per size, the cost of a hang's stack dumps: every rank dumps (the stack signal reaches
every task); the agents copy the dumps into the host folders (requests, files), against the stack files the
per-rank layout created at every start whether a hang came or not. Submitit's own files in the job folder
(`%j_%t_log.out/err`, `%j_%t_result.pkl`, 3 per rank) are the same in every row and not counted.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.launch import node_live, records
from ddpslurm.launch.batch import AttemptReader, make_folders
from ddpslurm.launch.hang_monitor import HangMonitor
from ddpslurm.launch.node_live import NodeAgent, RankLink
from ddpslurm.launch.rank_state import RankState

_PATCHED = ("open", "stat", "lstat", "replace", "rename", "mkdir", "scandir", "listdir", "unlink", "utime")


class Meter:
    """Counts the calls on paths under `root`, per simulated second; and the entries listings returned."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.second = 0
        self.ops: Counter[int] = Counter()
        self.kinds: Counter[str] = Counter()
        self.listed: Counter[int] = Counter()

    def hit(self, kind: str, path: Any) -> bool:
        if isinstance(path, int):
            return False  # an fd: already counted at its open
        text = os.fspath(path) if isinstance(path, str | bytes | os.PathLike) else ""
        text = text.decode() if isinstance(text, bytes) else text
        if not text.startswith(self.root):
            return False
        self.ops[self.second] += 1
        self.kinds[kind] += 1
        return True

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        saved = {name: getattr(os, name) for name in _PATCHED}
        saved_open, saved_io_open = builtins.open, io.open
        meter = self

        def wrap(name: str) -> Any:
            real = saved[name]

            def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
                meter.hit(name, path)
                return real(path, *args, **kwargs)
            return counted

        def listing(real: Any) -> Any:
            def counted(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
                result = real(path, *args, **kwargs)
                if meter.hit("list", path):
                    items = list(result)
                    meter.listed[meter.second] += len(items)
                    return _Listing(items) if real is saved["scandir"] else items
                return result
            return counted

        def opened(path: Any, *args: Any, **kwargs: Any) -> Any:
            meter.hit("open", path)
            return saved_open(path, *args, **kwargs)

        for name in _PATCHED:
            setattr(os, name, wrap(name))
        os.scandir, os.listdir = listing(saved["scandir"]), listing(saved["listdir"])
        builtins.open = io.open = opened
        try:
            yield
        finally:
            for name, real in saved.items():
                setattr(os, name, real)
            builtins.open, io.open = saved_open, saved_io_open


class _Listing(list):
    """A scandir result replayed from a list (usable as a context manager, as scandir's is)."""

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def hosts(ranks: int, per_node: int) -> list[str]:
    return [f"n{node:05d}" for node in range((ranks + per_node - 1) // per_node)]


def _start_record(rank: int, per_node: int, ranks: int, host: str, now: float) -> dict[str, Any]:
    return records.start_record(rank=rank, local_rank=rank % per_node, node_rank=rank // per_node, world_size=ranks,
                                local_world_size=per_node, host=host, pid=1000 + rank, job_id="1", step_id="0",
                                attempt=0, launcher="srun", master_addr="n00000", master_port=29500, unix=now,
                                versions={"python": "3.11", "torch": "2.13.0", "nccl": "2.27.3"},
                                env={"NCCL_DEBUG": "INFO", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                                     "CUDA_VISIBLE_DEVICES": str(rank % per_node)})


def _rank_state(rank: int, link: RankLink | None, paths: dict[str, Path]) -> RankState:
    from types import SimpleNamespace

    return RankState(SimpleNamespace(grace_s=30), SimpleNamespace(rank=rank, job_id="1"), 0, paths,
                     SimpleNamespace(stop=lambda timeout: None), link)


def simulate_after(attempt: Path, local_root: Path, ranks: int, per_node: int, seconds: int,
                   meter: Meter, per_rank_records: bool = False) -> None:
    nodes = hosts(ranks, per_node)
    signal_at, end_at = seconds * 2 // 3, seconds * 2 // 3 + 2
    interval = node_live.node_interval_s(len(nodes))
    environ = {"SLURM_JOB_NODELIST": ",".join(nodes)}
    with meter.counting():
        make_folders(attempt, environ)  # the batch step, before srun
    os.environ.pop("DDPSLURM_FOLDERS_MADE", None)
    links: list[RankLink] = []
    agents: list[NodeAgent] = []
    paths = []
    host_of = []
    for index, host in enumerate(nodes):
        local = local_root / host
        local.mkdir()
        agents.append(NodeAgent(local, jobfolder.node_file_path(attempt, host), host, per_node, interval,
                                jobfolder.hang_path(attempt), alive=lambda pid: True))
        for local_rank in range(per_node):
            rank = index * per_node + local_rank
            if rank < ranks:
                links.append(RankLink(local, rank, local_rank))
                paths.append(jobfolder.rank_paths(attempt, rank, host))
                host_of.append(host)
    states = [_rank_state(rank, None if per_rank_records else link, path)
              for rank, (link, path) in enumerate(zip(links, paths, strict=True))]
    reader = AttemptReader(attempt, ranks)
    monitor = HangMonitor(attempt, "1", 600, signal_job=lambda job, sig: None, files=reader.files)
    with meter.counting():
        for second in range(seconds):
            meter.second = second
            now = 1000.0 + second
            for rank, (link, path, state) in enumerate(zip(links, paths, states, strict=True)):
                if second == 0:  # the rank starts: its log (the tee's open), its start record, its stack file
                    os.close(os.open(path["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
                    state.start_record(_start_record(rank, per_node, ranks, host_of[rank], now))
                    stacks = (path["log"].parent if per_rank_records else link.folder) / \
                        f"rank_{rank}{jobfolder.STACKS_SUFFIX}"
                    open(stacks, "a").close()  # heartbeat.register_stack_dump's open
                if second < end_at:
                    link.publish(progress={"collectives": second * 3, "step": second, "unix": now})
                if second == signal_at:
                    link.publish(signal={"rank": rank, "signal": "SIGTERM", "unix": now})
                if second == end_at:
                    state.exit_record("preempted", 0, reason="preemption", requeue=True)
                    if per_rank_records:
                        link.publish(exit={"status": "preempted", "exit_code": 0, "signal": None, "unix": now})
            for tick in range(round(1 / node_live.TICK_S)):
                for agent in agents:
                    agent.tick(now + tick * node_live.TICK_S)
            reader.poll(final=second == seconds - 1)
            if second < end_at:
                monitor.poll(now)


def simulate_hang(attempt: Path, local_root: Path, ranks: int, per_node: int, meter: Meter) -> tuple[int, int]:
    """Every rank's stack dump in its node-local file, each node's agent copying them after the stack signal (the
    rank's heartbeat thread then finds its copy there: one stat); (requests, stack files on the shared side)."""
    import time

    nodes = hosts(ranks, per_node)
    make_folders(attempt, {"SLURM_JOB_NODELIST": ",".join(nodes)})
    os.environ.pop("DDPSLURM_FOLDERS_MADE", None)
    agents = []
    dump = 'Thread 0x00007f (most recent call first):\n  File "train.py", line 40 in step\n' * 20
    for index, host in enumerate(nodes):
        local = local_root / f"hang-{host}"
        local.mkdir()
        for local_rank in range(per_node):
            if index * per_node + local_rank < ranks:
                (local / f"rank_{index * per_node + local_rank}{jobfolder.STACKS_SUFFIX}").write_text(
                    f"# ddpslurm stack dump file: rank {index * per_node + local_rank}\n{dump}")
        agent = NodeAgent(local, jobfolder.node_file_path(attempt, host), host, per_node, 5.0, None,
                          alive=lambda pid: True)
        agent.stack_signal_at = time.time() - node_live.STACK_COPY_S
        agents.append(agent)
    before = sum(meter.ops.values())
    with meter.counting():
        for agent in agents:
            agent.copy_stacks()
        for rank in range(ranks):  # the heartbeat thread's look at its copy (heartbeat._same_size)
            os.stat(jobfolder.host_folder(attempt, nodes[rank // per_node]) / f"rank_{rank}{jobfolder.STACKS_SUFFIX}")
    files = sum(1 for _ in attempt.glob(f"*/*{jobfolder.STACKS_SUFFIX}"))
    return sum(meter.ops.values()) - before, files


def simulate_before(attempt: Path, ranks: int, seconds: int, meter: Meter) -> None:
    """The per-rank protocol of commit e02d548, call for call (see the module docstring)."""
    signal_at, end_at = seconds * 2 // 3, seconds * 2 // 3 + 2
    job = attempt.parent
    attempt.mkdir(parents=True)
    hang = attempt / jobfolder.HANG_FILE

    def old_write(path: Path, text: str) -> None:  # records.write_text before issue 43: mkdir, temporary, rename
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, text.encode())
        os.close(fd)
        os.replace(tmp, path)

    with meter.counting():
        for second in range(seconds):
            meter.second = second
            for rank in range(ranks):
                base = attempt / f"rank_{rank}"
                if second == 0:
                    attempt.mkdir(parents=True, exist_ok=True)
                    (job / jobfolder.CHECKPOINTS_DIR).mkdir(exist_ok=True)
                    attempt.mkdir(parents=True, exist_ok=True)  # the tee's log folder
                    os.close(os.open(f"{base}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
                    old_write(Path(f"{base}.start.json"), json.dumps({"rank": rank}))
                    open(f"{base}{jobfolder.STACKS_SUFFIX}", "a").close()
                if second < end_at:
                    hang.exists()  # the heartbeat thread's look for the monitor's request
                    old_write(Path(f"{base}.heartbeat.json"), json.dumps({"rank": rank, "step": second}))
                if second == signal_at:
                    old_write(Path(f"{base}.signal.json"), json.dumps({"rank": rank, "unix": 1.0}))
                if second == end_at:
                    old_write(Path(f"{base}.exit.json"), json.dumps({"rank": rank, "status": "preempted"}))
            if second < end_at:  # the hang monitor: one listing, a stat per heartbeat file
                with os.scandir(attempt) as listing:
                    for entry in listing:
                        if entry.name.endswith(jobfolder.HEARTBEAT_SUFFIX):
                            os.stat(entry.path)
            list(attempt.glob(f"rank_*{jobfolder.SIGNAL_SUFFIX}"))  # the attempt reader
            if second >= signal_at:
                list(attempt.glob(f"rank_*{jobfolder.EXIT_SUFFIX}"))


def folder_figures(attempt: Path) -> tuple[int, int, int]:
    """(files in the attempt, entries of its largest folder, entries of the attempt folder itself)."""
    files, largest = 0, 0
    for _, dirs, names in os.walk(attempt):
        files += len(names)
        largest = max(largest, len(names) + len(dirs))
    return files, largest, len(os.listdir(attempt))


KINDS = ("before", "per-rank", "after")


def measure(ranks: int, per_node: int, seconds: int) -> dict[str, dict[str, float]]:
    out = {}
    for kind in (*KINDS, "hang"):
        shared = Path(tempfile.mkdtemp(prefix=f"ddpslurm-meta-{kind}-"))
        local = Path(tempfile.mkdtemp(prefix="ddpslurm-meta-local-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                      else None))
        try:
            attempt = shared / "job_1" / "attempt_0"
            meter = Meter(shared)
            if kind == "hang":
                ops, stack_files = simulate_hang(attempt, local, ranks, per_node, meter)
                out[kind] = {"ops": ops, "files": stack_files}
                continue
            if kind == "before":
                simulate_before(attempt, ranks, seconds, meter)
            else:
                simulate_after(attempt, local, ranks, per_node, seconds, meter, per_rank_records=kind == "per-rank")
            training = [meter.ops[s] for s in range(2, seconds * 2 // 3)]
            files, largest, top = folder_figures(attempt)
            out[kind] = {"per_s": sum(training) / len(training), "peak_s": max(meter.ops.values()),
                         "start": meter.ops[0],
                         "total": sum(meter.ops.values()), "listed_per_s": sum(meter.listed.values()) / seconds,
                         "files": files, "largest": largest, "top": top}
        finally:
            shutil.rmtree(shared, ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args(argv)
    if args.seconds < 6 or args.per_node < 1 or min(args.ranks) < 1:
        parser.error("--seconds must be at least 6, --per-node and --ranks at least 1")
    print(f"{'ranks':>6} {'nodes':>6} {'':>8}  {'ops/s training':>14} {'ops busiest s':>13} {'start burst':>11} "
          f"{'ops in all':>10} {'entries listed/s':>16} {'files':>7} {'largest folder':>14} {'attempt folder':>14}")
    hangs = []
    for ranks in args.ranks:
        figures = measure(ranks, args.per_node, args.seconds)
        nodes = len(hosts(ranks, args.per_node))
        for kind in KINDS:
            f = figures[kind]
            print(f"{ranks:>6} {nodes:>6} {kind:>8}  {f['per_s']:>14,.0f} {f['peak_s']:>13,.0f} {f['start']:>11,.0f} "
                  f"{f['total']:>10,.0f} {f['listed_per_s']:>16,.0f} {f['files']:>7,.0f} {f['largest']:>14,.0f} "
                  f"{f['top']:>14,.0f}")
        hangs.append((ranks, figures["hang"], figures["per-rank"]["files"] - figures["after"]["files"]))
    for ranks, hang, saved in hangs:
        print(f"{ranks:>6} ranks, on a hang: the agents copy {hang['files']:,.0f} stack dumps into the host folders "
              f"({hang['ops']:,.0f} requests, once); with no hang, {saved:,.0f} files fewer per attempt than per-rank")
    print(f"(node-file interval: {node_live.node_interval_s(1):g} s up to {node_live.MIN_INTERVAL_S * 1000:,.0f} "
          f"nodes, nodes/{node_live.NODE_WRITES_PER_S} s beyond; {args.seconds} simulated seconds, signal at "
          f"{args.seconds * 2 // 3} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
