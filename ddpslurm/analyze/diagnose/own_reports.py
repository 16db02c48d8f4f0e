"""Producers of what a rank, a host or Slurm reports of its own failure or death.

In: a job's timeline (each rank's failures, srun's task lines, Slurm's job events, torchelastic agents' lines).
Out: votes for the rank that reported its own failure (an OOM, an exception, a segfault: 50-100 by its priority),
the host a line names without a rank, the task srun saw die first before the teardown (40), a rank that
vanished or whose log stops early, the worker an agent did not SIGTERM, and the job Slurm ended. A rank whose own
log says it died waiting for a peer (`died_as_victim`) weighs little.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ddpslurm.analyze.diagnose.knowledge import own_scale, threshold, weight
from ddpslurm.analyze.diagnose.resolve import is_host_name
from ddpslurm.analyze.diagnose.timeline import JobTimeline, RankTimeline
from ddpslurm.analyze.diagnose.votes import DEATH_REPORT_KINDS, QUIET_KINDS, Vote, accuses, loud
from ddpslurm.analyze.model import Event


def own_weight(e: Event) -> float:
    """A culprit-role line weighs 50-100 by its priority; an `either` line (could be a consequence) 10-35 (the scale
    is analyzer/combiner.toml's `[own_weight]`)."""
    priority = max(0, min(e.priority, 100))
    if e.role == "culprit":
        return own_scale("culprit_base") + priority * own_scale("culprit_per_priority")
    return own_scale("either_base") + priority * own_scale("either_per_priority")


def own_failures(tl: JobTimeline) -> list[Vote]:
    """A rank's own failure (OOM, exception, segfault, a signal, an error it did not recover from)."""
    votes = []
    spared: dict[int, list[int]] | None = None
    for rt in tl.ranks.values():
        own = [e for e in rt.own_failures if accuses(e) == "self"]
        if not own or (died_as_victim(rt) and all(e.kind in DEATH_REPORT_KINDS for e in own)):
            continue  # only the report of a death its own log explains as a victim's
        first = own[0]
        strongest = max(own, key=own_weight)  # max keeps the first of equals: the earliest
        cause = strongest.cause if strongest.cause not in (None, "unknown") else _first_known_cause(own)
        if all(e.kind in LAUNCHER_PICK_KINDS for e in own):
            spared = _spared_with(tl) if spared is None else spared
            among = spared.get(rt.rank, [])
            if len(among) > 1:  # the launcher's pick among workers already dead when it tore the rest down
                w = own_weight(strongest) / len(among)
                why = (f"the launcher on {rt.host or '?'} named rank {rt.rank} first of the {len(among)} workers that "
                       "had died before its teardown: its pick among them (the lowest index in the same whole second) "
                       "is no order")
                votes += [Vote("launcher pick", w, why, rank=r, host=rt.host, cause=cause, evidence=(strongest,),
                               time=first.time, time_family=first.time_family, own=True) for r in among]
                continue
        votes.append(Vote("own failure", own_weight(strongest), f"rank {rt.rank} reported it itself", rank=rt.rank,
                          host=rt.host, cause=cause, evidence=(strongest, first) if first is not strongest
                          else (first,), time=first.time, time_family=first.time_family, own=True))
    return votes


#: a launcher's report of the first failed worker it found (torchelastic's `failed (exitcode: ...) local_rank: L`,
#: mpirun's, spawn's): among workers found dead at once, its choice is the lowest index, not the first in time
LAUNCHER_PICK_KINDS = ("agent_failed",)


def _first_known_cause(events: Iterable[Event]) -> str | None:
    return next((e.cause for e in events if e.cause not in (None, "unknown")), None)


def detectors_and_hosts(tl: JobTimeline) -> list[Vote]:
    """Lines that name a host (node failure, OOM killer on a node, a line that accuses its host whatever rank printed
    it) or nobody (a detector's check failed)."""
    votes = []
    for e in tl.failure_lines():
        who = accuses(e)
        if e.role == "culprit" and who == "none":
            votes.append(Vote("detector", weight("detector"), "a rank detected bad data from a peer it does not name",
                              cause=e.cause, evidence=(e,)))
        elif e.role in ("culprit", "either") and (who == "host" or (e.rank is None and who == "self")):
            host = e.host or e.get("host") or (tl.facts.rank_host.get(e.rank) if e.rank is not None else None)
            host = host if host and is_host_name(host) else None
            votes.append(Vote("host report", own_weight(e) * weight("host report", "scale"),
                              f"reported on host {host or '?'} without a rank", host=host, cause=e.cause,
                              evidence=(e,), time=e.time, time_family=e.time_family))
    return votes


def died_as_victim(rt: RankTimeline) -> bool:
    """Its log explains its death as a victim's (a timeout, a lost peer, a detected bad peer); the reports of
    that death (an agent's `exitcode: -6` after the watchdog's abort) add nothing of its own."""
    victim = [e for e in rt.failures if e.role == "victim" or accuses(e) == "none"]
    return bool(victim) and all(e in victim or e.kind in QUIET_KINDS or
                                (e.kind in DEATH_REPORT_KINDS and e.role == "either") for e in rt.failures)


def srun_task_deaths(tl: JobTimeline) -> list[Vote]:
    """srun's task lines in order: the first task that died on its own before the step's teardown began.

    `Killed` and signals are deaths of the task's own; an exit code may be a victim giving up, so it weighs
    less, and a rank whose log shows it died as a victim weighs little."""
    deaths = [t for t in tl.tasks if t.own_death and t.before_teardown]
    votes = []
    for index, task in enumerate(deaths):
        w = (weight("srun order", "first") if index == 0 else weight("srun order", "later")) * \
            (1.0 if task.status != "Exited" else weight("srun order", "exit_code_factor"))
        cause = task.event.cause if task.event.cause != "unknown" else None
        why = f"srun reported task(s) {task.event.get('tasks') or '?'} {task.status.lower()}" + \
            (" first, before the step's teardown" if index == 0 else " before the step's teardown")
        if tl.facts.torchrun or not task.ranks:
            votes.append(Vote("srun order", w, why, host=task.host, cause=cause, evidence=(task.event,)))
            continue
        for rank in task.ranks:
            share = w / len(task.ranks) * (threshold("victim_discount") if died_as_victim(tl.rank(rank)) else 1.0)
            votes.append(Vote("srun order", share, why, rank=rank, host=task.host, cause=cause, evidence=(task.event,),
                              own=True))
    return votes


def vanished_ranks(tl: JobTimeline) -> list[Vote]:
    """Ranks that started (a start record) and left no exit record and no word, while the others did."""
    started = [rt for rt in tl.ranks.values() if rt.started]
    gone = [rt for rt in started if rt.exit is None and not _speaks(rt)]
    if not gone or len(gone) * 2 > len(started) or not any(rt.exit is not None or _speaks(rt) for rt in started):
        return []
    return [Vote("vanished", weight("vanished", "gone_shared") / len(gone),
                 f"rank {rt.rank} started but left no exit record and no error "
                 "(killed without a chance to write one)", rank=rt.rank, host=rt.host, own=True) for rt in gone]


def _speaks(rt: RankTimeline) -> bool:
    """The rank logged an error of its own or as a victim (not only being terminated, not one it got past)."""
    return any(e.kind not in QUIET_KINDS and e not in rt.recovered for e in rt.failures)


def agent_teardown(tl: JobTimeline) -> list[Vote]:
    """A torchelastic agent SIGTERMs its surviving workers: the worker pid it did not signal had already died. An
    agent's lines of no known host speak for the hosts that no agent's line of a known host speaks for."""
    votes = []
    for host, lines, spared in _spared(tl):
        votes += [Vote("agent teardown",
                       weight("agent teardown", "spared_shared") / len(spared)
                       * (threshold("victim_discount") if died_as_victim(tl.rank(r)) else 1.0),
                       f"its pid is the one the agent on {host or '?'} did not SIGTERM (it had already died)",
                       rank=r, host=host or tl.facts.rank_host.get(r), evidence=tuple(lines[:3])) for r in spared]
    return votes


def _spared(tl: JobTimeline) -> list[tuple[str | None, list[Event], list[int]]]:
    """Per agent host: its SIGTERM lines and the ranks of the worker pids it did not signal (when it signalled some
    of its workers)."""
    lines_of: dict[str | None, list[Event]] = defaultdict(list)
    for e in tl.events:
        if e.kind == "agent_sigterm" and e.pid is not None:
            lines_of[e.host].append(e)
    if not lines_of:
        return []
    workers_of: dict[str, dict[int, int]] = defaultdict(dict)  # host -> worker pid -> rank (one pass, not per host)
    for (h, pid), r in tl.facts.pid_rank.items():
        workers_of[h][pid] = r
    out = []
    for host, lines in lines_of.items():
        signalled = {e.pid for e in lines}
        workers = [(pid, r) for h, pids in workers_of.items() if h not in lines_of for pid, r in pids.items()] \
            if host is None else list(workers_of.get(host, {}).items())
        spared = sorted({r for pid, r in workers if pid not in signalled})
        if spared and len(spared) < len(workers):
            out.append((host, lines, spared))
    return out


def _spared_with(tl: JobTimeline) -> dict[int, list[int]]:
    """Each spared rank -> the ranks its agent spared with it (itself included)."""
    return {r: spared for _host, _lines, spared in _spared(tl) for r in spared}


def logs_that_stop_early(tl: JobTimeline) -> list[Vote]:
    """A rank whose log ends earlier than its peers' (and that said nothing itself) while the job failed."""
    if not (any(rt.failures for rt in tl.ranks.values()) or any(t.own_death for t in tl.tasks) or tl.unranked):
        return []
    early = [rt for rt in tl.ranks.values() if rt.stopped_early and not loud(rt)]
    if not early or len(early) > 2:
        return []
    return [Vote("log stops early", weight("log stops early", "early_shared") / len(early),
                 f"rank {rt.rank}'s log stops earlier than the other ranks' "
                 "logs", rank=rt.rank, host=rt.host) for rt in early]


def job_events(tl: JobTimeline) -> list[Vote]:
    """Slurm ended the job itself (time limit, preemption, scancel, a node failure); a step's cancel line
    (also what a failing rank's teardown prints) weighs little."""
    votes = []
    for e in tl.job_events:
        host = e.get("host") or e.get("host2") if e.cause == "node_failure" else None
        w = max(float(e.priority), weight("slurm", "job_least")) if e.role == "culprit" else own_weight(e)
        why = "Slurm ended the job" if e.role == "culprit" else "Slurm cancelled the step"
        votes.append(Vote("slurm", w, why, host=host if host and is_host_name(host) else None, cause=e.cause,
                          evidence=(e,), time=e.time, time_family=e.time_family))
    return votes
