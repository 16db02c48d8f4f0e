"""Rules: events -> diagnosis. Separate the culprit from its victims and find the first failing rank.

Order of reasoning (each step only when the previous one found nothing):
1. culprit-role events (an OOM, an exception, a Slurm time limit, a GPU fault): the earliest one when the
   times compare, else the strongest (signature priority), then the one the victims point at;
2. causal evidence from the victims: ranks named by monitoredBarrier, ranks missing from a store barrier,
   the rank whose last completed collective is lowest or that is absent from the ranks that timed out,
   the peer named by `Connection closed by peer` / NCCL remote errors, the pid an agent did not SIGTERM;
3. `either` events (an srun exit code, a connect failure reported by everyone);
4. ranks that fell silent (started, never exited, said nothing);
5. otherwise `unknown`, with the last lines of the logs as evidence.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ddpslurm.analyze.diagnosis import Diagnosis, Evidence, RankRow
from ddpslurm.analyze.events import Event, FileSummary, SourceFile
from ddpslurm.analyze.records import SIGNAL_CAUSES, SIGNAL_NAMES
from ddpslurm.analyze.signatures import SignatureSet
from ddpslurm.analyze.timestamps import comparable, format_time

TIME_TOLERANCE = 1.0  # seconds: closer than this, the stronger signature wins (1-second sources)
MAX_EVIDENCE = 8


def expand_ranks(text: str) -> list[int]:
    """`2-7`, `0,3-5`, `6, 7` -> a sorted list of ranks (bounded)."""
    out: set[int] = set()
    for part in re.split(r"[,\s]+", text.strip()):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            continue
        lo = int(m[1])
        hi = int(m[2]) if m[2] else lo
        if hi - lo <= 100_000:
            out.update(range(lo, hi + 1))
    return sorted(out)


@dataclass
class Facts:
    """What the events tell about the job as a whole."""

    world_size: int | None = None
    rank_host: dict[int, str] = field(default_factory=dict)
    present: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)
    exited: dict[int, Event] = field(default_factory=dict)
    srun_order: dict[int, int] = field(default_factory=dict)
    ip_host: dict[str, str] = field(default_factory=dict)
    torchrun: bool = False  # srun task ids then number nodes, not ranks
    odd_tails: set[int] = field(default_factory=set)
    attempt: int = 0
    launched_world: int | None = None  # from Slurm/submitit/ddpslurm records, not from what the script said


_AGENT_KINDS = ("agent_sigterm", "agent_failed", "elastic_failure")


def resolve(events: list[Event], sources: Sequence[SourceFile], summaries: Sequence[FileSummary],
            facts_in: dict[str, Any]) -> tuple[list[Event], Facts]:
    """Give events their global rank and host (NCCL host:pid map, records, agent blocks, srun task lines)."""
    facts = Facts()
    pid_rank: dict[tuple[str, int], tuple[int, int]] = {}  # (host, pid) -> (rank, nranks)
    local_rank: dict[tuple[str, int], int] = {}
    worlds: list[int] = []
    launched: list[int] = []
    if facts_in.get("world_size"):
        worlds.append(int(facts_in["world_size"]))
        launched.append(int(facts_in["world_size"]))
    for e in events:
        if e.kind == "nccl_init" and e.host and e.pid is not None:
            r, n = int(e.get("nccl_rank", "0")), int(e.get("nranks", "0"))
            old = pid_rank.get((e.host, e.pid))
            if old is None or n > old[1]:
                pid_rank[(e.host, e.pid)] = (r, n)
            worlds.append(n)
        elif e.kind in ("start", "exit", "exit_signal", "elastic_failure", "rank_info") and e.rank is not None:
            if e.host and e.pid is not None:
                pid_rank.setdefault((e.host, e.pid), (e.rank, 0))
            if e.host and e.local_rank is not None:
                local_rank.setdefault((e.host, e.local_rank), e.rank)
            if e.host:
                facts.rank_host.setdefault(e.rank, e.host)
            if e.kind == "rank_info" and e.get("world_size", "").isdigit():
                worlds.append(int(e.get("world_size")))
                launched.append(int(e.get("world_size")))
            if e.kind == "start":
                facts.started.add(e.rank)
                if e.get("world_size", "").isdigit():
                    worlds.append(int(e.get("world_size")))
                    launched.append(int(e.get("world_size")))
            elif e.kind in ("exit", "exit_signal"):
                facts.exited[e.rank] = e
        elif e.kind == "slurm_task" and e.get("tasks") and not any(x.kind in _AGENT_KINDS for x in events):
            for r in expand_ranks(e.get("tasks", "")):
                if e.get("host"):
                    facts.rank_host.setdefault(r, e.get("host"))
                facts.srun_order.setdefault(r, len(facts.srun_order))
        if e.get("world_size", "").isdigit() and e.kind == "store_barrier":
            worlds.append(int(e.get("world_size")))
    hosts = {e.host for e in events if e.host} | {s.host for s in sources if s.host}
    worker_dir = _worker_dirs(events, sources)
    pid_hosts: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for (h, pid), (r, _n) in pid_rank.items():
        pid_hosts[pid].append((r, h))
    unique_pid = {pid: pairs[0] for pid, pairs in pid_hosts.items() if len(pairs) == 1}
    facts.torchrun = (any(e.kind in _AGENT_KINDS for e in events) or any(s.local_rank is not None for s in sources)
                      or any(s.torchrun for s in summaries))
    out: list[Event] = []
    for e in events:
        rank, host = e.rank, e.host
        if facts.torchrun and e.get("srun_task") is not None and e.kind not in ("start", "exit"):
            rank = None  # `N: ` from srun --label (or %t of submitit) numbers torchrun's nodes, not ranks
        if e.kind == "slurm_task" and rank is None and not facts.torchrun:
            tasks = expand_ranks(e.get("tasks", ""))
            rank = tasks[0] if tasks else None
            host = host or e.get("host")
        known = worker_dir.get(os.path.dirname(e.file))
        if known is not None:
            rank = known[0] if rank is None else rank
            host = host or known[1]
        if rank is None and host and e.pid is not None and (host, e.pid) in pid_rank:
            rank = pid_rank[(host, e.pid)][0]
        elif rank is None and host is None and e.pid is not None and e.pid in unique_pid:
            rank, host = unique_pid[e.pid]
        if rank is None and host and e.local_rank is not None and (host, e.local_rank) in local_rank:
            rank = local_rank[(host, e.local_rank)]
        if rank is None and e.local_rank is not None and len(hosts) <= 1 and e.kind != "slurm_task":
            rank = e.local_rank
        if rank is not None and host is None:
            host = facts.rank_host.get(rank)
        if (rank, host) != (e.rank, e.host):
            e = replace(e, rank=rank, host=host)
        if e.rank is not None and e.host and e.kind not in ("slurm_task", "slurm_job"):
            facts.rank_host.setdefault(e.rank, e.host)
        if e.rank is not None and e.kind not in ("slurm_task", "slurm_job"):
            facts.present.add(e.rank)
        out.append(e)
    for (host, _pid), (rank, _n) in pid_rank.items():
        facts.rank_host.setdefault(rank, host)
        facts.present.add(rank)
    for s in sources:
        if s.rank is not None and s.kind == "log":
            facts.present.add(s.rank)
    for summary in summaries:
        facts.present |= summary.ranks_seen
    facts.present |= facts.started
    top = max(facts.present, default=-1) + 1
    worlds.append(top)
    facts.world_size = max(worlds) if worlds and max(worlds) > 0 else None
    facts.launched_world = max(launched) if launched else None
    facts.ip_host.update(facts_in.get("ip_host", {}))
    facts.odd_tails = odd_tails(sources, summaries)
    facts.attempt = int(facts_in.get("attempt", 0) or 0)
    return out, facts


def _worker_dirs(events: list[Event], sources: Sequence[SourceFile]) -> dict[str, tuple[int, str | None]]:
    """torchrun --log-dir: the files of `attempt_N/<local_rank>/` are one worker; its NCCL init names its rank."""
    dirs = {os.path.dirname(s.display) for s in sources if s.local_rank is not None}
    best: dict[str, tuple[int, int, str | None]] = {}
    for e in events:
        if e.kind != "nccl_init":
            continue
        folder = os.path.dirname(e.file)
        if folder in dirs:
            n = int(e.get("nranks", "0"))
            if folder not in best or n > best[folder][1]:
                best[folder] = (int(e.get("nccl_rank", "0")), n, e.host)
    return {d: (r, h) for d, (r, _n, h) in best.items()}


def _time_order(candidates: list[Event]) -> Event | None:
    """The earliest candidate when all times are present and comparable; stronger wins within tolerance."""
    if not candidates or any(e.time is None for e in candidates):
        return None
    fam = candidates[0].time_family
    if not all(comparable(fam, e.time_family) for e in candidates):
        return None
    earliest = min(e.time for e in candidates)  # type: ignore[type-var]
    near = [e for e in candidates if e.time - earliest <= TIME_TOLERANCE]  # type: ignore[operator]
    return max(near, key=lambda e: (e.priority, -e.time))  # type: ignore[operator]


def _rank_key(facts: Facts, accused: Counter) -> Any:
    def key(e: Event) -> tuple:
        srun = facts.srun_order.get(e.rank, 10**9) if e.rank is not None else 10**9
        return (-e.priority, -accused.get(e.rank, 0), srun,
                e.time if e.time is not None else float("inf"), e.rank if e.rank is not None else 10**9, e.file, e.line)
    return key


def _choose(candidates: list[Event], facts: Facts, accused: Counter) -> tuple[Event, bool]:
    """The culprit among candidate events; the flag says whether time decided it."""
    by_actor: dict[Any, Event] = {}
    key = _rank_key(facts, accused)
    for e in sorted(candidates, key=key):
        actor = e.rank if e.rank is not None else ("host", e.host, e.kind if e.kind == "slurm_job" else None)
        if actor not in by_actor:
            by_actor[actor] = e
        else:
            best = by_actor[actor]
            if e.time is not None and best.time is not None and comparable(e.time_family, best.time_family) \
                    and e.time < best.time and e.priority >= best.priority:
                by_actor[actor] = e
    firsts = list(by_actor.values())
    if len(firsts) == 1:
        return firsts[0], firsts[0].time is not None
    # each actor's first failure time: the earliest timed event of that actor
    timed = _time_order(firsts)
    if timed is not None:
        return timed, True
    strongest = max(e.priority for e in firsts)
    top = [e for e in firsts if e.priority >= strongest - 0]
    timed = _time_order(top)
    if timed is not None:
        return timed, True
    return sorted(top, key=key)[0], False


@dataclass
class Suspect:
    ranks: list[int]
    cause: str
    reason: str
    confidence: str
    evidence: list[Event]
    host: str | None = None


def _ranks_of_host(facts: Facts, host: str) -> list[int]:
    return sorted(r for r, h in facts.rank_host.items() if h == host or h.split(".")[0] == host.split(".")[0])


def infer_from_victims(events: list[Event], facts: Facts) -> Suspect | None:
    """Causal evidence: whom do the victims point at?"""
    world = facts.world_size
    # a. monitoredBarrier names the ranks
    mb = [e for e in events if e.signature == "monitored-barrier" and e.get("ranks")]
    if mb:
        ranks = sorted({r for e in mb for r in expand_ranks(e.get("ranks", ""))})
        if ranks:
            return Suspect(ranks, "collective_timeout", "named by monitoredBarrier", "high", mb[:3])
    # b. store barrier: worker_count vs world_size
    sb = [e for e in events if e.kind == "store_barrier" and e.get("worker_count") and e.get("world_size")]
    if sb:
        e0 = sb[0]
        count, size = int(e0.get("worker_count", "0")), int(e0.get("world_size", "0"))
        if facts.launched_world and size != facts.launched_world:
            return Suspect([], "rank_config_mismatch", f"the store expects {size} ranks but {facts.launched_world} "
                           "were launched: WORLD_SIZE disagrees with the ranks launched", "medium", sb[:3])
        if count > size:
            if facts.attempt:  # a requeued attempt found the previous attempt's counter in the store
                return Suspect([], "stale_rendezvous_state", f"{count} workers joined a store expecting {size} "
                               f"(attempt {facts.attempt} reused the store)", "medium", sb[:3])
            return Suspect([], "rank_config_mismatch", f"{count} workers joined a store expecting {size}: "
                           "more processes were launched than the world size says", "medium", sb[:3])
        reporters = {e.rank for e in events if e.kind == "store_barrier" and e.rank is not None}
        missing = [r for r in range(size) if r not in reporters]
        if len(missing) > size - count > 0:
            own = {e.rank for e in events if e.role in ("culprit", "either") and e.kind not in _QUIET_KINDS}
            narrowed = [r for r in missing if r in own] or [r for r in missing if r in facts.odd_tails]
            missing = narrowed or missing
        return Suspect(missing, "rendezvous_timeout",
                       f"only {count} of {size} ranks reached the store barrier", "medium" if missing else "low",
                       sb[:3])
    keyed = [e for e in events if e.kind == "store_barrier" and e.get("key_rank", "").isdigit() and e.rank is not None]
    if keyed:
        selfish = sorted({e.rank for e in keyed if int(e.get("key_rank", "-1")) == e.rank})  # type: ignore[misc]
        if selfish:
            return Suspect(selfish, "rank_config_mismatch",
                           "it waits for its own rank's key: its RANK disagrees with the rank Slurm gave it", "medium",
                           [e for e in keyed if e.rank in selfish][:2])
        waited = Counter(int(e.get("key_rank", "0")) for e in keyed)
        (target, _n), *_ = waited.most_common(1)
        in_store = [e for e in events if e.rank == target and e.signature in _STORE_SIGNATURES]
        if in_store:  # it reached the store but never wrote its key: it runs under another RANK
            return Suspect([target], "rank_config_mismatch", "every rank waits for its key although it reached the "
                           "store itself: its RANK is not the rank Slurm gave it", "medium", keyed[:2] + in_store[:1])
        return Suspect([target], "rendezvous_timeout", "every rank waits for its key in the store", "medium",
                       keyed[:3])
    storeish = [e for e in events if e.kind == "store_barrier"]
    if storeish and world:
        reporters = {e.rank for e in storeish if e.rank is not None}
        missing = [r for r in range(world) if r not in facts.present]
        if missing:
            return Suspect(missing, "rendezvous_timeout", "ranks never reached the rendezvous", "medium", storeish[:3])
    # c. watchdog timeouts
    wd = [e for e in events if e.kind == "watchdog_timeout" and e.rank is not None]
    if wd:
        per_rank: dict[int, int] = {}
        for e in wd:
            value = e.get("last_completed")
            if value is None and e.get("seq") is not None:
                value = str(int(e.get("seq")) - 1)
            if value is not None and value.lstrip("-").isdigit():
                per_rank[e.rank] = min(per_rank.get(e.rank, 10**12), int(value))  # type: ignore[index]
        reporters = {e.rank for e in wd}
        if len(set(per_rank.values())) > 1:
            lowest = min(per_rank.values())
            ranks = sorted(r for r, v in per_rank.items() if v == lowest)
            if len(ranks) < len(per_rank):
                return Suspect(ranks, "collective_timeout",
                               f"its last completed collective ({lowest}) is behind the other ranks'", "medium",
                               [e for e in wd if e.rank in ranks][:2] + [e for e in wd if e.rank not in ranks][:2])
        if world and len(reporters) < world:
            loud = _loud_ranks(events)
            absent = [r for r in range(world) if r not in reporters and r not in loud]
            absent = absent or [r for r in range(world) if r not in reporters]
            return Suspect(absent, "collective_timeout", "it is absent from the ranks whose watchdog timed out",
                           "medium", wd[:3])
    # d. peers named by the victims
    accused = accusations(events, facts)
    if accused:
        (target, n), *_ = accused.most_common(1)
        if isinstance(target, int):
            ranks, host = [target], facts.rank_host.get(target)
        else:
            ranks, host = _ranks_of_host(facts, target), target
            silent = [r for r in ranks if r not in facts.exited]
            ranks = silent or ranks
        named = [e for e in events if e.role == "victim" and _peer_of(e, facts) == target]
        return Suspect(ranks, "unknown", f"named as the lost peer by {n} victim(s)", "medium", named[:3], host=host)
    # e. the agent SIGTERMed every worker but one
    terms = [e for e in events if e.kind == "agent_sigterm" and e.pid is not None]
    if terms:
        by_host: dict[str | None, set[int]] = defaultdict(set)
        for e in terms:
            by_host[e.host].add(e.pid)  # type: ignore[arg-type]
        known = _worker_pids(events)
        for host, pids in by_host.items():
            others = {pid: r for (h, pid), r in known.items() if (h == host or host is None) and pid not in pids}
            if others:
                ranks = sorted(set(others.values()))
                return Suspect(ranks, "unknown", "its pid is the one the agent did not SIGTERM (it had already died)",
                               "medium", [e for e in terms if e.host == host][:3], host=host)
    return None


_PID_KINDS = ("nccl_init", "start", "agent_failed", "elastic_failure")


#: errors a rank gets from inside the c10d store (it did arrive at the rendezvous)
_STORE_SIGNATURES = ("store-get-timeout", "store-clients-timeout", "dist-store-error", "dist-network-error")
_QUIET_KINDS = ("exit_signal", "slurm_task", "slurm_job", "agent_sigterm", "agent", "exit")


def _loud_ranks(events: Iterable[Event]) -> set[int]:
    """Ranks that reported an error of their own (not just being terminated by someone else)."""
    return {e.rank for e in events if e.rank is not None and e.role in ("culprit", "either", "victim")
            and e.kind not in _QUIET_KINDS and e.signature != "python-keyboard-interrupt"}


def odd_tails(sources: Sequence[SourceFile], summaries: Sequence[FileSummary]) -> set[int]:
    """Ranks whose own log ends differently from most ranks' logs (numbers masked): they stopped early."""
    rank_of = {s.display: s.rank for s in sources if s.rank is not None and s.kind == "log"}
    last: dict[int, str] = {}
    for summary in summaries:
        rank = rank_of.get(summary.file)
        if rank is None or not summary.tail:
            continue
        lines = [ln for ln in summary.tail if not ln.startswith(("ddpslurm:", "submitit "))] or summary.tail
        last[rank] = re.sub(r"\d+", "N", lines[-1])
    if len(last) < 3:
        return set()
    lines = {rank_of[s.file]: s.lines for s in summaries if rank_of.get(s.file) is not None}
    median = sorted(lines.values())[len(lines) // 2] if lines else 0
    short = {r for r, n in lines.items() if median >= 4 and n * 2 < median}  # far fewer lines than most ranks
    (common, n), *_ = Counter(last.values()).most_common(1)
    if n <= len(last) // 2:
        return short
    return {r for r, tail in last.items() if tail != common} | short


def _worker_pids(events: Iterable[Event]) -> dict[tuple[str | None, int], int]:
    out: dict[tuple[str | None, int], int] = {}
    for e in events:
        if e.pid is not None and e.rank is not None and e.kind in _PID_KINDS:
            out[(e.host, e.pid)] = e.rank
    return out


def _peer_of(e: Event, facts: Facts) -> int | str | None:
    if e.get("peer_rank", "").isdigit():
        return int(e.get("peer_rank"))
    for name in ("peer_host", "peer_host2", "peer_ip"):
        value = e.get(name)
        if value:
            value = value.strip("[]")
            host = facts.ip_host.get(value, value)
            if host == e.host:
                return None
            return host
    return None


def accusations(events: Iterable[Event], facts: Facts) -> Counter:
    """How many victim events point at each peer (a rank number or a host name)."""
    counts: Counter = Counter()
    for e in events:
        if e.role == "victim":
            peer = _peer_of(e, facts)
            if peer is not None:
                counts[peer] += 1
    return counts


def _silent(events: list[Event], facts: Facts) -> list[int]:
    """Ranks that started but never exited and reported nothing, while others failed."""
    speaking = {e.rank for e in events if e.role in ("culprit", "victim", "either") and e.rank is not None}
    return sorted(r for r in facts.started if r not in facts.exited and r not in speaking)


def _cause_for_rank(events: list[Event], rank: int | None, default: str) -> tuple[str, Event | None]:
    """The cause told by the rank's own strongest event (either/exit signal), else `default`."""
    own = [e for e in events if e.rank == rank and e.role in ("either", "culprit") and e.cause not in (None, "unknown")]
    if own:
        best = max(own, key=lambda e: e.priority)
        return best.cause or default, best
    return default, None


def diagnose(events: list[Event], sources: Sequence[SourceFile], summaries: Sequence[FileSummary],
             sigs: SignatureSet, facts_in: dict[str, Any] | None = None) -> Diagnosis:
    """Apply the rules to all events of one job (or one pasted log)."""
    events, facts = resolve(events, sources, summaries, facts_in or {})
    events = [_refine(e) for e in events]
    failures = [e for e in events if e.role in ("culprit", "victim", "either")]
    accused = accusations(events, facts)
    culprits = [e for e in failures if e.role == "culprit"]
    notes: list[str] = []
    chosen: Event | None = None
    cause, rank, host = "unknown", None, None
    confidence = "low"
    support: list[Event] = []
    by_time = inferred = False
    if culprits:
        chosen, by_time = _choose(culprits, facts, accused)
        cause, rank, host = chosen.cause or "user_code_exception", chosen.rank, chosen.host
        actors = {(e.rank, e.host) if e.rank is None else e.rank for e in culprits}
        confidence = "high" if by_time or len(actors) == 1 else "medium"
        if chosen.priority < 20 and len(actors) > 1 and not by_time:
            confidence = "medium"
    else:
        suspect = infer_from_victims(events, facts)
        eithers = [e for e in failures if e.role == "either"]
        if suspect is not None:
            rank = suspect.ranks[0] if suspect.ranks else None
            host = suspect.host if suspect.host and rank is None else (facts.rank_host.get(rank) if rank is not None
                                                                        else suspect.host)
            cause = suspect.cause
            own_cause, own = _cause_for_rank(events, rank, suspect.cause) if rank is not None else (cause, None)
            if suspect.cause == "unknown" or (own is not None and own.priority >= 20):
                cause = own_cause
                chosen = own
            if cause == "unknown":
                cause = _cause_of_silence(events, facts, rank)
            confidence = suspect.confidence
            support = suspect.evidence
            inferred = True
            notes.append(f"rank {rank if rank is not None else '?'} was singled out because {suspect.reason}")
        elif eithers:
            chosen, by_time = _choose(eithers, facts, accused)
            cause, rank, host = chosen.cause or "unknown", chosen.rank, chosen.host
            confidence = "medium" if by_time or len({e.rank for e in eithers}) == 1 else "low"
        else:
            silent = _silent(events, facts)
            stopped = sorted(r for r in facts.odd_tails if r not in _loud_ranks(events))
            if silent and failures:
                rank = silent[0]
                host = facts.rank_host.get(rank)
                cause = _cause_of_silence(events, facts, rank)
                notes.append(f"rank {rank} started but fell silent (no exit record, no error)")
            elif len(stopped) == 1 and failures:
                rank = stopped[0]
                host = facts.rank_host.get(rank)
                cause = _cause_of_silence(events, facts, rank)
                notes.append(f"rank {rank}'s log stops earlier than the other ranks' logs")
            victims = [e for e in failures if e.role == "victim"]
            if victims and cause == "unknown":
                cause = victims[0].cause or "unknown"
                if cause != "unknown":
                    confidence = "low"
    if rank is None and chosen is not None and chosen.cause not in JOB_LEVEL:
        rank, host = _complete(events, chosen, host, facts)
    hostless = ("oom_kill", "signal", "nccl_warn", "gpu")
    if rank is None and chosen is not None and chosen.kind in hostless and facts.srun_order and not facts.torchrun:
        rank = _rank_from_srun(events, facts, host)
        host = host or (facts.rank_host.get(rank) if rank is not None else None)
    if host is None and rank is not None:
        host = facts.rank_host.get(rank)
    if host is None and rank is None and chosen is not None and cause not in JOB_LEVEL:
        first = _first_srun_failure(events)
        if first is not None:
            host = first.get("host")
            tasks = expand_ranks(first.get("tasks", ""))
            rank = tasks[0] if tasks and not facts.torchrun and len(tasks) == 1 else None
    if cause in JOB_LEVEL:
        rank = None
        if chosen is not None and chosen.kind == "slurm_job" and cause != "node_failure":
            host = None
    elif chosen is not None and rank is not None and not inferred:
        named = _named_by_majority(events, chosen)
        if named is not None:  # most reports name the same rank as the odd one out: stronger than exit times
            rank, host = named, facts.rank_host.get(named)
        elif not by_time:
            rank, host = _systemic(events, chosen, rank, host, facts)
            stopped = sorted(r for r in facts.odd_tails if r not in _loud_ranks(events))
            if rank is None and len(stopped) == 1 and chosen.role == "either":
                rank, host = stopped[0], facts.rank_host.get(stopped[0])  # alike reports; one log stops early
                notes.append(f"rank {rank}'s log stops earlier than the other ranks' logs")
    if chosen is not None and chosen.kind in OBSERVER_KINDS and rank == chosen.rank and chosen.rank is not None:
        notes.append(f"rank {rank} detected the mismatch; its log does not name the rank that sent the odd data")
        rank, host = None, None
    return _build(events, summaries, sigs, facts, cause, rank, host, confidence, chosen, support, by_time, notes)


def _complete(events: list[Event], chosen: Event, host: str | None, facts: Facts) -> tuple[int | None, str | None]:
    """A culprit event without a rank (an OOM-kill notice) takes the rank of an event with the same cause."""
    same = [e for e in events if e.rank is not None and e.cause == chosen.cause and e.role in ("culprit", "either")
            and (host is None or e.host in (None, host))]
    if not same and host is not None:
        on_host = _ranks_of_host(facts, host)
        if len(on_host) == 1:
            return on_host[0], host
    if not same:
        vanished = sorted(facts.started - set(facts.exited))
        if len(vanished) == 1 and chosen.cause in ("host_oom", "segfault", "gpu_hardware", "node_failure"):
            return vanished[0], facts.rank_host.get(vanished[0])
        return None, host
    ranks = {e.rank for e in same}
    if len(ranks) > 1:
        return None, host
    first = same[0]
    return first.rank, host or first.host


#: signature kinds logged by the rank that DETECTED a fault in data a peer sent: it is not the offender
OBSERVER_KINDS = ("mismatch_detected",)
#: causes that concern the whole job, not one rank
JOB_LEVEL = ("slurm_time_limit", "preempted", "slurm_cancelled", "node_failure")


def _named_by_majority(events: list[Event], chosen: Event) -> int | None:
    """The rank that most reports of the chosen failure name as their peer (desync debug, version checks)."""
    alike = [e for e in events if e.rank is not None and e.signature == chosen.signature]
    named = Counter(int(e.get("peer_rank", "")) for e in alike if e.get("peer_rank", "").isdigit())
    if not named or len({e.rank for e in alike}) < 3:
        return None
    (odd, _votes), *_ = named.most_common(1)
    voters = {e.rank for e in alike if e.get("peer_rank") == str(odd)}
    return odd if len(voters) * 2 > len({e.rank for e in alike}) and chosen.cause != "nccl_version_mismatch" else None


def _systemic(events: list[Event], chosen: Event, rank: int, host: str | None,
              facts: Facts) -> tuple[int | None, str | None]:
    """Several ranks failed the same way with nothing to order them: no single first rank.

    The host stays when all of them are on one host (a node-local problem), else it is dropped too.
    """
    alike = [e for e in events if e.rank is not None and e.cause == chosen.cause
             and (e.role == "culprit" or e.signature == chosen.signature)]
    same = {e.rank for e in alike}
    same |= {r for e in alike if e.kind == "slurm_task" for r in expand_ranks(e.get("tasks", ""))}
    if len(same) <= 1:
        return rank, host
    named = Counter(int(e.get("peer_rank", "")) for e in alike if e.get("peer_rank", "").isdigit())
    versions = Counter(e.get("version") for e in alike if e.get("version"))
    if len(versions) > 1:  # the ranks report their own version: the minority's host is the odd one out
        minority = min(versions, key=lambda v: versions[v])
        odd_hosts = {e.host or facts.rank_host.get(e.rank) for e in alike if e.get("version") == minority}  # type: ignore[arg-type]
        if len(odd_hosts) == 1:
            return None, odd_hosts.pop()
    if named:
        (odd, votes), *_ = named.most_common(1)
        if votes * 2 > len(alike):  # most reports name the same rank as the odd one out
            return odd, facts.rank_host.get(odd)
    hosts = {facts.rank_host.get(r) for r in same}
    return None, (hosts.pop() if len(hosts) == 1 else None)


def _cause_of_silence(events: list[Event], facts: Facts, rank: int | None) -> str:
    """A rank that died without a word: SIGKILL by the OOM killer when Slurm says so, else a hang/timeout."""
    if any(e.kind == "oom_kill" for e in events):
        return "host_oom"
    if any(e.kind == "watchdog_timeout" for e in events):
        return "collective_timeout"
    killed = [e for e in events if e.signature in ("srun-task-killed", "process-killed")
              and rank in expand_ranks(e.get("tasks", "") or "")]
    if killed:
        return "host_oom"
    return "unknown"


def _first_srun_failure(events: list[Event]) -> Event | None:
    """The first task srun reported as failed on its own (not terminated by the step teardown)."""
    for e in events:
        if e.kind == "slurm_task" and e.get("status") not in ("Terminated",) and e.role != "victim":
            return e
    return None


def _rank_from_srun(events: list[Event], facts: Facts, host: str | None) -> int | None:
    tasks = [e for e in events if e.kind == "slurm_task" and (host is None or e.get("host") == host)]
    killed = [e for e in tasks if e.get("status") == "Killed"] or tasks
    for e in killed:
        ranks = expand_ranks(e.get("tasks", ""))
        if ranks:
            return ranks[0]
    return None


def _refine(e: Event) -> Event:
    """Agent and exit-code events: the cause follows the exit code / signal."""
    if e.kind not in ("agent_failed", "elastic_failure"):
        return e
    code = e.get("exitcode")
    signal = e.get("signal")
    if code and code.lstrip("-").isdigit() and int(code) < 0:
        signal = signal or SIGNAL_NAMES.get(-int(code), f"signal {-int(code)}")
    if signal:
        cause, role = SIGNAL_CAUSES.get(signal, ("unknown", "either"))
        if e.kind == "elastic_failure" and e.get("section") != "root":
            role = "victim" if role != "culprit" else "either"
        return replace(e, cause=cause, role=role)
    if e.kind == "elastic_failure" and e.get("section") != "root":
        return replace(e, role="either", priority=min(e.priority, 8))
    return e


def _fmt(template: str, values: dict[str, Any]) -> str:
    class _Safe(dict):
        def __missing__(self, key: str) -> str:
            return "?"

    try:
        return template.format_map(_Safe(values))
    except (ValueError, IndexError, AttributeError):
        return template


def _build(events: list[Event], summaries: Sequence[FileSummary], sigs: SignatureSet, facts: Facts, cause: str,
           rank: int | None, host: str | None, confidence: str, chosen: Event | None, support: list[Event],
           by_time: bool, notes: list[str]) -> Diagnosis:
    info = sigs.causes.get(cause)
    sig = sigs.by_id(chosen.signature) if chosen is not None and chosen.signature else None
    if sig is not None and sig.cause != cause:
        sig = None
    values: dict[str, Any] = dict(chosen.fields) if chosen is not None else {}
    values.update({"rank": rank if rank is not None else "?", "host": host or "?"})
    template = (sig.summary if sig and sig.summary else None) or (info.summary if info else cause.replace("_", " "))
    summary = _fmt(template, values)
    failures = [e for e in events if e.role in ("culprit", "victim", "either")]
    if failures and rank is not None:
        timed = any(e.time is not None for e in failures)
        if not timed:
            summary += " (No timestamps in the logs: ordered by causal evidence.)"
        elif not by_time and chosen is not None and chosen.role == "culprit":
            summary += " (Times were missing or not comparable for some ranks: ordered by signature strength.)"
    advice = [_fmt(a, values) for a in (list(sig.advice) if sig else [])]
    advice += [_fmt(a, values) for a in (info.advice if info else ()) if _fmt(a, values) not in advice]
    retry = (sig.retry if sig and sig.retry else None) or (info.retry if info else "unknown")
    exclude = sig.exclude_node if sig and sig.exclude_node is not None else (info.exclude_node if info else False)
    exclude_nodes = [host] if exclude and host else []
    evidence = _evidence(events, summaries, chosen, support, rank, cause)
    rows = _rank_rows(events, facts, rank, chosen)
    if exclude_nodes:
        advice.append(f"Resubmit avoiding the node: sbatch --exclude={','.join(exclude_nodes)} "
                      f"(or ddpslurm submit ... --exclude {','.join(exclude_nodes)}).")
    return Diagnosis(cause=cause, first_failing_rank=rank, first_failing_host=host, confidence=confidence,
                     summary=summary, advice=advice, evidence=evidence, ranks=rows, retry=retry,
                     exclude_nodes=exclude_nodes, notes=notes)


def _ev(e: Event) -> Evidence:
    return Evidence(file=e.file, line=e.line, rank=e.rank, time=format_time(e.time), text=e.text[:500])


def _evidence(events: list[Event], summaries: Sequence[FileSummary], chosen: Event | None, support: list[Event],
              rank: int | None, cause: str) -> list[Evidence]:
    picked: list[Event] = []
    if chosen is not None:
        picked.append(chosen)
    if rank is not None:
        picked += [e for e in events if e.rank == rank and e.role in ("culprit", "either") and e is not chosen][:2]
    picked += support
    kinds: set[str] = set()
    for e in events:
        if e.role == "victim" and e.kind not in kinds and len(picked) < MAX_EVIDENCE:
            kinds.add(e.kind)
            picked.append(e)
    for e in events:
        if e.kind == "slurm_job" and e not in picked and len(picked) < MAX_EVIDENCE:
            picked.append(e)
    seen: set[tuple[str, int]] = set()
    out: list[Evidence] = []
    for e in picked:
        if (e.file, e.line) in seen:
            continue
        seen.add((e.file, e.line))
        out.append(_ev(e))
    if not out:
        for s in summaries:
            for i, line in enumerate(s.tail):
                out.append(Evidence(file=s.file, line=max(1, s.lines - len(s.tail) + 1 + i), rank=None, time=None,
                                    text=line[:500]))
                if len(out) >= MAX_EVIDENCE:
                    return out
    return out[:MAX_EVIDENCE]


def _rank_rows(events: list[Event], facts: Facts, culprit: int | None, chosen: Event | None) -> list[RankRow]:
    first: dict[int, Event] = {}
    if chosen is not None and culprit is not None and chosen.rank == culprit:
        first[culprit] = chosen
    for e in sorted((e for e in events if e.rank is not None and e.role in ("culprit", "victim", "either")),
                    key=lambda e: (e.time is None, e.time or 0.0, e.file, e.line)):
        first.setdefault(e.rank, e)  # type: ignore[arg-type]
    ranks = set(facts.present) | set(first) | set(facts.started)
    if facts.world_size and facts.world_size <= 100_000:
        ranks |= set(range(facts.world_size))
    if culprit is not None:
        ranks.add(culprit)
    rows: list[RankRow] = []
    for r in sorted(ranks):
        exit_event = facts.exited.get(r)
        if r == culprit:
            role = "culprit"
        elif r in first:
            role = "victim"
        elif exit_event is not None and exit_event.get("status") == "ok":
            role = "ok"
        else:
            role = "unknown"
        err = first.get(r)
        text = err.text[:300] if err else None
        rows.append(RankRow(rank=r, host=facts.rank_host.get(r), role=role, first_error=text))
    return rows
