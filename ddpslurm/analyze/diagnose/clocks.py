"""Per-host clock offsets, estimated where one event is seen from several hosts (pure).

In: a job's events. Out: each host's offset from the other hosts' clocks, in seconds, for the one time family its
lines carry, where it is larger than the clocks' tolerance. The event seen from every host is NCCL's `Init COMPLETE`
of the job's world communicator: ncclCommInitRank returns on no rank until every rank has joined, so the ranks'
completions happen together, and a host whose completions read seconds later than the others' runs that much ahead.
Communicators of the world's size are created in the same order on every rank (torch requires it), so a rank's
k-th completion of that size is the same event as every other rank's k-th. Offsets only order events across hosts
(combiner.py); no time shown is changed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ddpslurm.analyze.model import Event


@dataclass(frozen=True)
class Offset:
    """`host`'s clock reads `seconds` more than the other hosts' (time family `family`), from `events` sync points."""

    host: str
    seconds: float
    family: str
    events: int



def clock_note(offsets: dict[str, Offset]) -> str | None:
    """The report's note on the offsets found, if any."""
    if not offsets:
        return None
    shown = sorted(offsets.values(), key=lambda o: o.host)
    told = ", ".join(f"{o.host} {o.seconds:+.1f} s" for o in shown[:5]) + \
        (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
    return (f"clocks: {told} against the middle of the job's hosts' clocks (from NCCL's init of the job's "
            f"communicator, which completes on every rank at once, seen on each host); ranks on different hosts "
            "were ordered with that taken off, the times shown are as logged")


def host_offsets(events: Iterable[Event], world: int | None, tolerance: float) -> dict[str, Offset]:
    """Each host's offset where it exceeds `tolerance`, from the world communicator's init completions; none
    without a world of two or more ranks on two or more hosts."""
    if not world or world < 2:
        return {}
    from statistics import median  # (with fractions and decimal: imported by the jobs that have clocks to compare)

    seen: dict[tuple[str, int], int] = defaultdict(int)  # (host, pid) -> completions of the world's size so far
    sync: dict[tuple[int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e.kind != "nccl_init" or e.get("init") != "complete" or e.time is None or not e.host \
                or e.pid is None or e.time_family is None or e.get("nranks") != str(world):
            continue
        k = seen[(e.host, e.pid)]
        seen[(e.host, e.pid)] = k + 1
        sync[(k, e.time_family)][e.host].append(e.time)
    per_host: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (_k, family), hosts in sync.items():
        if len(hosts) < 2:
            continue
        at = {h: median(times) for h, times in hosts.items()}
        middle = median(at.values())
        for h, t in at.items():
            per_host[(h, family)].append(t - middle)
    families = {f for _h, f in per_host}
    if len(families) != 1:
        return {}  # two time families: they do not compare anyway
    out = {}
    for (h, family), deltas in per_host.items():
        seconds = median(deltas)
        if abs(seconds) > tolerance:
            out[h] = Offset(host=h, seconds=seconds, family=family, events=len(deltas))
    return out
