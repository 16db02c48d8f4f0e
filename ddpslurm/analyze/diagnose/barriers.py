"""Producers of the rendezvous: barriers, the c10d store, and NCCL's collective init.

In: a job's timeline: monitoredBarrier's named ranks, store barrier lines (worker counts, world sizes, the keys
and unique-id roots ranks wait for), NCCL's setup lines (`Init START`/`COMPLETE`, interfaces, rank maps). Out:
votes for the ranks that never reached the barrier, the store or the communicator's setup (rendezvous_timeout,
collective_timeout), or for a job whose world size, ranks or stale store state disagree (rank_config_mismatch,
stale_rendezvous_state).
"""

from __future__ import annotations

from collections import Counter

from ddpslurm.analyze.diagnose.knowledge import group, weight
from ddpslurm.analyze.diagnose.resolve import expand_ranks, plausible_world
from ddpslurm.analyze.diagnose.timeline import JobTimeline
from ddpslurm.analyze.diagnose.votes import Vote, bounded_world, small_int
from ddpslurm.analyze.model import Event


def barrier_counts(tl: JobTimeline) -> list[Vote]:
    """monitoredBarrier's named ranks; store barriers: who is missing, or more workers than the world size."""
    events = [e for e in tl.events if e.kind in ("barrier", "store_barrier")]  # periodic "Waiting in" lines too
    named = [e for e in events if e.kind == "barrier" and e.get("ranks")]
    if named:
        ranks = sorted({r for e in named for r in expand_ranks(e.get("ranks", ""), 1 << 16)})
        return [Vote("monitored barrier", weight("monitored barrier", "named_shared") / len(ranks),
                     "named by monitoredBarrier as not passing it", rank=r,
                     host=tl.facts.rank_host.get(r), cause="collective_timeout", evidence=tuple(named[:2]))
                for r in ranks]
    counted = [e for e in events if e.kind == "store_barrier" and e.get("worker_count") and e.get("world_size")]
    if counted:
        return _store_counts(counted, tl)
    stores = [e for e in events if e.kind == "store_barrier"]
    return _unique_id_root(stores, tl) or _store_keys(stores, tl)


def _unique_id_root(stores: list[Event], tl: JobTimeline) -> list[Vote]:
    """Ranks setting up an NCCL communicator wait in the store for the ncclUniqueId its root posts: when each
    waiter's own number in the communicator is its rank in the job (the job's communicator) and all name one root
    that is not among them, that rank never reached the communicator's setup (busy, hung, or dead before it)."""
    waits = [e for e in stores if e.get("root_rank") is not None and e.rank is not None]
    if len(waits) < 2 or any(small_int(e.get("reporter_rank")) != e.rank for e in waits):
        return []
    roots = {small_int(e.get("root_rank")) for e in waits}
    root = roots.pop() if len(roots) == 1 else None
    if root is None or root in {e.rank for e in waits}:
        return []
    waiters = len({e.rank for e in waits})
    return [Vote("unique id", weight("unique id"),
                 f"{waiters} ranks setting up the job's NCCL communicator waited in the store for "
                 "the ncclUniqueId this rank, its root, never posted", rank=root, host=tl.facts.rank_host.get(root),
                 cause="rendezvous_timeout", evidence=tuple(waits[:2]))]


def _store_counts(counted: list[Event], tl: JobTimeline) -> list[Vote]:
    e0 = counted[0]
    count, size = small_int(e0.get("worker_count")), small_int(e0.get("world_size"))
    launched = tl.facts.launched_world
    if count is None or size is None:
        return []
    if launched and size != launched:
        return [Vote("store barrier", weight("store barrier", "world_disagrees"),
                     f"the store expects {size} ranks but {launched} were launched: "
                     "WORLD_SIZE disagrees with the ranks launched", cause="rank_config_mismatch",
                     evidence=tuple(counted[:3]))]
    invalid = sorted({r for e in counted if (r := small_int(e.get("rank"))) is not None and r >= size})
    # a rank number the world cannot have runs with a wrong RANK or WORLD_SIZE (when nobody is missing)
    if invalid and count >= size:
        return [Vote("store barrier", weight("store barrier", "impossible_rank_shared") / len(invalid),
                     f"rank {r} waits in a store barrier of world size {size}, "
                     "a rank that world cannot have", rank=r, host=tl.facts.rank_host.get(r),
                     cause="rank_config_mismatch", evidence=tuple(counted[:3])) for r in invalid]
    if count > size:
        stale = tl.facts.attempt > 0 or any(j.cause in group("requeue_marks") for j in tl.job_events)
        why = (f"{count} workers joined a store expecting {size}" +
               (": an earlier attempt of the job (requeued) left its count in the store" if stale
                else ": more processes were launched than the world size says"))
        return [Vote("store barrier", weight("store barrier", "too_many"),
                     why, cause="stale_rendezvous_state" if stale else "rank_config_mismatch",
                     evidence=tuple(counted[:3]))]
    world = bounded_world(tl) or size
    if size > plausible_world(len(tl.facts.present), max(tl.facts.present, default=-1) + 1):
        return []
    reporters = {e.rank for e in counted if e.rank is not None}
    missing = [r for r in range(min(size, world)) if r not in reporters]
    if len(missing) > size - count > 0:
        # a rank that waited in the store for a key was connected to it: one of the clients that joined
        clients = {e.rank for e in tl.events if e.kind == "store_barrier" and e.rank is not None and e.get("key")}
        missing = [r for r in missing if r not in clients] or missing
        narrowed = [r for r in missing if tl.rank(r).own_failures] or \
                   [r for r in missing if tl.rank(r).stopped_early]
        missing = narrowed or missing
    if not missing:
        return [Vote("store barrier", weight("store barrier", "too_few"),
                     f"only {count} of {size} ranks reached the store barrier",
                     cause="rendezvous_timeout", evidence=tuple(counted[:3]))]
    return [Vote("store barrier", weight("store barrier", "missing_shared") / len(missing),
                 f"only {count} of {size} ranks reached the store barrier and "
                 f"rank {r} is not among those that report it", rank=r, host=tl.facts.rank_host.get(r),
                 cause="rendezvous_timeout", evidence=tuple(counted[:3])) for r in missing]


#: errors c10d raises in a rank that is connected to the store (a connect failure is kind `socket`)
STORE_CLIENT_KINDS = ("store_barrier", "exception")


def _store_keys(stores: list[Event], tl: JobTimeline) -> list[Vote]:
    """Every rank waits in the store for one rank's key: that rank never wrote it (or runs under another RANK)."""
    keyed = [e for e in stores if small_int(e.get("key_rank")) is not None and e.rank is not None]
    selfish = sorted({e.rank for e in keyed if small_int(e.get("key_rank")) == e.rank})  # type: ignore[misc]
    if selfish:
        return [Vote("store keys", weight("store keys", "own_key_shared") / len(selfish),
                     "it waits for its own rank's key: its RANK disagrees with the "
                     "rank it was launched as", rank=r, host=tl.facts.rank_host.get(r), cause="rank_config_mismatch",
                     evidence=tuple(e for e in keyed if e.rank == r)[:2]) for r in selfish]
    if not keyed:
        return []
    (target, _n), *_ = Counter(small_int(e.get("key_rank")) for e in keyed).most_common(1)
    assert target is not None
    reached = [e for e in tl.rank(target).failures if e.kind in STORE_CLIENT_KINDS and e.cause in group("store")]
    cause = "rank_config_mismatch" if reached else "rendezvous_timeout"
    why = ("every rank waits for its key although it reached the store itself: its RANK is not the one it was "
           "launched as" if reached else "every rank waits in the store for its key")
    return [Vote("store keys", weight("store keys", "awaited"),
                 why, rank=target, host=tl.facts.rank_host.get(target), cause=cause,
                 evidence=tuple(keyed[:2] + reached[:1]))]


#: the facts NCCL logs as it sets a process up (NCCL_DEBUG=INFO): a rank that logged one reached NCCL
NCCL_SETUP_KINDS = ("nccl_init", "interface", "nccl_rank_map")


def stuck_in_nccl_init(tl: JobTimeline) -> list[Vote]:
    """NCCL's init is collective: ncclCommInitRank returns on no rank until every rank of the communicator joined,
    and prints `Init COMPLETE` when it does. When no rank finished the init of the job's world while most ranks
    logged NCCL's setup (its bootstrap, `Init START` from 2.19), they waited there for the ranks that logged no NCCL
    line at all (rendezvous_timeout), however the wait ended. Not when a rank failed on its own (its error, srun's
    report of its death): that made the others wait; nor when an NCCL line comes from a process whose rank is not
    known (it may be one of those that seem missing)."""
    if any(rt.own_failures for rt in tl.ranks.values()) or any(t.own_death for t in tl.tasks):
        return []
    reached: set[int] = set()
    sizes: Counter[int] = Counter()
    finished: set[int] = set()  # sizes of the communicators some rank finished
    last: list[Event] = []  # the last two setup lines, the evidence
    for e in tl.events:
        if e.kind not in NCCL_SETUP_KINDS:
            continue
        if e.rank is None:
            return []
        reached.add(e.rank)
        last = [*last[-1:], e]
        if e.kind == "nccl_init" and (n := small_int(e.get("nranks"))):
            sizes[n] += 1
            if e.get("init") == "complete":
                finished.add(n)
    world = tl.world_size or (sizes.most_common(1)[0][0] if sizes else None)
    if not world or world in finished or (sizes and world not in sizes):
        return []  # no world to count in, or its init finished (everyone joined), or NCCL inits another size
    missing = [r for r in range(world) if r not in reached]
    waiting = len(reached) - sum(r >= world for r in reached)
    if waiting * 2 <= world or not missing or len(missing) * 2 > world:
        return []  # (world is at most twice the ranks that logged NCCL lines: the range is bounded by the input)
    ended = next((e.cause for e in tl.job_events if e.cause), None)
    until = f" until Slurm ended the job ({ended})" if ended else ""
    return [Vote("stuck in NCCL init", weight("stuck in NCCL init", "missing_shared") / len(missing),
                 f"{waiting} of {world} ranks set NCCL up "
                 f"and none finished its init (no Init COMPLETE), waiting{until}; rank {r} logged no NCCL line",
                 rank=r, host=tl.facts.rank_host.get(r), cause="rendezvous_timeout", evidence=tuple(last))
            for r in missing]
