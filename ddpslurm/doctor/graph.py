"""Which links the pre-flight tests: a sparse graph every node computes alone, the same everywhere (pure).

All-to-all is N*(N-1) connections and name lookups: a million at 1,024 nodes, more than a listener's backlog
and a 10 s window absorb, and overflow reads as "unreachable". Instead each node connects to

- its ring successor (node rank + 1): every node is tested by its predecessor;
- the rank-0 host (the MASTER_ADDR every rank dials at init): the master is tested by everyone;
- `k` random peers: a random order of the nodes, seeded from the job id, in which each node connects to the
  nodes `s_1..s_k` places after it (`k` distinct random offsets). Every node is thus tested by `k` distinct
  random peers besides its ring predecessor, and no node but the rank-0 host is tested by more than `k + 1`.

That is at most N*(k+2) connections, and every node other than rank 0 expects at most k+1 of them. The draw
uses blake2b over the job id, not Python's `random`, so nodes running different Pythons agree without talking.
Allocations of at most k+2 nodes stay all-to-all (the sparse graph would not be smaller).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

#: random peers per node (besides the ring successor and the rank-0 host)
RANDOM_PEERS = 3
Plan = dict[str, tuple[str, ...]]


def _draws(job_id: str, label: str):
    """An endless deterministic stream of 64-bit numbers from the job id (same on every node and Python)."""
    counter = 0
    while True:
        digest = hashlib.blake2b(f"ddpslurm-doctor:{job_id}:{label}:{counter}".encode(), digest_size=8).digest()
        yield int.from_bytes(digest, "big")
        counter += 1


def shuffled(count: int, job_id: str) -> list[int]:
    """0..count-1 in a random order drawn from the job id (Fisher-Yates)."""
    order, draws = list(range(count)), _draws(job_id, "order")
    for i in range(count - 1, 0, -1):
        j = next(draws) % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def offsets(count: int, k: int, job_id: str) -> list[int]:
    """`k` distinct offsets in 1..count-1 drawn from the job id (count > k)."""
    chosen: list[int] = []
    draws = _draws(job_id, "offsets")
    while len(chosen) < k:
        offset = 1 + next(draws) % (count - 1)
        if offset not in chosen:
            chosen.append(offset)
    return chosen


def all_to_all(count: int, k: int = RANDOM_PEERS) -> bool:
    """Whether an allocation of `count` nodes is tested all-to-all (the sparse graph would not be smaller)."""
    return count <= k + 2


def probe_plan(nodes: Sequence[str], job_id: str, k: int = RANDOM_PEERS) -> Plan:
    """node -> the peers it connects to, in the order tried (ring successor, rank-0 host, random peers)."""
    if k < 2:
        raise ValueError(f"k={k}: at least 2 random peers keep every node tested by 2 distinct peers")
    if len(set(nodes)) != len(nodes):
        raise ValueError("the node list has duplicates")
    count = len(nodes)
    if all_to_all(count, k):  # every other node, in ring order from the successor
        return {node: tuple(nodes[(rank + step) % count] for step in range(1, count))
                for rank, node in enumerate(nodes)}
    order = shuffled(count, job_id)
    place = {rank: position for position, rank in enumerate(order)}
    steps = offsets(count, k, job_id)
    plan: Plan = {}
    for rank, node in enumerate(nodes):
        wanted = [(rank + 1) % count, 0] + [order[(place[rank] + step) % count] for step in steps]
        plan[node] = tuple(nodes[peer] for peer in dict.fromkeys(wanted) if peer != rank)
    return plan


def inbound(plan: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """node -> the peers that plan to connect to it (what its listener waits for)."""
    into: dict[str, list[str]] = {node: [] for node in plan}
    for node, peers in plan.items():
        for peer in peers:
            into.setdefault(peer, []).append(node)
    return {node: tuple(sources) for node, sources in into.items()}


def connection_count(plan: Mapping[str, Sequence[str]]) -> int:
    """How many connections the plan makes (one per planned directed link)."""
    return sum(len(peers) for peers in plan.values())


def lookups(plan: Mapping[str, Sequence[str]], nodes: Sequence[str], node: str) -> list[str]:
    """The names `node` resolves: itself, the rank-0 host and its planned peers, in node-rank order."""
    wanted = {node, *plan.get(node, ()), *nodes[:1]}
    return [host for host in nodes if host in wanted]
