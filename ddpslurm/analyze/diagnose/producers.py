"""Evidence producers: each reads the job's timeline and emits weighted votes for who failed first and why.

A vote names a rank, a host, or nobody (a cause for the job as a whole), with a weight and the reason in
words. Producers know message *kinds* and the fields signatures capture (DESIGN.md, analyzer/signatures/
README.md), never a signature id. The combiner (combiner.py) weighs the votes; the table `PRODUCERS` at the
end is the list it runs, in the order their reasons are shown.

Weights, on one scale: a rank's own decisive failure (an OOM, an exception, a segfault) 50-100; srun's first
task to die before the teardown 40; a rank missing from what every other rank reports 30 shared among the
missing; a peer named by its victims 8 + 4 per accusing rank; a rank whose log stops early 12 shared.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ddpslurm.analyze.diagnose.resolve import expand_ranks, is_host_name, plausible_world
from ddpslurm.analyze.diagnose.timeline import JobTimeline, RankTimeline
from ddpslurm.analyze.model import Event

#: kinds a rank logs only because another rank or Slurm ended it: never its own failure
QUIET_KINDS = ("exit_signal", "slurm_task", "slurm_job", "agent_sigterm", "agent", "exit")


@dataclass(frozen=True)
class Vote:
    """One piece of evidence: `rank` (or `host`, or neither: the job) failed first, of `cause`."""

    producer: str
    weight: float
    why: str
    rank: int | None = None
    host: str | None = None
    cause: str | None = None
    evidence: tuple[Event, ...] = ()
    time: float | None = None
    time_family: str | None = None
    own: bool = False  # the rank's own failure (it can be ordered in time against other ranks' failures)


def own_weight(e: Event) -> float:
    """A culprit-role line weighs 50-100 by its priority; an `either` line (could be a consequence) 10-35."""
    priority = max(0, min(e.priority, 100))
    return 50 + priority / 2 if e.role == "culprit" else 10 + priority / 4


def own_failures(tl: JobTimeline) -> list[Vote]:
    """A rank's own failure (OOM, exception, segfault, a signal, an error it did not recover from)."""
    votes = []
    for rt in tl.ranks.values():
        own = [e for e in rt.own_failures if _accuses(e) == "self"]
        if not own or (died_as_victim(rt) and all(e.kind in DEATH_REPORT_KINDS for e in own)):
            continue  # only the report of a death its own log explains as a victim's
        first = own[0]
        strongest = max(own, key=lambda e: (own_weight(e), -own.index(e)))
        cause = strongest.cause if strongest.cause not in (None, "unknown") else _first_known_cause(own)
        votes.append(Vote("own failure", own_weight(strongest), f"rank {rt.rank} reported it itself", rank=rt.rank,
                          host=rt.host, cause=cause, evidence=(strongest, first) if first is not strongest
                          else (first,), time=first.time, time_family=first.time_family, own=True))
    return votes


def _accuses(e: Event) -> str:
    """The signature's `accuses` (the engine copies it into the event's fields); records follow their role."""
    return e.get("accuses") or ("none" if e.role == "victim" else "self")


def _first_known_cause(events: Iterable[Event]) -> str | None:
    return next((e.cause for e in events if e.cause not in (None, "unknown")), None)


HOST_REPORT_SCALE = 0.8  # a line about a node (kernel, driver) without the rank: a little less than the rank's own


def detectors_and_hosts(tl: JobTimeline) -> list[Vote]:
    """Lines that name a host (node failure, OOM killer on a node, a line that accuses its host whatever rank printed
    it) or nobody (a detector's check failed)."""
    votes = []
    for e in tl.failure_lines():
        who = _accuses(e)
        if e.role == "culprit" and who == "none":
            votes.append(Vote("detector", 40.0, "a rank detected bad data from a peer it does not name",
                              cause=e.cause, evidence=(e,)))
        elif e.role in ("culprit", "either") and (who == "host" or (e.rank is None and who == "self")):
            host = e.host or e.get("host") or (tl.facts.rank_host.get(e.rank) if e.rank is not None else None)
            host = host if host and is_host_name(host) else None
            votes.append(Vote("host report", own_weight(e) * HOST_REPORT_SCALE,
                              f"reported on host {host or '?'} without a rank", host=host, cause=e.cause,
                              evidence=(e,), time=e.time, time_family=e.time_family))
    return votes


VICTIM_DISCOUNT = 0.25  # a rank that died first, but whose own log says it died waiting for a peer


#: lines that report a death (a launcher's or ddpslurm's exit report), not what caused it
DEATH_REPORT_KINDS = ("agent_failed", "elastic_failure", "exit_signal", "exit")


def died_as_victim(rt: RankTimeline) -> bool:
    """Its log explains its death as a victim's (a timeout, a lost peer, a detected bad peer); the reports of
    that death (an agent's `exitcode: -6` after the watchdog's abort) add nothing of its own."""
    victim = [e for e in rt.failures if e.role == "victim" or _accuses(e) == "none"]
    return bool(victim) and all(e in victim or e.kind in QUIET_KINDS or
                                (e.kind in DEATH_REPORT_KINDS and e.role == "either") for e in rt.failures)


def srun_task_deaths(tl: JobTimeline) -> list[Vote]:
    """srun's task lines in order: the first task that died on its own before the step's teardown began.

    `Killed` and signals are deaths of the task's own; an exit code may be a victim giving up, so it weighs
    less, and a rank whose log shows it died as a victim weighs little."""
    deaths = [t for t in tl.tasks if t.own_death and t.before_teardown]
    votes = []
    for index, task in enumerate(deaths):
        weight = (40.0 if index == 0 else 12.0) * (1.0 if task.status != "Exited" else 0.6)
        cause = task.event.cause if task.event.cause != "unknown" else None
        why = f"srun reported task(s) {task.event.get('tasks') or '?'} {task.status.lower()}" + \
            (" first, before the step's teardown" if index == 0 else " before the step's teardown")
        if tl.facts.torchrun or not task.ranks:
            votes.append(Vote("srun order", weight, why, host=task.host, cause=cause, evidence=(task.event,)))
            continue
        for rank in task.ranks:
            w = weight / len(task.ranks) * (VICTIM_DISCOUNT if died_as_victim(tl.rank(rank)) else 1.0)
            votes.append(Vote("srun order", w, why, rank=rank, host=task.host, cause=cause, evidence=(task.event,),
                              own=True))
    return votes


def vanished_ranks(tl: JobTimeline) -> list[Vote]:
    """Ranks that started (a start record) and left no exit record and no word, while the others did."""
    started = [rt for rt in tl.ranks.values() if rt.started]
    gone = [rt for rt in started if rt.exit is None and not _speaks(rt)]
    if not gone or len(gone) * 2 > len(started) or not any(rt.exit is not None or _speaks(rt) for rt in started):
        return []
    return [Vote("vanished", 25.0 / len(gone), f"rank {rt.rank} started but left no exit record and no error "
                 "(killed without a chance to write one)", rank=rt.rank, host=rt.host, own=True) for rt in gone]


def _speaks(rt: RankTimeline) -> bool:
    """The rank logged an error of its own or as a victim (not only being terminated, not one it got past)."""
    return any(e.kind not in QUIET_KINDS and e not in rt.recovered for e in rt.failures)


def named_peers(tl: JobTimeline) -> list[Vote]:
    """Victims that name the peer they lost (`Connection closed by peer`, NCCL remote errors, desync reports)."""
    accusers: dict[int | str, set] = defaultdict(set)
    lines: dict[int | str, list[Event]] = defaultdict(list)
    for rt in tl.ranks.values():
        for e in rt.failures:
            target = _peer_of(e, tl)
            if target is not None and target != rt.rank:
                accusers[target].add(rt.rank)
                lines[target].append(e)
    votes = []
    for target, who in accusers.items():
        weight = 8.0 + 4.0 * len(who)
        why = f"named as the lost or odd peer by {len(who)} rank(s)"
        if isinstance(target, int):
            votes.append(Vote("named peer", weight, why, rank=target, host=tl.facts.rank_host.get(target),
                              evidence=tuple(lines[target][:3])))
        else:
            votes.append(Vote("named peer", weight, why, host=target, evidence=tuple(lines[target][:3])))
    return votes


def _peer_of(e: Event, tl: JobTimeline) -> int | str | None:
    peer_rank = e.get("peer_rank", "")
    if peer_rank.isdigit() and len(peer_rank) < 8 and e.kind != "watchdog_timeout":
        return int(peer_rank) if e.get("version") is None else None
    if e.role != "victim" or _accuses(e) != "peer":
        return None
    return peer_host(e, tl)


def peer_host(e: Event, tl: JobTimeline) -> str | None:
    """The host of the peer a line names (`peer_host`, or an address the job's records or interface lines map to a
    host); None for none, its own host, or an address nothing maps."""
    host = named_peer(e, tl)
    if host is None:
        return None
    own_host = e.host or (tl.facts.rank_host.get(e.rank) if e.rank is not None else None)
    if host == own_host or _is_address(host):
        return None  # an address no record maps to a host names nobody we can report
    return host


def named_peer(e: Event, tl: JobTimeline) -> str | None:
    """The peer a line names (`peer_host`, else `peer_host2`, else `peer_ip`), the address mapped to its host where
    the job's records or interface lines tell it; None when the line names none."""
    for name in ("peer_host", "peer_host2", "peer_ip"):
        value = _bare_host(e.get(name) or "")
        if value:
            return tl.facts.ip_host.get(value, value)
    return None


#: c10d writes a peer `[host]:port` (IPv6 `[::1]:port`): the host without brackets and port
_BRACKETED = re.compile(r"\[([^\]]*)\](?::\d+)?")


def _bare_host(value: str) -> str:
    """A peer as a line names it, without c10d's brackets and port."""
    m = _BRACKETED.fullmatch(value.strip())
    return m[1] if m else value.strip().strip("[]")


def _is_address(text: str) -> bool:
    return text.replace(".", "").isdigit() or text.count(":") >= 2


def _bounded_world(tl: JobTimeline) -> int | None:
    world = tl.world_size
    facts = tl.facts
    bound = plausible_world(len(facts.present), max(facts.present, default=-1) + 1)
    return world if world and world <= max(bound, facts.launched_world or 0) else None


def timeout_reporters(tl: JobTimeline) -> list[Vote]:
    """Watchdog timeouts: the ranks absent from the reporters, the one whose last completed work is lowest, and
    those that never issued the collective the others timed out in."""
    reports = [e for rt in tl.ranks.values() for e in rt.failures if e.kind == "watchdog_timeout"]
    if not reports:
        return []
    votes = _lowest_completed(reports, tl) + _never_issued(reports, tl) + _mismatched_collectives(reports, tl)
    reporters = {e.rank for e in reports}
    world = _bounded_world(tl)
    if world and len(reporters) < world:
        missing = [r for r in range(world) if r not in reporters]
        if len(reporters) == 1 and not (tl.facts.launched_world or tl.facts.said_world):
            # one rank's timeout and a world known only from its own number: the ranks below it left no line, and a
            # paste of one rank's lines cannot tell one that stayed away from one whose log was not given
            missing = [r for r in missing if r in tl.ranks or r in tl.facts.present]
        absent = [r for r in missing if r not in tl.ranks or not _loud(tl.ranks[r])] or missing
        if absent and len(absent) * 2 <= world:
            votes += [Vote("absent from timeouts", 30.0 / len(absent), f"rank {r} is absent from the {len(reporters)} "
                           "ranks whose watchdog timed out", rank=r, host=tl.facts.rank_host.get(r),
                           cause="collective_timeout", evidence=tuple(reports[:3])) for r in absent]
    return votes


def _lowest_completed(reports: list[Event], tl: JobTimeline) -> list[Vote]:
    """In each process group, the minority of ranks whose last completed work is lowest: the others waited for
    them. Work numbers count per group, so ranks are compared within the group their line names (`pg`); lines
    that name none (torch < 2.2) make one group only while no rank reports several works (`_groups`)."""
    votes: list[Vote] = []
    for group, lines in _groups(reports).items():
        done: dict[int, int] = {}
        for e in lines:
            value = e.get("last_completed")
            if value is None and (e.get("seq") or "").isdigit():
                value = str(int(e.get("seq", "0")) - 1)
            completed = _work(value)
            if completed is not None and e.rank is not None:
                done[e.rank] = min(done.get(e.rank, completed), completed)
        if len(set(done.values())) < 2:
            continue
        lowest = min(done.values())
        behind = sorted(r for r, v in done.items() if v == lowest)
        if len(behind) * 2 > len(done):
            continue
        where = f" in process group {group}" if group is not None else ""
        votes += [Vote("lowest completed", 30.0 / len(behind), f"its last completed collective ({lowest}){where} is "
                       "behind the other ranks'", rank=r, host=tl.facts.rank_host.get(r), cause="collective_timeout",
                       evidence=tuple(e for e in lines if e.rank == r)[:2]) for r in behind]
    return votes


def _groups(reports: list[Event]) -> dict[str | None, list[Event]]:
    """Watchdog reports by the process group their line names. Lines naming none (torch < 2.2) are one group only
    while every rank reports one work at most: a rank that times out in several works is in several groups (tensor,
    pipeline and data parallel each count their own), and unnamed groups' numbers cannot be compared."""
    out: dict[str | None, list[Event]] = defaultdict(list)
    for e in reports:
        out[e.get("pg")].append(e)
    unnamed = out.get(None, [])
    works: dict[int | None, set[str | None]] = defaultdict(set)
    for e in unnamed:
        works[e.rank].add(e.get("seq"))
    if any(len(seqs) > 1 for seqs in works.values()):
        del out[None]
    return out


#: work types that pair differently on each side (point-to-point, a batch of them), or that torch does not name
UNPAIRED_OPS = ("SEND", "RECV", "RECVANYSOURCE", "COALESCED", "UNKNOWN")
#: collectives whose input has the same number of elements on every rank (the list forms of all-gather and
#: reduce-scatter may be uneven; gather, scatter and all-to-all sizes differ by rank by design)
SAME_SIZE_OPS = ("ALLREDUCE", "ALLREDUCE_COALESCED", "BROADCAST", "REDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE")


def _mismatched_collectives(reports: list[Event], tl: JobTimeline) -> list[Vote]:
    """Ranks of one process group that timed out in the same work number but name different collectives in it
    (`OpType`), or the same collective of a fixed size with different element counts (`NumelIn`): they issued
    different calls, each waiting for peers that never joined it (a desync: a branch, an uneven batch, a module
    run on some ranks only). A job-level collective_mismatch; the one rank that differs from all the others (at
    least two that agree) is named."""
    votes: list[Vote] = []
    for group, lines in _groups(reports).items():
        by_work: dict[str, dict[int, Event]] = defaultdict(dict)
        for e in lines:
            if e.rank is not None and e.get("op") and _work(e.get("seq")) is not None:
                by_work[e.get("seq", "")].setdefault(e.rank, e)
        for seq, first in sorted(by_work.items(), key=lambda item: int(item[0])):
            called = {r: _call_of(e) for r, e in first.items()}
            if len(called) < 2 or any(c is None for c in called.values()) or len(set(called.values())) < 2:
                continue
            votes += _mismatch_votes(group, seq, first, called, tl)
            break  # the first work they disagree in; later ones follow from it
    return votes


def _call_of(e: Event) -> tuple[str, str | None] | None:
    """A watchdog report's collective as ranks must agree on it: its type, and its input size where fixed."""
    op = e.get("op") or ""
    if op in UNPAIRED_OPS:
        return None
    return op, e.get("numel_in") if op in SAME_SIZE_OPS else None


def _mismatch_votes(group: str | None, seq: str, first: dict[int, Event], called: dict[int, tuple],
                    tl: JobTimeline) -> list[Vote]:
    alike: dict[tuple, list[int]] = defaultdict(list)
    for rank, call in sorted(called.items()):
        alike[call].append(rank)
    kinds = sorted(alike.items(), key=lambda item: (len(item[1]), item[1][0]))
    where = f"work #{seq}" + (f" of process group {group}" if group is not None else "")
    told = "; ".join(f"{_call_text(call)} on rank{'s' if len(ranks) > 1 else ''} {_rank_list(ranks)}"
                     for call, ranks in kinds)
    evidence = tuple(first[ranks[0]] for _call, ranks in kinds)[:4]
    votes = [Vote("mismatched collectives", 35.0, f"the ranks timed out in {where} in different collectives: {told}",
                  cause="collective_mismatch", evidence=evidence)]
    odd = kinds[0][1]
    if len(kinds) == 2 and len(odd) == 1 and len(kinds[1][1]) >= 2:
        r = odd[0]
        votes.append(Vote("odd collective", 40.0, f"in {where} it waited in {_call_text(kinds[0][0])} while "
                          f"{len(kinds[1][1])} other ranks waited in {_call_text(kinds[1][0])}", rank=r,
                          host=tl.facts.rank_host.get(r), cause="collective_mismatch",
                          evidence=(first[r], first[kinds[1][1][0]])))
    return votes


def _call_text(call: tuple[str, str | None]) -> str:
    return call[0] + (f" of {call[1]} elements" if call[1] is not None else "")


def _rank_list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:5])) + (f" and {len(ranks) - 5} more" if len(ranks) > 5 else "")


def _never_issued(reports: list[Event], tl: JobTimeline) -> list[Vote]:
    """In a process group whose ranks timed out in work S, a rank whose last enqueued work is below S never issued
    that collective: the others waited for it (ProcessGroupNCCL's watchdog and heartbeat monitor lines name the
    group and its last enqueued work; a rank the flight recorder's dump signal reached says it too). Only a
    minority can be behind: most behind is a mismatch of what the ranks issued, not one rank that is late."""
    waited: dict[str, int] = {}  # process group -> the lowest work a watchdog timed out in
    enqueued: dict[str, dict[int, int]] = defaultdict(dict)  # process group -> rank -> its last enqueued work
    told: dict[tuple[str, int], Event] = {}
    for e in (f for rt in tl.ranks.values() for f in rt.failures if f.kind in ENQUEUE_KINDS):
        group, last = e.get("pg"), _work(e.get("last_enqueued"))
        if group is None or e.rank is None:
            continue
        seq = _work(e.get("seq")) if e.kind == "watchdog_timeout" else None
        if seq is not None:
            waited[group] = min(waited.get(group, seq), seq)
        if last is not None and last >= enqueued[group].get(e.rank, last):
            enqueued[group][e.rank] = last
            told[(group, e.rank)] = e
    votes: list[Vote] = []
    for group, work in sorted(waited.items()):
        lasts = enqueued[group]
        behind = sorted(r for r, last in lasts.items() if last < work)
        if not behind or len(behind) * 2 > len(lasts):
            continue
        waiting = tuple(e for e in reports if e.get("pg") == group and _work(e.get("seq")) == work)[:1]
        votes += [Vote("never issued", 30.0 / len(behind), f"its last enqueued collective in process group {group} is "
                       f"#{lasts[r]}, before #{work}, the one {len(lasts) - len(behind)} other rank(s) waited in",
                       rank=r, host=tl.facts.rank_host.get(r), cause="collective_timeout",
                       evidence=(told[(group, r)], *waiting)) for r in behind]
    return votes


#: kinds whose lines tell a rank's last enqueued work in a process group (`last_enqueued`, `pg`)
ENQUEUE_KINDS = ("watchdog_timeout", "dump_signal")


def _work(value: str | None) -> int | None:
    """A work sequence number (-1: none yet), or None."""
    return int(value) if value is not None and value.lstrip("-").isdigit() and len(value) < 19 else None


def _loud(rt: RankTimeline) -> bool:
    return any(e.kind not in QUIET_KINDS for e in rt.failures)


def barrier_counts(tl: JobTimeline) -> list[Vote]:
    """monitoredBarrier's named ranks; store barriers: who is missing, or more workers than the world size."""
    events = [e for e in tl.events if e.kind in ("barrier", "store_barrier")]  # periodic "Waiting in" lines too
    named = [e for e in events if e.kind == "barrier" and e.get("ranks")]
    if named:
        ranks = sorted({r for e in named for r in expand_ranks(e.get("ranks", ""), 1 << 16)})
        return [Vote("monitored barrier", 45.0 / len(ranks), "named by monitoredBarrier as not passing it", rank=r,
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
    if len(waits) < 2 or any(_small_int(e.get("reporter_rank")) != e.rank for e in waits):
        return []
    roots = {_small_int(e.get("root_rank")) for e in waits}
    root = roots.pop() if len(roots) == 1 else None
    if root is None or root in {e.rank for e in waits}:
        return []
    waiters = len({e.rank for e in waits})
    return [Vote("unique id", 35.0, f"{waiters} ranks setting up the job's NCCL communicator waited in the store for "
                 "the ncclUniqueId this rank, its root, never posted", rank=root, host=tl.facts.rank_host.get(root),
                 cause="rendezvous_timeout", evidence=tuple(waits[:2]))]


#: Slurm ends of an attempt after which the job may run again (requeue): an earlier attempt is visible
REQUEUE_MARKS = ("preempted", "slurm_time_limit", "node_failure")


def _store_counts(counted: list[Event], tl: JobTimeline) -> list[Vote]:
    e0 = counted[0]
    count, size = _small_int(e0.get("worker_count")), _small_int(e0.get("world_size"))
    launched = tl.facts.launched_world
    if count is None or size is None:
        return []
    if launched and size != launched:
        return [Vote("store barrier", 60.0, f"the store expects {size} ranks but {launched} were launched: "
                     "WORLD_SIZE disagrees with the ranks launched", cause="rank_config_mismatch",
                     evidence=tuple(counted[:3]))]
    invalid = sorted({r for e in counted if (r := _small_int(e.get("rank"))) is not None and r >= size})
    # a rank number the world cannot have runs with a wrong RANK or WORLD_SIZE (when nobody is missing)
    if invalid and count >= size:
        return [Vote("store barrier", 45.0 / len(invalid), f"rank {r} waits in a store barrier of world size {size}, "
                     "a rank that world cannot have", rank=r, host=tl.facts.rank_host.get(r),
                     cause="rank_config_mismatch", evidence=tuple(counted[:3])) for r in invalid]
    if count > size:
        stale = tl.facts.attempt > 0 or any(j.cause in REQUEUE_MARKS for j in tl.job_events)
        why = (f"{count} workers joined a store expecting {size}" +
               (": an earlier attempt of the job (requeued) left its count in the store" if stale
                else ": more processes were launched than the world size says"))
        return [Vote("store barrier", 60.0, why, cause="stale_rendezvous_state" if stale else "rank_config_mismatch",
                     evidence=tuple(counted[:3]))]
    world = _bounded_world(tl) or size
    if size > plausible_world(len(tl.facts.present), max(tl.facts.present, default=-1) + 1):
        return []
    reporters = {e.rank for e in counted if e.rank is not None}
    missing = [r for r in range(min(size, world)) if r not in reporters]
    if len(missing) > size - count > 0:
        narrowed = [r for r in missing if tl.rank(r).own_failures] or \
                   [r for r in missing if tl.rank(r).stopped_early]
        missing = narrowed or missing
    if not missing:
        return [Vote("store barrier", 20.0, f"only {count} of {size} ranks reached the store barrier",
                     cause="rendezvous_timeout", evidence=tuple(counted[:3]))]
    return [Vote("store barrier", 30.0 / len(missing), f"only {count} of {size} ranks reached the store barrier and "
                 f"rank {r} is not among those that report it", rank=r, host=tl.facts.rank_host.get(r),
                 cause="rendezvous_timeout", evidence=tuple(counted[:3])) for r in missing]


def _small_int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) < 10 else None


#: errors c10d raises in a rank that is connected to the store (a connect failure is kind `socket`)
STORE_CLIENT_KINDS = ("store_barrier", "exception")
STORE_CAUSES = ("rendezvous_timeout", "network_unreachable")


def _store_keys(stores: list[Event], tl: JobTimeline) -> list[Vote]:
    """Every rank waits in the store for one rank's key: that rank never wrote it (or runs under another RANK)."""
    keyed = [e for e in stores if _small_int(e.get("key_rank")) is not None and e.rank is not None]
    selfish = sorted({e.rank for e in keyed if _small_int(e.get("key_rank")) == e.rank})  # type: ignore[misc]
    if selfish:
        return [Vote("store keys", 45.0 / len(selfish), "it waits for its own rank's key: its RANK disagrees with the "
                     "rank it was launched as", rank=r, host=tl.facts.rank_host.get(r), cause="rank_config_mismatch",
                     evidence=tuple(e for e in keyed if e.rank == r)[:2]) for r in selfish]
    if not keyed:
        return []
    (target, _n), *_ = Counter(_small_int(e.get("key_rank")) for e in keyed).most_common(1)
    assert target is not None
    reached = [e for e in tl.rank(target).failures if e.kind in STORE_CLIENT_KINDS and e.cause in STORE_CAUSES]
    cause = "rank_config_mismatch" if reached else "rendezvous_timeout"
    why = ("every rank waits for its key although it reached the store itself: its RANK is not the one it was "
           "launched as" if reached else "every rank waits in the store for its key")
    return [Vote("store keys", 35.0, why, rank=target, host=tl.facts.rank_host.get(target), cause=cause,
                 evidence=tuple(keyed[:2] + reached[:1]))]


def agent_teardown(tl: JobTimeline) -> list[Vote]:
    """A torchelastic agent SIGTERMs its surviving workers: the worker pid it did not signal had already died. An
    agent's lines of no known host speak for the hosts that no agent's line of a known host speaks for."""
    lines_of: dict[str | None, list[Event]] = defaultdict(list)
    for e in tl.events:
        if e.kind == "agent_sigterm" and e.pid is not None:
            lines_of[e.host].append(e)
    if not lines_of:
        return []
    workers_of: dict[str, dict[int, int]] = defaultdict(dict)  # host -> worker pid -> rank (one pass, not per host)
    for (h, pid), r in tl.facts.pid_rank.items():
        workers_of[h][pid] = r
    votes = []
    for host, lines in lines_of.items():
        signalled = {e.pid for e in lines}
        workers = [(pid, r) for h, pids in workers_of.items() if h not in lines_of for pid, r in pids.items()] \
            if host is None else list(workers_of.get(host, {}).items())
        spared = sorted({r for pid, r in workers if pid not in signalled})
        if spared and len(spared) < len(workers):
            votes += [Vote("agent teardown",
                           35.0 / len(spared) * (VICTIM_DISCOUNT if died_as_victim(tl.rank(r)) else 1.0),
                           f"its pid is the one the agent on {host or '?'} did not SIGTERM (it had already died)",
                           rank=r, host=host or tl.facts.rank_host.get(r), evidence=tuple(lines[:3])) for r in spared]
    return votes


def logs_that_stop_early(tl: JobTimeline) -> list[Vote]:
    """A rank whose log ends earlier than its peers' (and that said nothing itself) while the job failed."""
    if not (any(rt.failures for rt in tl.ranks.values()) or any(t.own_death for t in tl.tasks) or tl.unranked):
        return []
    early = [rt for rt in tl.ranks.values() if rt.stopped_early and not _loud(rt)]
    if not early or len(early) > 2:
        return []
    return [Vote("log stops early", 12.0 / len(early), f"rank {rt.rank}'s log stops earlier than the other ranks' "
                 "logs", rank=rt.rank, host=rt.host) for rt in early]


#: what NCCL's init weighs against its missing ranks: as monitoredBarrier's named ranks (45), as decisive as the
#: barrier it is (every rank of the communicator blocks in ncclCommInitRank until all have joined)
NCCL_INIT_WAIT_WEIGHT = 45.0


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
        if e.kind == "nccl_init" and (n := _small_int(e.get("nranks"))):
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
    return [Vote("stuck in NCCL init", NCCL_INIT_WAIT_WEIGHT / len(missing), f"{waiting} of {world} ranks set NCCL up "
                 f"and none finished its init (no Init COMPLETE), waiting{until}; rank {r} logged no NCCL line",
                 rank=r, host=tl.facts.rank_host.get(r), cause="rendezvous_timeout", evidence=tuple(last))
            for r in missing]


def odd_versions(tl: JobTimeline) -> list[Vote]:
    """Ranks that report library versions (their own and a peer's): the host of the minority version is odd."""
    reports = [e for rt in tl.ranks.values() for e in rt.failures if e.get("version")]
    version_of: dict[int, str] = {}
    for e in reports:
        pairs = ((e.rank, e.get("version")), (_small_int(e.get("peer_rank")), e.get("peer_version")))
        for rank, version in pairs:
            if rank is not None and version:
                version_of.setdefault(rank, version)
    versions = Counter(version_of.values())
    if len(versions) < 2:
        return []
    minority = min(versions, key=lambda v: (versions[v], str(v)))
    if versions[minority] * 2 >= len(version_of):
        return []  # half and half: neither side is the odd one
    hosts = {tl.facts.rank_host.get(r) for r, v in version_of.items() if v == minority}
    if len(hosts) != 1 or None in hosts:
        return []
    host = hosts.pop()
    others = ", ".join(sorted(str(v) for v in versions if v != minority))
    return [Vote("odd version", 45.0, f"host {host} runs version {minority}, the other hosts {others}", host=host,
                 cause=reports[0].cause, evidence=tuple(reports[:2]))]


#: interfaces a communicator spanning hosts cannot use to reach another host
_BAD_IFNAME = re.compile(r"^(?:lo|docker\d*|virbr\d*|br-[0-9a-f]+)$")
_LOOPBACK = re.compile(r"^(?:127\.|::1$)")
_LINK_LOCAL = re.compile(r"^(?:fe80:|169\.254\.)", re.IGNORECASE)


def _bad_address(ip: str) -> bool:
    """A loopback or link-local address: no other host reaches it."""
    return bool(_LOOPBACK.match(ip) or _LINK_LOCAL.match(ip))


def interface_picks(tl: JobTimeline) -> list[Vote]:
    """NCCL/gloo picked loopback, a link-local address or a container bridge in a job spanning hosts, or a rank
    failed to reach a peer at such an address (`_bad_peer_addresses`): the connect failures or the hang that follow
    are a wrong interface (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME)."""
    picks = [e for e in tl.events if e.kind == "interface" and (e.get("ifname") or e.get("ip"))]
    hosts = {h for h in tl.facts.rank_host.values()} | {e.host for e in picks if e.host}
    advertised = _bad_peer_addresses(tl, len(hosts) >= 2)
    if advertised:
        return advertised
    if len(hosts) < 2 or not any(rt.failures for rt in tl.ranks.values()):
        return []
    bad = [e for e in picks if _BAD_IFNAME.match((e.get("ifname") or "").split(":")[0])
           or _bad_address(e.get("ip") or "")]
    if not bad:
        return []
    why = f"it communicates over {bad[0].get('ifname') or bad[0].get('ip')}, which cannot reach other hosts"
    ranks = sorted({e.rank for e in bad if e.rank is not None})
    picked = {e.rank for e in picks if e.rank is not None}
    if not ranks or len(ranks) == len(picked):
        return [Vote("interface pick", 50.0, "every rank " + why.split(" ", 1)[1], cause="wrong_interface",
                     evidence=tuple(bad[:2]))]
    return [Vote("interface pick", 45.0 / len(ranks), why, rank=r, host=tl.facts.rank_host.get(r),
                 cause="wrong_interface", evidence=tuple(e for e in bad if e.rank == r)[:2]) for r in ranks]


def _bad_peer_addresses(tl: JobTimeline, across_hosts: bool) -> list[Vote]:
    """A connect or a socket to a peer at a link-local address (fe80::/10, 169.254/16), or at a loopback one in a job
    spanning hosts, failed: the peer advertised an address no other host can reach (NCCL's bootstrap and gloo's
    device take the interface NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME names, else one they pick), not a peer that died."""
    failed = [e for e in tl.failure_lines()
              if (ip := e.get("peer_ip")) and (_LINK_LOCAL.match(ip) or (across_hosts and _bad_address(ip)))]
    if not failed:
        return []
    why = f"ranks failed to reach a peer at {failed[0].get('peer_ip')}, an address other hosts cannot reach"
    return [Vote("interface pick", 50.0, why, cause="wrong_interface", evidence=tuple(failed[:2]))]


_INVALID_ARGUMENT = re.compile(r"\binvalid (?:argument|usage)\b", re.IGNORECASE)


def ranks_beyond_world(tl: JobTimeline) -> list[Vote]:
    """NCCL rejects ranks outside the world it was given (`invalid argument`/`invalid usage` at init) and every
    task from k up fails while the tasks below k go on: the world size is smaller than the tasks launched."""
    lines = [e for rt in tl.ranks.values() for e in rt.failures] + tl.unranked
    rejected = [e for e in lines if e.kind in ("exception", "nccl_warn") and _INVALID_ARGUMENT.search(e.text)]
    dead = sorted({r for t in tl.tasks if t.own_death for r in t.ranks})
    if not rejected or len(dead) < 2 or dead[0] == 0 or dead != list(range(dead[0], dead[-1] + 1)):
        return []
    if dead[-1] < max(tl.facts.present, default=-1):
        return []  # a higher rank did not fail: not "every task from k up"
    why = (f"NCCL rejected tasks {dead[0]}-{dead[-1]} ('invalid argument') while the tasks below {dead[0]} went on: "
           "the world size is smaller than the tasks launched")
    return [Vote("ranks beyond world", 60.0, why, cause="rank_config_mismatch", evidence=tuple(rejected[:2]))]


def job_events(tl: JobTimeline) -> list[Vote]:
    """Slurm ended the job itself (time limit, preemption, scancel, a node failure); a step's cancel line
    (also what a failing rank's teardown prints) weighs little."""
    votes = []
    for e in tl.job_events:
        host = e.get("host") or e.get("host2") if e.cause == "node_failure" else None
        weight = float(max(e.priority, 50)) if e.role == "culprit" else own_weight(e)
        why = "Slurm ended the job" if e.role == "culprit" else "Slurm cancelled the step"
        votes.append(Vote("slurm", weight, why, host=host if host and is_host_name(host) else None, cause=e.cause,
                          evidence=(e,), time=e.time, time_family=e.time_family))
    return votes


#: every producer the combiner runs, in the order their reasons are reported
#: A stack dumped by the hang monitor shows the rank's state at the hang itself, not an inference from its peers'
#: words: weighed like a rank's own decisive failure (50-100), above srun's first death (40; under a hang every
#: rank exits 124 at once, so srun's order says nothing) and the pointers of victims (8-30).
HANG_STACK_WEIGHT = 70.0
MISMATCH_STACK_WEIGHT = 50.0


def hang_stacks(tl: JobTimeline) -> list[Vote]:
    """The hang monitor's stack dumps (analyze/stacks.py): ranks whose main thread is outside any collective while
    others wait in one are the stuck ones (collective_timeout); with every rank in a collective but not the same
    one, the minority's ranks (collective_mismatch), or no single rank on a tie; all in one collective, no single
    rank (collective_timeout)."""
    stacks = {e.rank: e for e in tl.events if e.kind == "stack" and e.rank is not None}
    if len(stacks) < 2:
        return []
    outside = sorted(r for r, e in stacks.items() if e.get("in_collective") == "no")  # type: ignore[type-var]
    if outside and len(outside) < len(stacks):
        return [Vote("hang stacks", HANG_STACK_WEIGHT / len(outside), f"its stack is outside any collective "
                     f"({stacks[r].get('stuck_frame')}) while {len(stacks) - len(outside)} other rank(s) wait in one",
                     rank=r, host=stacks[r].host or tl.facts.rank_host.get(r), cause="collective_timeout",
                     evidence=(stacks[r],), own=True) for r in outside]
    counts = Counter(e.get("collective") for e in stacks.values() if e.get("in_collective") == "yes")
    if outside:
        return []
    if len(counts) == 1:
        return [Vote("hang stacks", MISMATCH_STACK_WEIGHT / 2, f"every rank dumped waits in {next(iter(counts))}: a "
                     "collective that never completes, no rank outside it", cause="collective_timeout",
                     evidence=tuple(list(stacks.values())[:2]))]
    (_, most), (_, second) = counts.most_common(2)
    if most == second:
        return [Vote("hang stacks", MISMATCH_STACK_WEIGHT, "the ranks wait in different collectives: "
                     + ", ".join(sorted(str(c) for c in counts)), cause="collective_mismatch",
                     evidence=tuple(list(stacks.values())[:3]))]
    minority = sorted(r for r, e in stacks.items() if counts[e.get("collective")] < most)  # type: ignore[type-var]
    return [Vote("hang stacks", MISMATCH_STACK_WEIGHT / len(minority), f"it waits in {stacks[r].get('collective')} "
                 f"while most ranks wait in {counts.most_common(1)[0][0]}", rank=r, host=stacks[r].host,
                 cause="collective_mismatch", evidence=(stacks[r],), own=True) for r in minority]


#: The flight recorder's view equals the stacks' in strength: the backend's own record of what each rank issued.
FR_BEHIND_WEIGHT = HANG_STACK_WEIGHT
FR_MISMATCH_WEIGHT = 55.0


def flight_recorder(tl: JobTimeline) -> list[Vote]:
    """The flight recorder dumps (analyze/flight_recorder.py), per process group: the ranks whose last collective
    has the lowest sequence number never issued the one their peers wait in (collective_timeout); ranks at the
    same number in different collectives or sizes disagree (collective_mismatch: the minority, or no single rank
    on a tie); all in the same collective says nothing."""
    groups: dict[str, dict[int, Event]] = defaultdict(dict)
    for e in tl.events:
        if e.kind == "fr_last" and e.rank is not None and str(e.get("seq", "")).isdigit():
            groups[str(e.get("pg"))][e.rank] = e
    votes: list[Vote] = []
    for group, ranks in sorted(groups.items()):
        if len(ranks) < 2:
            continue
        seqs = {r: int(str(e.get("seq"))) for r, e in ranks.items()}
        low, top = min(seqs.values()), max(seqs.values())
        if low < top:
            behind = sorted(r for r, s in seqs.items() if s == low)
            ahead = next(e for r, e in ranks.items() if seqs[r] == top)
            votes += [Vote("flight recorder", FR_BEHIND_WEIGHT / len(behind), f"its last collective in process group "
                           f"{group} is #{low} while {sum(s > low for s in seqs.values())} other rank(s) issued up to "
                           f"#{top} ({ahead.get('collective')})", rank=r,
                           host=ranks[r].host or tl.facts.rank_host.get(r), cause="collective_timeout",
                           evidence=(ranks[r], ahead), own=True) for r in behind]
            continue
        issued = {r: (str(e.get("collective")), str(e.get("sizes"))) for r, e in ranks.items()}
        kinds = Counter(issued.values())
        if len(kinds) == 1:
            continue
        (common, most), (_, second) = kinds.most_common(2)
        if most == second:
            shown = ", ".join(sorted(f"{name} {sizes}" for name, sizes in kinds))
            votes.append(Vote("flight recorder", FR_MISMATCH_WEIGHT, f"at collective #{top} of process group {group} "
                              f"the ranks issued different collectives: {shown}", cause="collective_mismatch",
                              evidence=tuple(list(ranks.values())[:3])))
            continue
        minority = sorted(r for r, kind in issued.items() if kinds[kind] < most)
        votes += [Vote("flight recorder", FR_MISMATCH_WEIGHT / len(minority), f"at collective #{top} of process group "
                       f"{group} it issued {issued[r][0]} {issued[r][1]} while most ranks issued {common[0]} "
                       f"{common[1]}", rank=r, host=ranks[r].host or tl.facts.rank_host.get(r),
                       cause="collective_mismatch", evidence=(ranks[r],), own=True) for r in minority]
    return votes


def desync_reports(tl: JobTimeline) -> list[Vote]:
    """ProcessGroupWrapper's mismatch reports (`mismatch_report`): each reporting rank names the first rank whose
    collective differs from its own, and the odd rank names a peer too. The job had a mismatch; the rank that at
    least two reporters name, more than any other, is the odd one; one report (or a split) singles out nobody."""
    named: dict[int, tuple[int, Event]] = {}
    for e in (f for f in tl.failure_lines() if f.kind == "mismatch_report"):
        reporter = e.rank if e.rank is not None else _small_int(e.get("reporter"))
        other = _small_int(e.get("named_rank"))
        if reporter is not None and other is not None and other != reporter:
            named.setdefault(reporter, (other, e))
    if not named:
        return []
    counts = Counter(other for other, _e in named.values()).most_common()
    votes = [Vote("mismatch reports", 40.0, f"{len(named)} rank(s) found a collective that differs from another "
                  "rank's", cause="collective_mismatch", evidence=tuple(e for _o, e in named.values())[:3])]
    top, n = counts[0]
    if n >= 2 and (len(counts) == 1 or n > counts[1][1]):
        votes.append(Vote("odd collective", 45.0, f"named as running a different collective by {n} of the "
                          f"{len(named)} ranks that report the mismatch", rank=top, host=tl.facts.rank_host.get(top),
                          cause="collective_mismatch", evidence=tuple(e for o, e in named.values() if o == top)[:3]))
    return votes


DESYNC_VERDICT_WEIGHT = 50.0  # torch read every rank's last collective from the store: above a rank's absence (30)


def desync_verdicts(tl: JobTimeline) -> list[Vote]:
    """ProcessGroupNCCL's desync report (`desync_verdict`): the ranks torch found at the lowest collective, or never
    in one, held the others up. Every reporter reads the same store, so their lists are joined. The ranks it lists
    share the blame; a list of the whole world (every rank stuck in one collective) names nobody."""
    told = [f for f in tl.failure_lines() if f.kind == "desync_verdict"]
    named = sorted({r for e in told for r in expand_ranks(e.get("ranks") or "")})
    if not named:
        return []
    world = max(_bounded_world(tl) or 0, named[-1] + 1)
    if len(named) >= world:
        return [Vote("desync report", 20.0, f"torch's desync report lists every rank ({world}) at one collective: "
                     "they all waited in it", cause="collective_timeout", evidence=tuple(told[:2]))]
    why = f"torch's desync report lists rank(s) {_rank_list(named)} as the lagging ones that held the others up"
    return [Vote("desync report", DESYNC_VERDICT_WEIGHT / len(named), why, rank=r, host=tl.facts.rank_host.get(r),
                 cause="collective_timeout", evidence=tuple(told[:3])) for r in named]


def duplicate_ranks(tl: JobTimeline) -> list[Vote]:
    """Launchers that number ranks themselves (Lightning, Fabric, NeMo) announce each process's rank once: a rank
    announced by several processes while others of the world never are means processes took the same numbers (srun's
    tasks not handed to the launcher, each node counting from 0): the world cannot form, whoever waits first."""
    told = [e for e in tl.events if e.kind == "rank_announce" and e.get("global_rank") is not None]
    worlds = {_small_int(e.get("world_size")) for e in told}
    world = worlds.pop() if len(worlds) == 1 else None
    if not world:
        return []
    counts = Counter(e.get("global_rank") for e in told)
    twice = sorted((int(r) for r, n in counts.items() if n > 1 and r is not None and r.isdigit()))
    if not twice or len(counts) >= world:
        return []
    first = str(twice[0])
    return [Vote("duplicate ranks", 45.0, f"rank(s) {_rank_list(twice)} of {world} were announced by more than one "
                 f"process and {world - len(counts)} never were: processes took the same rank numbers",
                 cause="rank_config_mismatch", evidence=tuple(e for e in told if e.get("global_rank") == first)[:2])]


PRODUCERS: tuple[Callable[[JobTimeline], list[Vote]], ...] = (
    job_events, own_failures, detectors_and_hosts, srun_task_deaths, vanished_ranks, agent_teardown,
    barrier_counts, timeout_reporters, named_peers, odd_versions, interface_picks, ranks_beyond_world,
    logs_that_stop_early, hang_stacks, flight_recorder, stuck_in_nccl_init, duplicate_ranks, desync_reports,
    desync_verdicts,
)


def all_votes(tl: JobTimeline) -> list[Vote]:
    return [vote for producer in PRODUCERS for vote in producer(tl)]
