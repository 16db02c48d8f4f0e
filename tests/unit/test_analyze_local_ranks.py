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
