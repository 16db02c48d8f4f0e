"""A local rank is the global rank only where nothing else tells: `[defaultL]:` (torchrun --tee) in front of a
worker's lines is its local rank; the NCCL rank its own `Init COMPLETE` line gives in the world's communicator is
its global rank. Hosts, pids, local and global ranks varied."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths

OOM = ["Traceback (most recent call last):", '  File "train.py", line 52, in <module>', "    main()",
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.15 GiB of which 1.2 GiB is free."]


def tee_log(tmp_path: Path, seed: int) -> tuple[Path, int, str]:
    rng = random.Random(seed)
    host = rng.choice(("gpu-a07", "node0413", "hgx-b2"))
    nodes, per_node = rng.choice(((2, 4), (4, 8), (3, 2)))
    node = rng.randrange(1, nodes)  # not the first node: its global ranks are not its local ones
    world = nodes * per_node
    lines = []
    for local in range(per_node):
        pid = 30000 + 7 * local + seed
        lines.append(f"[default{local}]:{host}:{pid}:{pid + 60} [{local}] NCCL INFO comm 0x55d1c0a{local} rank "
                     f"{node * per_node + local} nranks {world} cudaDev {local} busId {local + 1}000 - Init COMPLETE")
    failing = rng.randrange(per_node)
    lines += [f"[default{failing}]:{line}" for line in OOM]
    path = tmp_path / f"node{seed}.log"
    path.write_text("\n".join(lines) + "\n")
    return path, node * per_node + failing, host


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_local_rank_prefix_is_read_through_nccls_rank_map(tmp_path: Path, seed: int) -> None:
    path, rank, host = tee_log(tmp_path, seed)
    d = analyze_paths([path])
    assert (d.cause, d.first_failing_rank, d.first_failing_host) == ("cuda_oom", rank, host)


def agent_paste(tmp_path: Path, seed: int, head: list[str]) -> tuple[Path, int]:
    """A torchelastic agent's lines alone (no host, no world size): it SIGTERMs its other workers and reports the
    one killed by a signal by its local rank. Pids, worker count and the failed local rank varied."""
    rng = random.Random(seed)
    workers = rng.choice((2, 4, 8))
    failing = rng.randrange(workers)
    base = rng.randrange(1000, 90000)
    lines = list(head)
    lines += [f"WARNING:torch.distributed.elastic.multiprocessing.api:Sending process {base + i} closing signal SIGTERM"
              for i in range(workers) if i != failing]
    lines.append(f"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: {failing} "
                 f"(pid: {base + failing}) of binary: /usr/bin/python3")
    path = tmp_path / f"agent{seed}.log"
    path.write_text("\n".join(lines) + "\n")
    return path, failing


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_local_rank_names_no_global_rank_without_a_world_size(tmp_path: Path, seed: int) -> None:
    path, local = agent_paste(tmp_path, seed, [])
    d = analyze_paths([path])
    assert (d.cause, d.first_failing_rank) == ("host_oom", None)
    assert any(f"local rank {local} " in note for note in d.notes), d.notes


def tee_workers(tmp_path: Path, seed: int, world: int, per_node: int) -> tuple[Path, int, str]:
    """`[defaultL]:` lines of the last node's workers (no NCCL rank map), each waiting in a store barrier of `world`
    ranks, one raising a CUDA OOM."""
    rng = random.Random(seed)
    host = rng.choice(("gpu-a07", "node0413", "hgx-b2"))
    failing = rng.randrange(per_node)
    lines = [f"[default{local}]:INFO:torch.distributed.distributed_c10d:Waiting in store based barrier to initialize "
             f"process group for rank: {world - per_node + local}, key: store_based_barrier_key:1 (world_size={world}, "
             f"worker_count={per_node - 1}, timeout=0:30:00)" for local in range(per_node)]
    lines += [f"[default{failing}]:{line}" for line in OOM]
    path = tmp_path / f"{host}.log"
    path.write_text("\n".join(lines) + "\n")
    return path, failing, host


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_local_rank_is_the_global_rank_where_the_world_fits_one_node(tmp_path: Path, seed: int) -> None:
    path, local, _host = tee_workers(tmp_path, seed, world=4, per_node=4)
    d = analyze_paths([path])
    assert (d.cause, d.first_failing_rank) == ("cuda_oom", local)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_local_rank_is_no_global_rank_where_the_world_is_larger_than_the_node(tmp_path: Path, seed: int) -> None:
    path, local, _host = tee_workers(tmp_path, seed, world=8, per_node=4)
    d = analyze_paths([path])
    assert d.cause == "cuda_oom" and d.first_failing_rank in (None, 4 + local)


@pytest.mark.parametrize(("nodes", "one"), [(["n{seed}a"], True), (["n{seed}a", "n{seed}b"], False)])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_hostlist_of_one_node_makes_a_local_rank_global(tmp_path: Path, seed: int, nodes: list[str],
                                                          one: bool) -> None:
    listed = ", ".join(f"'{n.format(seed=seed)}': [0, 1, 2, 3]" for n in nodes)
    head = [f"[2024-05-01 10:00:00,000] [INFO] [launch.py:145:main] WORLD INFO DICT: {{{listed}}}"]
    path, local = agent_paste(tmp_path, seed, head)
    d = analyze_paths([path])
    assert (d.cause, d.first_failing_rank) == ("host_oom", local if one else None)
