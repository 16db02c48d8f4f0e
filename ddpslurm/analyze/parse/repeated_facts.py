"""Facts told once: a file's events in, the same events less the facts that only repeat an earlier one out.
Victim events a rank repeats (torch logs a watchdog timeout several times per rank, in several wordings) are kept
once (`without_repeats`), and facts of a process that an earlier fact of the same process told already (NCCL tells a
rank twice per communicator and again in its `comm` and tree lines; its bootstrap and transport lines name the same
interface) are dropped (`without_told_facts`). A file's ranges merged back together go through the same pass.
"""

from __future__ import annotations

import bisect

from ddpslurm.analyze.model import Event


def told_once(events: list[Event]) -> list[Event]:
    """A file's events (or a file's ranges' merged) with each fact they repeat told once."""
    return without_told_facts(without_repeats(events)) if len(events) > 1 else events


def without_repeats(events: list[Event]) -> list[Event]:
    """A file's events less the victim facts it repeats: a later victim line of a rank that says nothing an
    earlier one of the same kind did not (torch logs a watchdog timeout four times per rank, in three wordings:
    16k ranks, 64k events). The first is kept; facts of no known rank are all kept (a merged log may hold several
    ranks' identical lines). Each kept victim's fields are made a set once (`says_no_more` of every pair)."""
    seen: set[tuple] = set()
    told: dict[tuple, list[tuple[Event, set, bool]]] = {}
    out: list[Event] = []
    for e in events:
        if e.role == "victim" and e.rank is not None:
            key = (e.signature, e.rank, e.host, e.pid, e.fields)
            if key in seen:
                continue
            earlier = told.setdefault((e.kind, e.cause, e.rank, e.host, e.pid, e.local_rank), [])
            if earlier and _no_news(e, earlier[-TOLD_REACH:]):
                continue
            seen.add(key)
            earlier.append((e, set(e.fields), e.get("srun_task") is not None))
        out.append(e)
    return out


def _no_news(later: Event, earlier: list[tuple[Event, set, bool]]) -> bool:
    """Whether `later` says no more than one of `earlier` (each with its fields' set and whether it was read by
    its srun task id): `says_no_more` of each, what depends on `later` alone worked out once."""
    task_news = later.get("srun_task") is not None and later.get("rank") != str(later.rank)
    said = [pair for pair in later.fields if pair[0] not in READING_FIELDS]
    when = later.time
    for before, fields, by_task in earlier:
        if when is not None and when != before.time:
            continue
        if task_news and not by_task:
            continue
        if all(pair in fields for pair in said):
            return True
    return False


#: fields that tell how a line was read, not what it says
READING_FIELDS = ("srun_task",)


def says_no_more(later: Event, earlier: Event) -> bool:
    """Whether victim event `later` says nothing `earlier` (same kind, cause and rank) did not: none of its fields
    is new, and no time of its own. Its srun task id (the rank from the file's name) is no news when its own text
    names that rank (`[Rank N]`), or when `earlier` was read the same way."""
    if later.time is not None and later.time != earlier.time:
        return False
    fields = set(earlier.fields)
    if later.get("srun_task") is not None and earlier.get("srun_task") is None and \
            later.get("rank") != str(later.rank):
        return False
    return all(pair in fields for pair in later.fields if pair[0] not in READING_FIELDS)


#: facts of a process that the engine reads for their values alone (resolve's maps, the timeline's host, pid and
#: signs of life; the interface a process picked), and the kinds of earlier facts that tell all a fact of that kind
#: does: an `Init` line is a rank-map line and more (a pid for the timeline, a sign the job initialized)
TOLD_BY = {"nccl_init": ("nccl_init",), "nccl_rank_map": ("nccl_rank_map", "nccl_init"), "interface": ("interface",)}
#: of these kinds, the fields the engine reads (producers.interface_picks: the interface and address picked); the
#: others say how the line put it (NCCL names its bootstrap and its transport's out-of-band interface: one pick)
TOLD_FIELDS = {"interface": ("ifname", "ip", "srun_task")}
#: the facts of one process a later one is compared with (a process may init hundreds of communicators)
TOLD_REACH = 8


def without_told_facts(events: list[Event]) -> list[Event]:
    """A file's events less the facts that only repeat an earlier one of the same process (`TOLD_BY`): both without
    a time (the order of untimed lines is their place in the file), the later one's fields (those the engine reads,
    `TOLD_FIELDS`) among the earlier one's, and no failure in the file on the lines between them (a sign of life
    after a failure is news). NCCL tells a rank twice per communicator (`Init START`, `Init COMPLETE`), and its
    `comm` and tree lines say that rank again: 16k ranks, 48k events; its bootstrap and transport lines name the
    same interface: 16k more. The failures' lines are sorted only when a fact would be dropped."""
    failures: list[int] | None = None
    told: dict[tuple, list[tuple[int, str, frozenset]]] = {}
    out: list[Event] = []
    for e in events:
        tellers = TOLD_BY.get(e.kind)
        if tellers is None or e.time is not None:
            out.append(e)
            continue
        fields = frozenset(e.fields)
        who = (e.rank, e.host, e.pid, e.local_rank)
        earlier = told.get(who)
        if earlier is None:
            told[who] = [(e.line, e.kind, fields)]
            out.append(e)
            continue
        read = TOLD_FIELDS.get(e.kind)
        told_fields = fields if read is None else frozenset([p for p in e.fields if p[0] in read])
        repeats = False
        for line, kind, seen in earlier[-TOLD_REACH:]:
            if kind in tellers and told_fields <= seen:
                if failures is None:
                    failures = sorted([f.line for f in events if f.role is not None])
                if not _between(failures, line, e.line):
                    repeats = True
                    break
        if repeats:
            continue
        earlier.append((e.line, e.kind, fields))
        out.append(e)
    return out


def _between(lines: list[int], a: int, b: int) -> bool:
    """Whether a line of the sorted `lines` lies from line a to line b (in either order)."""
    lo, hi = min(a, b), max(a, b)
    i = bisect.bisect_left(lines, lo)
    return i < len(lines) and lines[i] <= hi
