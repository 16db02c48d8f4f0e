"""Producers of a job set up wrong: network interfaces, library versions, world size, rank numbers.

In: a job's timeline: the interfaces NCCL and gloo picked, the versions ranks report of themselves and their
peers, NCCL's rejections at init, srun's task deaths, launchers' rank announcements. Out: votes for the host of a
minority version, the ranks on a loopback, link-local or bridge interface (wrong_interface), and for the job when
its world is smaller than the tasks launched or processes took the same rank numbers (rank_config_mismatch).
"""

from __future__ import annotations

import re
from collections import Counter

from ddpslurm.analyze.diagnose.knowledge import weight
from ddpslurm.analyze.diagnose.timeline import JobTimeline
from ddpslurm.analyze.diagnose.votes import Vote, rank_list, small_int


def odd_versions(tl: JobTimeline) -> list[Vote]:
    """Ranks that report library versions (their own and a peer's): the host of the minority version is odd."""
    reports = [e for rt in tl.ranks.values() for e in rt.failures if e.get("version")]
    version_of: dict[int, str] = {}
    for e in reports:
        pairs = ((e.rank, e.get("version")), (small_int(e.get("peer_rank")), e.get("peer_version")))
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
    return [Vote("odd version", weight("odd version"),
                 f"host {host} runs version {minority}, the other hosts {others}", host=host,
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
        return [Vote("interface pick", weight("interface pick", "every_rank"),
                     "every rank " + why.split(" ", 1)[1], cause="wrong_interface",
                     evidence=tuple(bad[:2]))]
    return [Vote("interface pick", weight("interface pick", "ranks_shared") / len(ranks),
                 why, rank=r, host=tl.facts.rank_host.get(r),
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
    return [Vote("interface pick", weight("interface pick", "unreachable_peer"),
                 why, cause="wrong_interface", evidence=tuple(failed[:2]))]


_INVALID_ARGUMENT = re.compile(r"\binvalid (?:argument|usage)\b", re.IGNORECASE)


def ranks_beyond_world(tl: JobTimeline) -> list[Vote]:
    """NCCL rejects ranks outside the world it was given (`invalid argument`/`invalid usage` at init) and every
    task from k up fails while the tasks below k go on: the world size is smaller than the tasks launched."""
    dead = sorted({r for t in tl.tasks if t.own_death for r in t.ranks})
    if len(dead) < 2 or dead[0] == 0 or dead != list(range(dead[0], dead[-1] + 1)):
        return []
    if dead[-1] < max(tl.facts.present, default=-1):
        return []  # a higher rank did not fail: not "every task from k up"
    lines = [e for rt in tl.ranks.values() for e in rt.failures] + tl.unranked  # read only where tasks died so
    rejected = [e for e in lines if e.kind in ("exception", "nccl_warn") and _INVALID_ARGUMENT.search(e.text)]
    if not rejected:
        return []
    why = (f"NCCL rejected tasks {dead[0]}-{dead[-1]} ('invalid argument') while the tasks below {dead[0]} went on: "
           "the world size is smaller than the tasks launched")
    return [Vote("ranks beyond world", weight("ranks beyond world"),
                 why, cause="rank_config_mismatch", evidence=tuple(rejected[:2]))]


def duplicate_ranks(tl: JobTimeline) -> list[Vote]:
    """Launchers that number ranks themselves (Lightning, Fabric, NeMo) announce each process's rank once: a rank
    announced by several processes while others of the world never are means processes took the same numbers (srun's
    tasks not handed to the launcher, each node counting from 0): the world cannot form, whoever waits first."""
    told = [e for e in tl.events if e.kind == "rank_announce" and e.get("global_rank") is not None]
    worlds = {small_int(e.get("world_size")) for e in told}
    world = worlds.pop() if len(worlds) == 1 else None
    if not world:
        return []
    counts = Counter(e.get("global_rank") for e in told)
    twice = sorted((int(r) for r, n in counts.items() if n > 1 and r is not None and r.isdigit()))
    if not twice or len(counts) >= world:
        return []
    first = str(twice[0])
    return [Vote("duplicate ranks", weight("duplicate ranks"),
                 f"rank(s) {rank_list(twice)} of {world} were announced by more than one "
                 f"process and {world - len(counts)} never were: processes took the same rank numbers",
                 cause="rank_config_mismatch", evidence=tuple(e for e in told if e.get("global_rank") == first)[:2])]
