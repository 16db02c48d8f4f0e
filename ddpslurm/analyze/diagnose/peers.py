"""Producers of the peers victims name: the rank or host a waiting rank says it lost.

In: a job's timeline, its ranks' failure lines with the fields signatures capture (`peer_rank`, `peer_host`,
`peer_host2`, `peer_ip`) and the job's maps from addresses and ranks to hosts. Out: a vote per named peer,
8 + 4 per accusing rank, for a rank or a host; and `named_peer`/`peer_host`, the host a line names (the combiner
and the report read them too). An address nothing maps to a host, or a rank's own host, names nobody.
"""

from __future__ import annotations

import re
from collections import defaultdict

from ddpslurm.analyze.diagnose.knowledge import weight
from ddpslurm.analyze.diagnose.timeline import JobTimeline
from ddpslurm.analyze.diagnose.votes import Vote, accuses
from ddpslurm.analyze.model import Event


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
        w = weight("named peer", "base") + weight("named peer", "per_reporter") * len(who)
        why = f"named as the lost or odd peer by {len(who)} rank(s)"
        if isinstance(target, int):
            votes.append(Vote("named peer", w, why, rank=target, host=tl.facts.rank_host.get(target),
                              evidence=tuple(lines[target][:3])))
        else:
            votes.append(Vote("named peer", w, why, host=target, evidence=tuple(lines[target][:3])))
    return votes


def _peer_of(e: Event, tl: JobTimeline) -> int | str | None:
    peer_rank = e.get("peer_rank", "")
    if peer_rank.isdigit() and len(peer_rank) < 8 and e.kind != "watchdog_timeout":
        return int(peer_rank) if e.get("version") is None else None
    if e.role != "victim" or accuses(e) != "peer":
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
        value = bare_host(e.get(name) or "")
        if value:
            return tl.facts.ip_host.get(value, value)
    return None


#: c10d writes a peer `[host]:port` (IPv6 `[::1]:port`): the host without brackets and port
_BRACKETED = re.compile(r"\[([^\]]*)\](?::\d+)?")


def bare_host(value: str) -> str:
    """A peer as a line names it, without c10d's brackets and port."""
    m = _BRACKETED.fullmatch(value.strip())
    return m[1] if m else value.strip().strip("[]")


def _is_address(text: str) -> bool:
    return text.replace(".", "").isdigit() or text.count(":") >= 2
