"""Producers that compare the ranks' collectives: watchdog timeouts, sequence numbers, stacks, flight recorder, desync.

In: a job's timeline: the ranks' watchdog reports (process group, work number, last enqueued and completed work,
the collective and its size), the hang monitor's stack dumps, the flight recorder's last collectives, torch's
mismatch and desync reports. Out: votes for the ranks the others waited for (absent from the timeouts, behind in
completed or enqueued work, stuck outside any collective, lowest in the flight recorder, named as lagging) as a
collective_timeout, and for the job or its odd rank when ranks called different collectives (collective_mismatch).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ddpslurm.analyze.diagnose.knowledge import weight
from ddpslurm.analyze.diagnose.resolve import expand_ranks
from ddpslurm.analyze.diagnose.timeline import JobTimeline, RankTimeline
from ddpslurm.analyze.diagnose.votes import DEATH_REPORT_KINDS, Vote, bounded_world, loud, rank_list, small_int
from ddpslurm.analyze.model import Event


def timeout_reporters(tl: JobTimeline) -> list[Vote]:
    """Watchdog timeouts: the ranks absent from the reporters, the one whose last completed work is lowest, and
    those that never issued the collective the others timed out in."""
    reports = [e for rt in tl.ranks.values() for e in rt.failures if e.kind == "watchdog_timeout"]
    if not reports:
        return []
    groups = _groups(reports)
    votes = _lowest_completed(groups, tl) + _never_issued(reports, tl) + _mismatched_collectives(groups, tl)
    reporters = {e.rank for e in reports}
    world = bounded_world(tl)
    if world and len(reporters) < world:
        missing = [r for r in range(world) if r not in reporters]
        if len(reporters) == 1 and not (tl.facts.launched_world or tl.facts.said_world):
            # one rank's timeout and a world known only from its own number: the ranks below it left no line, and a
            # paste of one rank's lines cannot tell one that stayed away from one whose log was not given
            missing = [r for r in missing if r in tl.ranks or r in tl.facts.present]
        absent = [r for r in missing if r not in tl.ranks or not loud(tl.ranks[r])] or missing
        if absent and len(absent) * 2 <= world:
            votes += [Vote("absent from timeouts", weight("absent from timeouts", "absent_shared") / len(absent),
                           f"rank {r} is absent from the {len(reporters)} "
                           "ranks whose watchdog timed out", rank=r, host=tl.facts.rank_host.get(r),
                           cause="collective_timeout", evidence=tuple(reports[:3])) for r in absent]
    return votes


#: what a watchdog line says of the work it timed out: equal on every rank, the ranks timed out alike
_WORK_FIELDS = ("guid", "pg", "seq", "op", "last_enqueued", "last_completed")


def timed_out_alike(tl: JobTimeline) -> list[Vote]:
    """Every rank of the job reported its watchdog timing out the same work (each rank's lines name the same process
    groups, work numbers, operations and last works) and none failed of its own: the job hung in that collective as
    a whole. A job-level finding, no rank: it outweighs the step's teardown line (`STEP ... CANCELLED`, what srun's
    --kill-on-bad-exit prints once the first rank exits), which says how the job ended, not why."""
    world = bounded_world(tl)
    if not world or world < 2 or len(tl.ranks) < world:
        return []
    for r in range(world):
        rt = tl.ranks.get(r)
        if rt is None or any(e.role in ("culprit", "either") and e.kind not in DEATH_REPORT_KINDS
                             for e in rt.own_failures):
            return []
    first = _works(tl.ranks[0])
    if not first or any(_works(tl.ranks[r]) != first for r in range(1, world)):
        return []
    reports = [e for e in tl.ranks[0].failures if e.kind == "watchdog_timeout"]
    return [Vote("timed out alike", weight("timed out alike"), f"all {world} ranks timed out in the same collective, "
                 "none failed of its own", cause="collective_timeout", evidence=tuple(reports[:2]))]


def _works(rt: RankTimeline) -> set[tuple[str | None, ...]]:
    """The works a rank's watchdog lines say it timed out (its signature's reading of `_WORK_FIELDS`)."""
    return {(e.signature, *(e.get(f) for f in _WORK_FIELDS)) for e in rt.failures if e.kind == "watchdog_timeout"}


def _lowest_completed(groups: dict[str | None, list[Event]], tl: JobTimeline) -> list[Vote]:
    """In each process group, the minority of ranks whose last completed work is lowest: the others waited for
    them. Work numbers count per group, so ranks are compared within the group their line names (`pg`); lines
    that name none (torch < 2.2) make one group only while no rank reports several works (`_groups`)."""
    votes: list[Vote] = []
    for group, lines in groups.items():
        done: dict[int, int] = {}
        for e in lines:
            if e.rank is None:
                continue
            value = e.get("last_completed")
            if value is None:
                seq = e.get("seq") or ""
                value = str(int(seq) - 1) if seq.isdigit() else None
            completed = _work(value)
            if completed is not None:
                done[e.rank] = min(done.get(e.rank, completed), completed)
        if len(set(done.values())) < 2:
            continue
        lowest = min(done.values())
        behind = sorted(r for r, v in done.items() if v == lowest)
        if len(behind) * 2 > len(done):
            continue
        where = f" in process group {group}" if group is not None else ""
        votes += [Vote("lowest completed", weight("lowest completed", "behind_shared") / len(behind),
                       f"its last completed collective ({lowest}){where} is "
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


def _mismatched_collectives(groups: dict[str | None, list[Event]], tl: JobTimeline) -> list[Vote]:
    """Ranks of one process group that timed out in the same work number but name different collectives in it
    (`OpType`), or the same collective of a fixed size with different element counts (`NumelIn`): they issued
    different calls, each waiting for peers that never joined it (a desync: a branch, an uneven batch, a module
    run on some ranks only). A job-level collective_mismatch; the one rank that differs from all the others (at
    least two that agree) is named."""
    votes: list[Vote] = []
    for group, lines in groups.items():
        by_work: dict[str, dict[int, Event]] = defaultdict(dict)
        for e in lines:
            seq = e.get("seq")
            if e.rank is not None and e.get("op") and _work(seq) is not None:
                by_work[seq].setdefault(e.rank, e)  # type: ignore[index]
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
    told = "; ".join(f"{_call_text(call)} on rank{'s' if len(ranks) > 1 else ''} {rank_list(ranks)}"
                     for call, ranks in kinds)
    evidence = tuple(first[ranks[0]] for _call, ranks in kinds)[:4]
    votes = [Vote("mismatched collectives", weight("mismatched collectives"),
                  f"the ranks timed out in {where} in different collectives: {told}",
                  cause="collective_mismatch", evidence=evidence)]
    odd = kinds[0][1]
    if len(kinds) == 2 and len(odd) == 1 and len(kinds[1][1]) >= 2:
        r = odd[0]
        votes.append(Vote("odd collective", weight("odd collective", "in_timeouts"),
                          f"in {where} it waited in {_call_text(kinds[0][0])} while "
                          f"{len(kinds[1][1])} other ranks waited in {_call_text(kinds[1][0])}", rank=r,
                          host=tl.facts.rank_host.get(r), cause="collective_mismatch",
                          evidence=(first[r], first[kinds[1][1][0]])))
    return votes


def _call_text(call: tuple[str, str | None]) -> str:
    return call[0] + (f" of {call[1]} elements" if call[1] is not None else "")


def _never_issued(reports: list[Event], tl: JobTimeline) -> list[Vote]:
    """In a process group whose ranks timed out in work S, a rank whose last enqueued work is below S never issued
    that collective: the others waited for it (ProcessGroupNCCL's watchdog and heartbeat monitor lines name the
    group and its last enqueued work; a rank the flight recorder's dump signal reached says it too). Only a
    minority can be behind: most behind is a mismatch of what the ranks issued, not one rank that is late."""
    waited: dict[str, int] = {}  # process group -> the lowest work a watchdog timed out in
    enqueued: dict[str, dict[int, int]] = defaultdict(dict)  # process group -> rank -> its last enqueued work
    told: dict[tuple[str, int], Event] = {}
    for e in (f for rt in tl.ranks.values() for f in rt.failures if f.kind in ENQUEUE_KINDS):
        group = e.get("pg")
        if group is None or e.rank is None:
            continue
        last = _work(e.get("last_enqueued"))
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
        votes += [Vote("never issued", weight("never issued", "behind_shared") / len(behind),
                       f"its last enqueued collective in process group {group} is "
                       f"#{lasts[r]}, before #{work}, the one {len(lasts) - len(behind)} other rank(s) waited in",
                       rank=r, host=tl.facts.rank_host.get(r), cause="collective_timeout",
                       evidence=(told[(group, r)], *waiting)) for r in behind]
    return votes


#: kinds whose lines tell a rank's last enqueued work in a process group (`last_enqueued`, `pg`)
ENQUEUE_KINDS = ("watchdog_timeout", "dump_signal")


def _work(value: str | None) -> int | None:
    """A work sequence number (-1: none yet), or None."""
    return int(value) if value is not None and value.lstrip("-").isdigit() and len(value) < 19 else None


def hang_stacks(tl: JobTimeline) -> list[Vote]:
    """The hang monitor's stack dumps (analyze/stacks.py): ranks whose main thread is outside any collective while
    others wait in one are the stuck ones (collective_timeout); with every rank in a collective but not the same
    one, the minority's ranks (collective_mismatch), or no single rank on a tie; all in one collective, no single
    rank (collective_timeout). A dumped stack shows the rank's state at the hang itself, not an inference from its
    peers' words: weighed like a rank's own decisive failure, above srun's first death (under a hang every rank
    exits 124 at once, so srun's order says nothing) and the pointers of victims."""
    stacks = {e.rank: e for e in tl.events if e.kind == "stack" and e.rank is not None}
    if len(stacks) < 2:
        return []
    outside = sorted(r for r, e in stacks.items() if e.get("in_collective") == "no")  # type: ignore[type-var]
    if outside and len(outside) < len(stacks):
        return [Vote("hang stacks", weight("hang stacks", "outside_shared") / len(outside),
                     f"its stack is outside any collective "
                     f"({stacks[r].get('stuck_frame')}) while {len(stacks) - len(outside)} other rank(s) wait in one",
                     rank=r, host=stacks[r].host or tl.facts.rank_host.get(r), cause="collective_timeout",
                     evidence=(stacks[r],), own=True) for r in outside]
    counts = Counter(e.get("collective") for e in stacks.values() if e.get("in_collective") == "yes")
    if outside:
        return []
    if len(counts) == 1:
        return [Vote("hang stacks", weight("hang stacks", "all_alike"),
                     f"every rank dumped waits in {next(iter(counts))}: a "
                     "collective that never completes, no rank outside it", cause="collective_timeout",
                     evidence=tuple(list(stacks.values())[:2]))]
    (_, most), (_, second) = counts.most_common(2)
    if most == second:
        return [Vote("hang stacks", weight("hang stacks", "mismatch"), "the ranks wait in different collectives: "
                     + ", ".join(sorted(str(c) for c in counts)), cause="collective_mismatch",
                     evidence=tuple(list(stacks.values())[:3]))]
    minority = sorted(r for r, e in stacks.items() if counts[e.get("collective")] < most)  # type: ignore[type-var]
    return [Vote("hang stacks", weight("hang stacks", "minority_shared") / len(minority),
                 f"it waits in {stacks[r].get('collective')} "
                 f"while most ranks wait in {counts.most_common(1)[0][0]}", rank=r, host=stacks[r].host,
                 cause="collective_mismatch", evidence=(stacks[r],), own=True) for r in minority]


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
            votes += [Vote("flight recorder", weight("flight recorder", "behind_shared") / len(behind),
                           f"its last collective in process group "
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
            votes.append(Vote("flight recorder", weight("flight recorder", "mismatch"),
                              f"at collective #{top} of process group {group} "
                              f"the ranks issued different collectives: {shown}", cause="collective_mismatch",
                              evidence=tuple(list(ranks.values())[:3])))
            continue
        minority = sorted(r for r, kind in issued.items() if kinds[kind] < most)
        votes += [Vote("flight recorder", weight("flight recorder", "minority_shared") / len(minority),
                       f"at collective #{top} of process group "
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
        reporter = e.rank if e.rank is not None else small_int(e.get("reporter"))
        other = small_int(e.get("named_rank"))
        if reporter is not None and other is not None and other != reporter:
            named.setdefault(reporter, (other, e))
    if not named:
        return []
    counts = Counter(other for other, _e in named.values()).most_common()
    votes = [Vote("mismatch reports", weight("mismatch reports"),
                  f"{len(named)} rank(s) found a collective that differs from another "
                  "rank's", cause="collective_mismatch", evidence=tuple(e for _o, e in named.values())[:3])]
    top, n = counts[0]
    if n >= 2 and (len(counts) == 1 or n > counts[1][1]):
        votes.append(Vote("odd collective", weight("odd collective", "in_reports"),
                          f"named as running a different collective by {n} of the "
                          f"{len(named)} ranks that report the mismatch", rank=top, host=tl.facts.rank_host.get(top),
                          cause="collective_mismatch", evidence=tuple(e for o, e in named.values() if o == top)[:3]))
    return votes



def desync_verdicts(tl: JobTimeline) -> list[Vote]:
    """ProcessGroupNCCL's desync report (`desync_verdict`): the ranks torch found at the lowest collective, or never
    in one, held the others up. Every reporter reads the same store, so their lists are joined. The ranks it lists
    share the blame; a list of the whole world (every rank stuck in one collective) names nobody."""
    told = [f for f in tl.failure_lines() if f.kind == "desync_verdict"]
    named = sorted({r for e in told for r in expand_ranks(e.get("ranks") or "")})
    if not named:
        return []
    world = max(bounded_world(tl) or 0, named[-1] + 1)
    if len(named) >= world:
        return [Vote("desync report", weight("desync report", "every_rank"),
                     f"torch's desync report lists every rank ({world}) at one collective: "
                     "they all waited in it", cause="collective_timeout", evidence=tuple(told[:2]))]
    why = f"torch's desync report lists rank(s) {rank_list(named)} as the lagging ones that held the others up"
    return [Vote("desync report", weight("desync report", "named_shared") / len(named),
                 why, rank=r, host=tl.facts.rank_host.get(r),
                 cause="collective_timeout", evidence=tuple(told[:3])) for r in named]
