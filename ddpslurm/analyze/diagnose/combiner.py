"""One combiner: the producers' votes -> who failed first, of what, and how sure.

1. Slurm ending the job (time limit, preemption, scancel, node failure) is the verdict unless a rank's own
   failure comes before it in comparable time.
2. Ranks whose own failure is decisive (their own error, srun's first dead task, a rank that vanished) are
   ordered by time where their clocks compare (stronger evidence wins within `time_tolerance`), else by the
   weight of all votes for them. Several ranks failing alike at once is *systemic*: no single rank. A rank whose
   own failure is a lost peer is that peer's victim when a rank on the peer's node died on its own; a broken
   transfer reported after the others timed out waiting is their abort (the rank is the one they waited for).
3. Without a decisive own failure, the rank with the most vote weight, if it stands out (`margin`) from the
   next; a tie is "no single rank", never a guess.
4. Confidence comes from how the answer was reached and the margin.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from ddpslurm.analyze.diagnose.clocks import Offset, clock_note, host_offsets
from ddpslurm.analyze.diagnose.knowledge import group, threshold, weight
from ddpslurm.analyze.diagnose.peers import peer_host
from ddpslurm.analyze.diagnose.producers import Vote, all_votes
from ddpslurm.analyze.diagnose.resolve import is_host_name
from ddpslurm.analyze.diagnose.timeline import JobTimeline
from ddpslurm.analyze.model import CAUSES, Event
from ddpslurm.analyze.parse.timestamps import comparable

#: Thresholds and cause groups are analyzer/combiner.toml's (knowledge.py): `threshold("margin")`,
#: `group("waiting")`. A vote's producer is known by what it is (`vote.info`: ends_job, node_report, ...).


@dataclass
class Candidate:
    """All votes for one rank (or one host when no rank is known)."""

    rank: int | None
    host: str | None
    votes: list[Vote] = field(default_factory=list)

    @property
    def weight(self) -> float:
        return sum(v.weight for v in self.votes)

    @property
    def own_weight(self) -> float:
        return sum(v.weight for v in self.votes if v.own)

    @property
    def pointer_weight(self) -> float:
        """What the others say about it (named, absent, behind), as opposed to what it said itself."""
        return self.weight - self.own_weight

    @property
    def own_time(self) -> tuple[float, str | None] | None:
        timed = [(v.time, v.time_family) for v in self.votes if v.own and v.time is not None]
        return min(timed, key=lambda t: t[0]) if timed else None  # type: ignore[arg-type, return-value]

    @property
    def cause(self) -> str | None:
        """The cause of its own decisive vote; else what the others conclude about it beyond "it was late";
        else its own weaker error; else whatever names a cause."""
        strong, waiting = threshold("strong_own"), group("waiting")
        pools = ([v for v in self.votes if v.own and v.weight >= strong],
                 [v for v in self.votes if not v.own and v.cause not in waiting],
                 [v for v in self.votes if v.own], self.votes)
        for pool in pools:
            named = [v for v in pool if v.cause not in (None, "unknown")]
            if named:
                return max(named, key=lambda v: v.weight).cause
        return None


@dataclass
class Verdict:
    """The combiner's answer, with how it was reached."""

    cause: str
    rank: int | None
    host: str | None
    confidence: str
    decided_by: str  # job | time | weight | only | systemic | tie | none | lost peer
    reasons: list[str]
    chosen: Event | None
    support: list[Event]
    votes: list[Vote]
    notes: list[str] = field(default_factory=list)  # what the report should say of how it was read (clocks)


def combine(tl: JobTimeline, node_causes: frozenset[str] = frozenset()) -> Verdict:
    """Weigh every producer's votes for the job in `tl`; `node_causes` live on a node (causes.toml
    `node_level`): when no single rank failed of one, the node the evidence singles out is still named."""
    offsets = host_offsets(tl.events, tl.world_size, threshold("time_tolerance"))
    votes = final_votes(on_one_clock(all_votes(tl), offsets, tl), tl)
    verdict = _combine(tl, votes)
    verdict.notes += [note] if (note := clock_note(offsets)) else []
    worker = local_only(verdict)
    verdict.notes += [local_rank_note(worker)] if worker is not None else []
    if verdict.rank is None and verdict.decided_by == "none":
        _name_the_sole_rank(verdict, tl)
    if verdict.rank is None and verdict.cause not in node_causes:
        if verdict.cause == "unknown" and _named_lost_peer(verdict):
            verdict.decided_by = "lost peer"  # where to look, not a cause: the node stays out of exclude_nodes
        elif not (worker is not None and _same_host(worker.host, verdict.host)):
            verdict.host = None  # no rank, and a cause that is not a node's: no node to name either (but the host
            # of one worker the logs name by its local rank only: what is known of it)
    if verdict.host is not None and not is_host_name(verdict.host):
        verdict.host = None  # an address or a container id no record maps to a node
    return verdict


def local_only(verdict: Verdict) -> Event | None:
    """The one worker the verdict's evidence names by its local rank only (a launcher's `local_rank: L`), where the
    world size the logs state does not show one node (resolve.shows_one_node), so its global rank is not known."""
    told = (verdict.chosen, *verdict.support, *(e for v in verdict.votes if v.rank is None for e in v.evidence))
    named = {(e.host, e.local_rank): e for e in told if e is not None and e.rank is None and e.local_rank is not None
             and e.role in ("culprit", "either")}
    return next(iter(named.values())) if verdict.rank is None and len(named) == 1 else None


def local_rank_note(e: Event) -> str:
    """The report's note on a worker known by its host and local rank only."""
    where = f"on host {e.host}" if e.host else "on a host the logs do not name"
    return (f"the failure is local rank {e.local_rank} {where}" + (f" (pid {e.pid})" if e.pid is not None else "") +
            "; the logs state no world size that fits one node, so its global rank is not known")


def on_one_clock(votes: list[Vote], offsets: dict[str, Offset], tl: JobTimeline) -> list[Vote]:
    """The votes of ranks on a host whose clock is off (clocks.py), their times moved onto the other hosts' clock;
    only to order them (the evidence keeps its times)."""
    if not offsets:
        return votes
    short = {h.split(".")[0]: o for h, o in offsets.items()}
    out = []
    for v in votes:
        host = v.host or (tl.facts.rank_host.get(v.rank) if v.rank is not None else None)
        o = short.get(host.split(".")[0]) if host and v.rank is not None and v.time is not None else None
        out.append(replace(v, time=v.time - o.seconds) if o is not None and v.time_family == o.family else v)
    return out


def _name_the_sole_rank(verdict: Verdict, tl: JobTimeline) -> None:
    """A job of one rank (its start record or NCCL's communicator says so; one rank's log alone does not) whose rank
    failed of no cause of its own, only waiting: a collective of a one-rank group waits on nothing but that rank's
    own work (a kernel that never ends, a stalled stream), so that rank is the one that failed."""
    if not one_rank_job(tl) or len(tl.ranks) != 1:
        return
    only = next(iter(tl.ranks.values()))
    if not only.failures:
        return
    verdict.rank, verdict.host = only.rank, only.host or tl.facts.rank_host.get(only.rank)
    verdict.decided_by = "only"
    verdict.reasons = ["the job had one rank: what it waited for was its own work"]


def one_rank_job(tl: JobTimeline) -> bool:
    """The logs say the job had one rank (a start record, NCCL's communicator size), not merely one rank's log."""
    return (tl.facts.launched_world or tl.facts.said_world) == 1


def _named_lost_peer(verdict: Verdict) -> bool:
    """The verdict's node is the one the victims named as the peer they lost, and nothing says why it went away."""
    return verdict.host is not None and any(v.info.names_lost_peer and v.rank is None and v.host == verdict.host
                                            for v in verdict.votes)


def _combine(tl: JobTimeline, votes: list[Vote]) -> Verdict:
    candidates = _candidates(votes, tl)
    job = _job_verdict(votes, candidates, tl)
    if job is not None:
        return job
    strong = [c for c in candidates if c.own_weight >= threshold("strong_own")]
    if strong:
        return _among_strong(strong, candidates, votes, tl)
    return _by_weight(candidates, votes, tl)


def final_votes(votes: list[Vote], tl: JobTimeline) -> list[Vote]:
    """Drop a Slurm end of an attempt (preemption, time limit, node failure) after which the job ran again, and a
    time limit or cancel that ended ranks waiting in a communicator's setup (NCCL's init, its unique id) for a rank
    that never came (the vote naming that rank says why they waited)."""
    again, requeue, wait_ends = group("ran_again"), group("requeue_marks"), group("wait_ends")
    ran_again = any(v.cause in again for v in votes)  # a later attempt met the old state
    waited = any(v.info.names_awaited for v in votes)
    return [v for v in votes if not (v.info.ends_job and (
        (v.cause in requeue and (ran_again or tl.went_on_after(v.evidence[0])))
        or (waited and v.cause in wait_ends)))]


def _candidates(votes: list[Vote], tl: JobTimeline) -> list[Candidate]:
    by_rank: dict[int, Candidate] = {}
    by_host: dict[str, Candidate] = {}
    for v in votes:
        if v.rank is not None:
            by_rank.setdefault(v.rank, Candidate(v.rank, v.host or tl.facts.rank_host.get(v.rank))).votes.append(v)
    strong = threshold("strong_own")
    on_host_index: dict[str, list[Candidate]] = defaultdict(list)
    for c in by_rank.values():
        if c.host:
            on_host_index[c.host.split(".")[0]].append(c)
    for v in votes:
        if v.rank is not None or v.host is None or v.info.ends_job:
            continue
        # a node's report joins a rank of that node that failed decisively itself; weak ranks do not absorb it
        on_host = [c for c in on_host_index.get(v.host.split(".")[0], []) if c.own_weight >= strong]
        ranks = tl.facts.ranks_of_host(v.host)
        if on_host:
            for c in on_host:
                c.votes.append(v)
        elif len(ranks) == 1:
            if ranks[0] not in by_rank:
                by_rank[ranks[0]] = Candidate(ranks[0], v.host)
                on_host_index[v.host.split(".")[0]].append(by_rank[ranks[0]])
            by_rank[ranks[0]].votes.append(v)
        else:
            by_host.setdefault(v.host, Candidate(None, v.host)).votes.append(v)
    return list(by_rank.values()) + list(by_host.values())


def _same_host(a: str | None, b: str | None) -> bool:
    return bool(a and b) and (a == b or a.split(".")[0] == b.split(".")[0])  # type: ignore[union-attr]


def _job_verdict(votes: list[Vote], candidates: list[Candidate], tl: JobTimeline) -> Verdict | None:
    """Slurm's own end of the job, unless a rank's decisive failure came before it in comparable time."""
    slurm = [v for v in votes if v.info.ends_job and v.weight >= threshold("job_decisive")]
    if not slurm:
        return None
    top = max(slurm, key=lambda v: (v.weight, -(v.time or 0.0)))
    strong, tolerance = threshold("strong_own"), threshold("time_tolerance")
    for c in candidates:
        t = c.own_time
        if c.own_weight >= strong and t and top.time is not None and comparable(t[1], top.time_family) \
                and t[0] < top.time - tolerance:
            return None
    # (only a node failure's Slurm line names a host: own_reports.job_events)
    return Verdict(cause=top.cause or "unknown", rank=None, host=top.host, confidence="high", decided_by="job",
                   reasons=[top.why], chosen=top.evidence[0], support=[], votes=votes)


def _among_strong(strong: list[Candidate], candidates: list[Candidate], votes: list[Vote],
                  tl: JobTimeline) -> Verdict:
    strong = _less_lost_peers(strong, tl)
    systemic = _systemic(strong, tl)
    if systemic is not None:
        pointed = _stands_out(systemic, key=lambda c: c.pointer_weight)
        if pointed is not None:  # all failed alike, but the others name one of them (a desync report)
            return _verdict(pointed, votes, tl, "weight", "medium")
        return _no_single_rank(systemic, votes, tl, "systemic",
                               f"{len(systemic)} ranks failed the same way at about the same time")
    timed = _earliest(strong)
    if timed is not None:
        winner, near = timed
        tied = _tied_by_priority(winner, [c for c in near if c is not winner])
        if tied:
            return _no_single_rank(tied, votes, tl, "tie", _tie_reason(
                tied, f"{len(tied)} ranks failed within the clocks' 1 s resolution"))
        return _verdict(winner, votes, tl, "time", "high" if len(near) == 1 or len(strong) == 1 else "medium")
    ranked = sorted(strong, key=lambda c: (-c.weight, _tiebreak(c)))
    if len(ranked) == 1:
        return _verdict(ranked[0], votes, tl, "only",
                        "high" if ranked[0].own_weight >= threshold("only_high") else "medium")
    first, second = ranked[0], ranked[1]
    if first.weight < second.weight * threshold("margin") and first.cause == second.cause:
        return _no_single_rank(ranked[:2], votes, tl, "tie", "several ranks failed alike and nothing orders them")
    tied = _tied_by_priority(first, [c for c in ranked[1:] if c.cause != first.cause])
    if tied:
        return _no_single_rank(tied, votes, tl, "tie", _tie_reason(
            tied, f"{len(tied)} ranks reported their own failures, of different causes, and nothing orders them"))
    return _verdict(first, votes, tl, "weight", "medium")


def _less_lost_peers(strong: list[Candidate], tl: JobTimeline) -> list[Candidate]:
    """The decisive candidates less those whose own failure is the loss of a peer on a node where another decisive
    candidate failed on its own, of a cause no lost peer produces (a segfault, an OOM, an exception): the peer's
    death explains their reports. That candidate gets a vote for each (its reason names them). Not when the
    report came first in comparable time, nor when the dead candidate's own failure names a peer too."""
    lost_peer = group("lost_peer")
    dead = [d for d in strong if d.host and d.cause not in (*lost_peer, None, "unknown")
            and not _own_peers(d, tl)]
    if not dead:
        return strong
    kept, lost = [], defaultdict(list)
    for c in strong:
        peers = _own_peers(c, tl) if c.cause in lost_peer else set()
        peer = next(iter(peers)) if len(peers) == 1 else None
        killers = [d for d in dead if peer is not None and _same_host(d.host, peer) and not _came_first(c, d)]
        if not killers:
            kept.append(c)
            continue
        for d in killers:
            lost[id(d)].append(c)
    for d in dead:
        reporters = lost.get(id(d), [])
        if reporters:
            names = ", ".join(str(c.rank) if c.rank is not None else str(c.host) for c in reporters[:5])
            d.votes.append(Vote("lost peer", weight("lost peer", "base") + weight("lost peer", "per_reporter")
                                * len(reporters),
                                f"rank(s) {names}{' and more' if len(reporters) > 5 else ''} on other nodes lost "
                                f"their transfers to its node, {d.host}, after it failed",
                                rank=d.rank, host=d.host, cause=d.cause,
                                evidence=tuple(e for c in reporters[:3] for v in c.votes if v.own
                                               for e in v.evidence[:1])))
    return kept


def _own_peers(c: Candidate, tl: JobTimeline) -> set[str]:
    """The hosts of the peers the candidate's own failure lines name."""
    return {p for v in c.votes if v.own for e in v.evidence if (p := peer_host(e, tl))}


def _came_first(a: Candidate, b: Candidate) -> bool:
    """`a`'s own failure came before `b`'s by more than the time tolerance, in comparable time."""
    ta, tb = a.own_time, b.own_time
    return ta is not None and tb is not None and comparable(ta[1], tb[1]) and \
        ta[0] < tb[0] - threshold("time_tolerance")


def _stands_out(candidates: list[Candidate], key: Callable[[Candidate], float]) -> Candidate | None:
    """The candidate whose `key` weight is at least `min_weight` and `margin` times the next one's, else None."""
    ranked = sorted(candidates, key=lambda c: -key(c))
    if not ranked or key(ranked[0]) < threshold("min_weight"):
        return None
    if len(ranked) > 1 and key(ranked[0]) < key(ranked[1]) * threshold("margin"):
        return None
    return ranked[0]


def _tiebreak(c: Candidate) -> tuple:
    return (c.rank if c.rank is not None else 1 << 40, c.host or "")


def _tied_by_priority(first: Candidate, others: list[Candidate]) -> list[Candidate]:
    """`first` and those of `others` (candidates nothing orders against it in time: no comparable times, or within
    the clocks' tolerance) that it leads only by its own line's signature priority, or by nothing but the order the
    logs came in: each reported its own failure, and without those lines' weights `first` does not stand out from
    it (by srun's order, the others' pointers, its stack). Empty when it leads them all by such evidence."""
    if not _reported_itself(first):
        return []
    lead = _evidence_weight(first)
    tied = [c for c in others if _reported_itself(c) and not (
        lead >= threshold("min_weight") and lead >= _evidence_weight(c) * threshold("margin"))]
    return [first, *tied] if tied else []


def _tie_reason(tied: list[Candidate], default: str) -> str:
    """Why no single rank: the `tie` of a producer every tied candidate has votes of (a launcher's pick), else
    `default`."""
    common = set.intersection(*({v.info.tie for v in c.votes if v.info.tie} for c in tied)) if tied else set()
    return next(iter(common)).format(n=len(tied)) if len(common) == 1 else default


def _evidence_weight(c: Candidate) -> float:
    """Its weight less that of its own lines' signature priorities (`by_priority` producers): what orders it."""
    return sum(v.weight for v in c.votes if not v.info.by_priority)


def _reported_itself(c: Candidate) -> bool:
    return any(v.info.by_priority for v in c.votes)


def _earliest(strong: list[Candidate]) -> tuple[Candidate, list[Candidate]] | None:
    """The candidate whose own failure came first, when every one has a comparable time; and those within the
    clocks' tolerance of the first (itself included)."""
    times = [c.own_time for c in strong]
    if any(t is None for t in times) or not all(comparable(times[0][1], t[1]) for t in times):  # type: ignore[index]
        return None
    ordered = sorted(zip(strong, times, strict=True), key=lambda pair: pair[1][0])  # type: ignore[index]
    first_time = ordered[0][1][0]  # type: ignore[index]
    near = [c for c, t in ordered if t[0] - first_time <= threshold("time_tolerance")]  # type: ignore[index]
    best = max(near, key=lambda c: (c.own_weight, -c.own_time[0]))  # type: ignore[index]
    return best, near


def _systemic(strong: list[Candidate], tl: JobTimeline) -> list[Candidate] | None:
    """Most decisive candidates (`systemic_share`) failed of one cause, together (no time, or within
    `systemic_window`)."""
    if len(strong) < 2:
        return None
    causes = Counter(c.cause for c in strong)
    cause, n = causes.most_common(1)[0]
    alike = [c for c in strong if c.cause == cause]
    if n < 2 or n < len(strong) * threshold("systemic_share"):
        return None
    times = sorted(t[0] for c in alike if (t := c.own_time) is not None)
    if len(times) == len(alike) and times[1] - times[0] > threshold("systemic_window"):
        return None
    if len(times) not in (0, len(alike)):
        return None
    return alike


def _by_weight(candidates: list[Candidate], votes: list[Vote], tl: JobTimeline) -> Verdict:
    job_causes = [v for v in votes if v.rank is None and (v.host is None or v.info.ends_job)]
    ranked = sorted(candidates, key=lambda c: (-c.weight, _tiebreak(c)))
    best_job = max(job_causes, key=lambda v: v.weight, default=None)
    if best_job is not None and (not ranked or best_job.weight >= ranked[0].weight):
        how = "systemic" if best_job.info.every_rank else "job"
        return _no_single_rank([], votes, tl, how, best_job.why, cause=best_job.cause, chosen=best_job.evidence[0])
    margin = threshold("margin")
    if not ranked or ranked[0].weight < threshold("min_weight"):
        return _no_single_rank(ranked[:0], votes, tl, "none", "no rank stands out in the logs")
    first = ranked[0]
    if len(ranked) > 1 and first.weight < ranked[1].weight * margin:
        tied = [c for c in ranked if c.weight * margin > first.weight]
        return _no_single_rank(tied, votes, tl, "tie", _tie_reason(tied, f"{len(tied)} ranks are equally suspect"))
    lead = first.weight / ranked[1].weight if len(ranked) > 1 and ranked[1].weight else float("inf")
    return _verdict(first, votes, tl, "weight", "medium" if lead >= threshold("weight_medium_margin") else "low")


def _verdict(c: Candidate, votes: list[Vote], tl: JobTimeline, how: str, confidence: str) -> Verdict:
    late = _lost_after_the_wait(c, tl)
    cause = _explained_by_node(c, votes) or (late.cause if late else c.cause) or cause_of_silence(c, tl)
    # the decisive line is the rank's own: an own failure's, or the line of its own a vote read (its last enqueued
    # or completed work), before srun's line about its task
    own = [v for v in c.votes if v.evidence and (v.own or v.evidence[0].rank == c.rank is not None)]
    chosen = max(own, key=lambda v: v.weight).evidence[0] if own else _first_evidence(c.votes)
    if late is not None:  # its own line is the consequence: the others' evidence shows the cause
        chosen = late.evidence[0] if late.evidence else chosen
        confidence = "medium" if confidence == "high" else confidence
    support = [e for v in sorted(c.votes, key=lambda v: -v.weight) for e in v.evidence if e is not chosen]
    reasons = _reasons(c.votes)
    if c.rank is None:
        return Verdict(cause, None, c.host, confidence, how, reasons, chosen, support[:4], votes)
    return Verdict(cause, c.rank, c.host or tl.facts.rank_host.get(c.rank), confidence, how, reasons, chosen,
                   support[:4], votes)


def _lost_after_the_wait(c: Candidate, tl: JobTimeline) -> Vote | None:
    """What the others say of a rank whose own failure is a broken transfer (or a DataLoader worker's death: the
    teardown reaching it) reported only after the other ranks had failed waiting for a collective (their watchdog
    timeouts): the peers it lost had aborted after waiting for it, so its report is the consequence and their
    pointer (it was absent from the timeouts, it was behind) is the cause. "After": in comparable time, else in
    srun's order of the tasks' ends. None when its failure is not of those causes, or came first, or nothing
    orders it."""
    waiting = group("waiting")
    if c.rank is None or c.cause not in group("teardown_consequence"):
        return None  # (a connect that failed is no lost peer: it never had one)
    pointer = [v for v in c.votes if not v.own and v.cause in waiting]
    failures = tl.rank(c.rank).failures
    if not pointer or any(e.cause in waiting for e in failures):
        return None
    waiters = {r: rt.failures for r, rt in tl.ranks.items()
               if r != c.rank and any(e.cause in waiting for e in rt.failures)}
    after = _after_in_time(failures, waiters)
    if after is None:
        after = _after_in_srun_order(c.rank, set(waiters), tl)
    return max(pointer, key=lambda v: v.weight) if after else None


def _after_in_time(mine: list[Event], waiters: dict[int, list[Event]]) -> bool | None:
    """Whether the first timed of `mine` came after the first waiting failure of the others, by the tolerance;
    None when either has no time or the clocks do not compare."""
    timed = [e for e in mine if e.time is not None]
    if not timed:
        return None
    first = min(timed, key=lambda e: e.time or 0.0)
    waiting = group("waiting")
    waited = [e.time for f in waiters.values() for e in f if e.cause in waiting and e.time is not None
              and comparable(e.time_family, first.time_family)]
    return None if not waited else min(waited) <= first.time - threshold("time_tolerance")  # type: ignore[operator]


def _after_in_srun_order(rank: int, waiters: set[int], tl: JobTimeline) -> bool | None:
    """Whether srun reported `rank`'s task ending after a task of a rank that had failed waiting; None when srun
    names no task of it, or its tasks are torchrun's nodes."""
    if tl.facts.torchrun:
        return None
    mine = [t.position for t in tl.tasks if rank in t.ranks]
    if not mine:
        return None
    return any(t.position < min(mine) and waiters.intersection(t.ranks) for t in tl.tasks)


def _explained_by_node(c: Candidate, votes: list[Vote]) -> str | None:
    """A stronger report from the rank's node (kernel, driver, Slurm) that names no rank explains its failure;
    so does any such report when the rank's own lines say only that it failed (an exit code)."""
    own_causes = [v.cause for v in c.votes if v.own and v.cause not in (None, "unknown")]
    own = max((v.weight for v in c.votes if v.own), default=0.0) if own_causes else 0.0
    scale = weight("host report", "scale")
    node = [v for v in votes if v.rank is None and v.info.node_report and v.cause not in (None, "unknown")
            and (v.host is None or _same_host(v.host, c.host)) and v.weight / scale > own]
    return max(node, key=lambda v: v.weight).cause if node else None


def _first_evidence(votes: Iterable[Vote]) -> Event | None:
    for v in sorted(votes, key=lambda v: -v.weight):
        if v.evidence:
            return v.evidence[0]
    return None


def _reasons(votes: list[Vote]) -> list[str]:
    seen: dict[str, float] = defaultdict(float)
    for v in votes:
        seen[v.why] += v.weight
    return [why for why, _w in sorted(seen.items(), key=lambda kv: -kv[1])][:3]


def _no_single_rank(alike: list[Candidate], votes: list[Vote], tl: JobTimeline, how: str, reason: str, *,
                    cause: str | None = None, chosen: Event | None = None) -> Verdict:
    """No single first rank: the cause they share, and their host when they all share one (or, failing that, when
    every vote of that cause that names a host names the same one: slurmstepd's host-less OOM line and srun's
    `host: tasks 1-3: Out Of Memory` tell one event)."""
    cause = cause or _shared_cause(alike) or victims_cause(tl)
    hosts = {c.host for c in alike}
    peer = None if len(hosts) == 1 else _common_peer(alike, tl)
    host = hosts.pop() if len(hosts) == 1 else peer or _standout_host(votes) or _host_of_cause(votes, cause)
    if peer is not None:
        reason += f"; each of them lost its transfers to one peer, {peer}"
    if chosen is None and alike:
        chosen = _first_evidence([v for c in alike for v in c.votes])
    confidence = "medium" if how in ("systemic", "job") else "low"
    return Verdict(cause or "unknown", None, host, confidence, how, [reason], chosen, [], votes)


def _shared_cause(alike: list[Candidate]) -> str | None:
    """The cause most of them failed of; between causes as common, the heavier, then the vocabulary's order: never
    the order the candidates came in (the order of the logs)."""
    causes = Counter(c.cause for c in alike if c.cause)
    heaviest = {cause: max(c.weight for c in alike if c.cause == cause) for cause in causes}
    order = {cause: i for i, cause in enumerate(CAUSES)}
    return max(causes, key=lambda c: (causes[c], heaviest[c], -order.get(c, len(order))), default=None)


def _common_peer(alike: list[Candidate], tl: JobTimeline) -> str | None:
    """The one node of the job that every candidate's own failure names as its peer, when they sit on several hosts
    and it is none of theirs: ranks on different nodes that all lost the same remote end (an InfiniBand completion
    error naming one peer address) point at that node, whichever of them noticed first. A host outside the job
    (every rank failing to reach a login node named as MASTER_ADDR) is not a failed node of it."""
    named: set[str] = set()
    for c in alike:
        peers = _own_peers(c, tl)
        if len(peers) != 1:
            return None
        named |= peers
    own = {c.host for c in alike}
    if len(named) != 1 or len(own) < 2 or None in own:
        return None
    peer = named.pop()
    job_hosts = set(tl.facts.rank_host.values())
    if any(_same_host(peer, h) for h in own) or not any(_same_host(peer, h) for h in job_hosts):
        return None
    return peer


def _host_of_cause(votes: list[Vote], cause: str | None) -> str | None:
    """The one host the votes of `cause` name, if they name exactly one and no rank failing of it is on a host the
    logs do not tell (that rank may be elsewhere)."""
    of_cause = [v for v in votes if cause and v.cause == cause]
    named = {v.host.split(".")[0] for v in of_cause if v.host}
    if len(named) != 1 or any(v.rank is not None and not v.host for v in of_cause):
        return None
    return next(v.host for v in of_cause if v.host)


def _standout_host(votes: list[Vote]) -> str | None:
    """The host that votes naming a host but no rank single out (an odd version, srun's first dead node)."""
    by_host: dict[str, Candidate] = {}
    for v in votes:
        if v.rank is None and v.host and not v.info.ends_job:
            by_host.setdefault(v.host, Candidate(None, v.host)).votes.append(v)
    best = _stands_out(list(by_host.values()), key=lambda c: c.weight)
    return best.host if best is not None else None


def cause_of_silence(c: Candidate, tl: JobTimeline) -> str:
    """A rank singled out without an error of its own: killed (OOM) when Slurm or the kernel says so, else
    what its victims report (a collective or rendezvous timeout)."""
    if any(e.kind == "oom_kill" for e in tl.events):
        return "host_oom"
    return victims_cause(tl) or "unknown"


def victims_cause(tl: JobTimeline) -> str | None:
    """The most common cause the victims report."""
    causes = Counter(e.cause for rt in tl.ranks.values() for e in rt.failures
                     if e.role == "victim" and e.cause not in (None, "unknown"))
    return causes.most_common(1)[0][0] if causes else None
