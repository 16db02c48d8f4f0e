"""`ddpslurm analyze` on a hang ended by the hang monitor: stack dumps -> the stuck rank and its frame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse.stacks import main_thread, parse_dump, stack_events

SITE = "/opt/venv/lib/python3.11/site-packages"
WORKER = [(f"{SITE}/ddpslurm/launch/worker.py", 280, "run_script"), (f"{SITE}/ddpslurm/launch/worker.py", 350,
                                                                       "run_rank")]
HEARTBEAT = [("/usr/lib/python3.11/threading.py", 331, "wait"), (f"{SITE}/ddpslurm/launch/heartbeat.py", 130, "run"),
             ("/usr/lib/python3.11/threading.py", 1045, "_bootstrap_inner")]
IN_ALL_REDUCE = [(f"{SITE}/torch/distributed/distributed_c10d.py", 2950, "all_reduce"),
                 (f"{SITE}/torch/distributed/c10d_logger.py", 81, "wrapper")]
IN_BROADCAST = [(f"{SITE}/torch/distributed/distributed_c10d.py", 2790, "broadcast"),
                (f"{SITE}/torch/distributed/c10d_logger.py", 81, "wrapper")]
IN_BACKWARD = [(f"{SITE}/torch/autograd/graph.py", 829, "_engine_run_backward"),
               (f"{SITE}/torch/autograd/__init__.py", 353, "backward"), (f"{SITE}/torch/_tensor.py", 648, "backward")]
SLEEPING = [("/home/u/train.py", 88, "load_shard")]


def dump(rank: int, host: str, main: list[tuple[str, int, str]]) -> str:
    """A faulthandler dump as CPython writes it: the heartbeat thread, then the main thread."""
    def block(head: str, frames) -> list[str]:
        return [head] + [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames] + [""]
    main_frames = [*main, ("/home/u/train.py", 120, "train"), ("/home/u/train.py", 140, "<module>"),
                   ("/usr/lib/python3.11/runpy.py", 88, "_run_code"), *WORKER]
    return "\n".join([f"# ddpslurm stack dump file: rank {rank} host {host} pid {4000 + rank}",
                      *block("Thread 0x00007f2a1b7fe640 (most recent call first):", HEARTBEAT),
                      *block("Current thread 0x00007f2a2c9b1740 (most recent call first):", main_frames)])


def job_folder(root: Path, wheres: dict[int, list], hosts: dict[int, str]) -> Path:
    attempt = root / "job_42" / "attempt_0"
    attempt.mkdir(parents=True)
    world = len(wheres)
    for rank, where in wheres.items():
        base = {"schema": 1, "rank": rank, "host": hosts[rank], "pid": 4000 + rank, "job_id": "42", "attempt": 0}
        (attempt / f"rank_{rank}.start.json").write_text(json.dumps({
            **base, "kind": "start", "local_rank": 0, "node_rank": rank, "world_size": world, "local_world_size": 1,
            "launcher": "srun", "unix": 1_790_000_000.0 + rank / 10}))
        (attempt / f"rank_{rank}.exit.json").write_text(json.dumps({
            **base, "kind": "exit", "status": "hang", "exit_code": 124, "unix": 1_790_000_100.0 + rank / 100,
            "reason": "hang_monitor"}))
        (attempt / f"rank_{rank}.stacks.txt").write_text(dump(rank, hosts[rank], where))
        (attempt / f"rank_{rank}.heartbeat.json").write_text(json.dumps({"kind": "heartbeat", "rank": rank}))
        (attempt / f"rank_{rank}.log").write_text(f"rank {rank} step 1\nrank {rank} step 2\n")
    (attempt / "hang.json").write_text(json.dumps({"kind": "hang", "timeout_s": 30, "stalled": [0]}))
    return root / "job_42"


def test_parse_dump_finds_the_script_thread_among_others():
    threads = parse_dump(dump(1, "n2", SLEEPING).splitlines())
    assert len(threads) == 2
    main = main_thread(threads)
    assert main is not None and main.current and main.frames[0].func == "load_shard"


@pytest.mark.parametrize("stuck, world, hosts", [
    (1, 2, {0: "hang-n01", 1: "hang-n02"}),
    (3, 4, {0: "gpu07", 1: "gpu07", 2: "gpu11", 3: "gpu11"}),  # renumbered, hosts renamed, ranks sharing hosts
    (0, 3, {0: "a1", 1: "a2", 2: "a3"}),  # rank 0 itself hung
])
@pytest.mark.parametrize("peers_wait_in", [IN_ALL_REDUCE, IN_BACKWARD])
def test_the_rank_outside_any_collective_is_the_stuck_one(tmp_path: Path, stuck, world, hosts, peers_wait_in):
    wheres = {r: SLEEPING if r == stuck else peers_wait_in for r in range(world)}
    diagnosis = analyze_paths([job_folder(tmp_path, wheres, hosts)]).to_dict()
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_timeout", stuck)
    assert diagnosis["first_failing_host"] == hosts[stuck]
    assert any("train.py:88:load_shard" in e["text"] for e in diagnosis["evidence"])


def test_ranks_in_different_collectives_are_a_mismatch(tmp_path: Path):
    wheres = {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: IN_BROADCAST, 3: IN_ALL_REDUCE}
    diagnosis = analyze_paths([job_folder(tmp_path, wheres, {r: f"n{r}" for r in range(4)})]).to_dict()
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_mismatch", 2)


def test_every_rank_in_the_same_collective_names_nobody(tmp_path: Path):
    wheres = dict.fromkeys(range(3), IN_ALL_REDUCE)
    diagnosis = analyze_paths([job_folder(tmp_path, wheres, {r: f"n{r}" for r in range(3)})]).to_dict()
    assert diagnosis["first_failing_rank"] is None
    assert diagnosis["cause"] == "collective_timeout"


def test_a_dump_that_is_not_faulthandler_text_gives_nothing(tmp_path: Path):
    path = tmp_path / "rank_2.stacks.txt"
    path.write_bytes(b"\x80\x04\x95 not a dump\x1b[2J\n  File \"x\", line oops in f\n")
    assert stack_events(SourceFile(path=str(path), display=str(path))) == []
