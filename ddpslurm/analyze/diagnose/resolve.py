"""Give every event its global rank and host, and gather what the events tell about the job as a whole.

Sources of a rank, strongest first: the line's own prefix or the file it came from, a torchrun worker folder
whose NCCL init names its rank, NCCL's `host:pid` mapped through its init/channel lines, ddpslurm's records
(host and pid, host and local rank), a local rank where the world size the logs state shows one node (a world
no larger than the node's local ranks, a hostlist of one node); else a local rank names no global rank. srun's `N: `
labels number torchrun's nodes, not ranks, when an elastic agent is present.

Every rank set here is bounded by what was launched or seen, never by a number read in a log (a line may say
`world_size=99999999999`).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpslurm.analyze.model import MAX_RANK_LIST, Event, FileSummary, SourceFile, evolve

#: kinds whose rank field is a Slurm task id or a job, not the rank that logged the line
JOB_KINDS = ("slurm_task", "slurm_job")
AGENT_KINDS = ("agent_sigterm", "agent_failed", "elastic_failure")
#: kinds whose (host, pid) identifies a worker process
PID_KINDS = ("nccl_init", "nccl_rank_map", "start", "agent_failed", "elastic_failure")


def expand_ranks(text: str, limit: int = MAX_RANK_LIST) -> list[int]:
    """`2-7`, `0,3-5`, `6, 7` -> a sorted list of ranks; ranges past `limit` ranks in all are dropped."""
    out: set[int] = set()
    for part in re.split(r"[,\s]+", text.strip()):
        m = re.fullmatch(r"(\d{1,9})(?:-(\d{1,9}))?", part)
        if not m:
            continue
        lo = int(m[1])
        hi = int(m[2]) if m[2] else lo
        if hi >= lo and len(out) + hi - lo < limit:
            out.update(range(lo, hi + 1))
    return sorted(out)


@dataclass
class JobFacts:
    """What the events tell about the job as a whole (all sparse: only ranks seen or launched)."""

    launched_world: int | None = None  # from Slurm/submitit/ddpslurm records, not from what a log line says
    said_world: int | None = None  # the largest world size a log line stated (a number, never enumerated)
    rank_host: dict[int, str] = field(default_factory=dict)
    present: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)
    exited: dict[int, Event] = field(default_factory=dict)
    ip_host: dict[str, str] = field(default_factory=dict)
    pid_rank: dict[tuple[str, int], int] = field(default_factory=dict)
    torchrun: bool = False  # srun task ids then number nodes, not ranks
    attempt: int = 0
    _host_ranks: dict[str, list[int]] | None = field(default=None, repr=False)
    _host_ranks_size: int = field(default=-1, repr=False)

    @property
    def world_size(self) -> int | None:
        """The ranks the job had: launched if known, else what the logs show, bounded by what was seen."""
        if self.launched_world:
            return self.launched_world
        seen = min(max(self.present, default=-1) + 1, MAX_RANK_LIST)
        said = self.said_world or 0
        if said and said <= plausible_world(len(self.present), seen):
            return max(said, seen)
        return seen or None

    def ranks_of_host(self, host: str) -> list[int]:
        """The ranks that ran on `host` (its short name matches a fully qualified one)."""
        if self._host_ranks is None or self._host_ranks_size != len(self.rank_host):
            index: dict[str, list[int]] = defaultdict(list)
            for r, h in sorted(self.rank_host.items()):
                index[h.split(".")[0]].append(r)
            self._host_ranks, self._host_ranks_size = index, len(self.rank_host)
        return list(self._host_ranks.get(host.split(".")[0], ()))


_STEP_ID = re.compile(r"^\d+(?:[._]\w+)?$")
_CONTAINER_ID = re.compile(r"^[0-9a-f]{8,64}$")  # docker/k8s hostnames: an id, not a node
#: what a person pasting a log put in place of a host: `xxxxxxxx`, `****`, `<hostname>`, `[redacted]`, `HOSTNAME`
#: or an address with some of its numbers so replaced (`10.x.x.x`, `192.168.*.*`)
_REDACTED = re.compile(r"^(?:([xX*#?])\1{2,}|<[^<>]*>|\[?redacted\]?|hidden|hostname|your[-_]?host"
                       r"|(?:\d{1,3}|[xX*]+)(?:\.(?:\d{1,3}|[xX*]+)){3})$", re.I)


def is_host_name(text: str) -> bool:
    """A node name as Slurm and the logs print it: not a job step id (`123.batch`), an address, a number, a
    container's hex id or what a person put in its place when pasting the log (`xxxxxxxx`)."""
    return bool(text) and not _STEP_ID.match(text) and not _CONTAINER_ID.match(text) and \
        not _REDACTED.match(text) and any(ch.isalpha() for ch in text) and text.count(":") < 2


def plausible_world(ranks_seen: int, highest_seen: int) -> int:
    """The largest world a log may claim given what was seen: a few absent ranks, never a number alone, and
    never more than MAX_RANK_LIST whatever rank number a line carries."""
    return min(max(highest_seen, ranks_seen) * 2 + 64, MAX_RANK_LIST)


def _int_field(e: Event, name: str) -> int | None:
    value = e.get(name, "")
    return int(value) if value and value.isdigit() and len(value) < 10 else None


def _collect_ids(events: Sequence[Event], facts: JobFacts, facts_in: dict[str, Any]) -> dict[tuple[str, int], int]:
    """Records, NCCL init/rank-map lines and srun task lines: rank <-> host, pid, local rank; world sizes."""
    launched = [int(facts_in["world_size"])] if str(facts_in.get("world_size", "")).isdigit() else []
    said: list[int] = []
    nccl_best: dict[tuple[str, int], tuple[int, int]] = {}
    local_rank: dict[tuple[str, int], int] = {}
    nccl_local: dict[tuple[str, int], int] = {}  # a process's local rank, from the prefix of its NCCL lines
    for e in events:
        if e.kind in ("nccl_init", "nccl_rank_map") and e.host and e.pid is not None:
            r, n = _int_field(e, "nccl_rank"), _int_field(e, "nranks") or 0
            if r is not None and ((e.host, e.pid) not in nccl_best or n > nccl_best[(e.host, e.pid)][1]):
                nccl_best[(e.host, e.pid)] = (r, n)
            if e.local_rank is not None:
                nccl_local.setdefault((e.host, e.pid), e.local_rank)
            said.append(n)
        elif e.kind in ("start", "exit", "exit_signal", "elastic_failure", "rank_info") and e.rank is not None:
            _note_worker(e, facts, local_rank, launched)
        elif e.kind in ("store_barrier", "rank_info") and _int_field(e, "world_size"):
            said.append(_int_field(e, "world_size") or 0)
    world = max(said) if said else None  # once: once per process was quadratic (16k ranks under torchrun)
    for (h, pid), (r, n) in nccl_best.items():
        facts.pid_rank.setdefault((h, pid), r)
        if (h, pid) in nccl_local and n == world:  # the world's communicator: its rank is global
            local_rank.setdefault((h, nccl_local[(h, pid)]), r)
    facts.launched_world = min(max(launched), MAX_RANK_LIST) if launched else None
    facts.said_world = world
    return local_rank


def _note_worker(e: Event, facts: JobFacts, local_rank: dict[tuple[str, int], int], launched: list[int]) -> None:
    rank = e.rank
    assert rank is not None
    if e.host and e.pid is not None:
        facts.pid_rank.setdefault((e.host, e.pid), rank)
    if e.host and e.local_rank is not None:
        local_rank.setdefault((e.host, e.local_rank), rank)
    if e.host:
        facts.rank_host.setdefault(rank, e.host)
    world = _int_field(e, "world_size")
    if world and e.kind == "start":  # ddpslurm's own record; a launcher's log line only says a number
        launched.append(world)
    if e.kind == "start":
        facts.started.add(rank)
    elif e.kind in ("exit", "exit_signal"):
        facts.exited[rank] = e


def _worker_dirs(events: Iterable[Event], sources: Sequence[SourceFile]) -> dict[str, tuple[int, str | None]]:
    """torchrun --log-dir: the files of `attempt_N/<local_rank>/` are one worker; its NCCL init names its rank."""
    dirs = {os.path.dirname(s.display) for s in sources if s.local_rank is not None}
    best: dict[str, tuple[int, int, str | None]] = {}
    if not dirs:
        return {}
    for e in events:
        if e.kind != "nccl_init":
            continue
        folder = os.path.dirname(e.file)
        if folder not in dirs:
            continue
        r, n = _int_field(e, "nccl_rank"), _int_field(e, "nranks") or 0
        if r is not None and (folder not in best or n > best[folder][1]):
            best[folder] = (r, n, e.host)
    return {d: (r, h) for d, (r, _n, h) in best.items()}


@dataclass
class _Maps:
    worker_dir: dict[str, tuple[int, str | None]]
    local_rank: dict[tuple[str, int], int]
    unique_pid: dict[int, tuple[int, str]]
    single_host: bool
    host_of_pid: dict[int, str]  # a pid printed with a host (NCCL's `host:pid:tid` head) on one host only
    one_node: bool = False  # the world size the logs state shows one node: a local rank is then a global rank


def _maps(events: Sequence[Event], sources: Sequence[SourceFile], facts: JobFacts,
          local_rank: dict[tuple[str, int], int]) -> _Maps:
    pid_hosts: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for (h, pid), r in facts.pid_rank.items():
        pid_hosts[pid].append((r, h))
    hosts, pid_host = _hosts_and_pids(events, sources)
    single_host = len(hosts) <= 1
    return _Maps(worker_dir=_worker_dirs(events, sources), local_rank=local_rank,
                 unique_pid={pid: pairs[0] for pid, pairs in pid_hosts.items() if len(pairs) == 1},
                 single_host=single_host, host_of_pid={pid: h for pid, h in pid_host.items() if h},
                 one_node=single_host and shows_one_node(events, sources, facts))


#: a DeepSpeed `WORLD INFO DICT` hostlist's node names: `'node01': [0, 1]`
_HOSTLIST_NODE = re.compile(r"""['"]([^'"]+)['"]\s*:\s*\[""")


def shows_one_node(events: Iterable[Event], sources: Sequence[SourceFile], facts: JobFacts) -> bool:
    """The logs show the whole world on one node: a hostlist that names one node, or a world size (launched, or
    stated: WORLD_SIZE, NCCL's nranks, a store's world_size) no larger than the local ranks that node shows (a local
    rank L says the node ran L + 1 workers at least). Seeing one host is not enough: a paste or a file may hold one
    node's lines of many."""
    highest_local = max((s.local_rank for s in sources if s.local_rank is not None), default=-1)
    nodes: set[str] | None = None
    for e in events:
        if e.local_rank is not None and e.local_rank > highest_local and e.local_rank < MAX_RANK_LIST:
            highest_local = e.local_rank
        if e.kind == "hostlist" and e.get("hostlist"):
            nodes = (nodes or set()) | set(_HOSTLIST_NODE.findall(e.get("hostlist", "")))
    if nodes is not None:
        return len(nodes) == 1
    world = facts.launched_world or facts.said_world
    return world is not None and 0 < world <= highest_local + 1


def _hosts_and_pids(events: Sequence[Event], sources: Sequence[SourceFile]) -> tuple[set[str], dict[int, str | None]]:
    """In one pass over the events: the job's hosts (those of events and files, and the hosts ranks connect to),
    and each pid's host (None: a pid seen on two hosts)."""
    hosts = {s.host for s in sources if s.host}
    peers: set[str] = set()
    pid_host: dict[int, str | None] = {}
    for e in events:
        host = e.host
        if host:
            hosts.add(host)
            if e.pid is not None:
                pid_host[e.pid] = host if pid_host.get(e.pid, host) == host else None
        if peer := e.get("peer_host"):
            peers.add(peer)
    hosts |= {p.split(".")[0] for p in peers if is_host_name(p) and p.split(".")[0] != "localhost"}
    return hosts, pid_host


def _attribute(e: Event, facts: JobFacts, maps: _Maps) -> Event:
    """The event with its rank and host filled in from the maps (a fully qualified name's root dot dropped)."""
    rank, host = e.rank, e.host.rstrip(".") if e.host else e.host
    if facts.torchrun and e.get("srun_task") is not None and e.kind not in ("start", "exit"):
        rank = None  # `N: ` from srun --label (or %t of submitit) numbers torchrun's nodes, not ranks
    known = maps.worker_dir.get(os.path.dirname(e.file)) if maps.worker_dir else None
    if known is not None:
        rank = known[0] if rank is None else rank
        host = host or known[1]
    if e.kind in JOB_KINDS:
        return evolve(e, rank=None, host=host) if rank != e.rank or host != e.host else e
    if host is None and e.pid is not None:  # a launcher's `failed (exitcode: -11) local_rank: 0 (pid: P)`
        host = maps.host_of_pid.get(e.pid)
    if rank is None and host and e.pid is not None and (host, e.pid) in facts.pid_rank:
        rank = facts.pid_rank[(host, e.pid)]
    elif rank is None and host is None and e.pid is not None and e.pid in maps.unique_pid:
        rank, host = maps.unique_pid[e.pid]
    if rank is None and host and e.local_rank is not None:
        rank = maps.local_rank.get((host, e.local_rank))
    if rank is None and e.local_rank is not None and maps.single_host:
        # the one host's worker of that local rank, where NCCL's rank map tells its global rank; else the local rank,
        # where the world the logs state fits that one node (else its global rank is not known: host + local rank)
        mapped = {r for (_h, lr), r in maps.local_rank.items() if lr == e.local_rank}
        rank = mapped.pop() if len(mapped) == 1 else e.local_rank if maps.one_node else None
    return evolve(e, rank=rank, host=host) if (rank, host) != (e.rank, e.host) else e


def resolve(events: list[Event], sources: Sequence[SourceFile], summaries: Sequence[FileSummary],
            facts_in: dict[str, Any]) -> tuple[list[Event], JobFacts]:
    """Every event with its global rank and host where the inputs tell it, and the job's facts. The list is
    updated in place and returned (a 16k-rank job's events are not held twice)."""
    facts = JobFacts(attempt=int(facts_in.get("attempt", 0) or 0))
    facts.ip_host.update(facts_in.get("ip_host", {}))
    local_rank = _collect_ids(events, facts, facts_in)
    facts.torchrun = (any(e.kind in AGENT_KINDS for e in events) or any(s.local_rank is not None for s in sources)
                      or any(s.torchrun for s in summaries))
    maps = _maps(events, sources, facts, local_rank)
    for i, e in enumerate(events):
        found = _attribute(e, facts, maps)
        if found is not e:
            events[i] = found
    out = events
    for e in out:
        if e.rank is not None and e.kind not in JOB_KINDS:
            if e.host:
                facts.rank_host.setdefault(e.rank, e.host)
            facts.present.add(e.rank)
    for (host, _pid), rank in facts.pid_rank.items():
        facts.rank_host.setdefault(rank, host)
        facts.present.add(rank)
    facts.present |= {s.rank for s in sources if s.rank is not None and s.kind == "log"}
    for summary in summaries:
        facts.present |= summary.ranks_seen
    facts.present |= facts.started
    if not facts.torchrun:
        _srun_hosts(out, facts)
    _interface_addresses(out, facts)
    return out, facts


def _interface_addresses(events: Iterable[Event], facts: JobFacts) -> None:
    """The host behind each address NCCL/gloo said a process of it communicates on (`Bootstrap : Using ib0:ADDR`):
    a peer named by address in another rank's error is then a host. Only an address one host alone used, and one
    that reaches other hosts (not loopback, link-local or a container bridge, which every node may have alike)."""
    hosts: dict[str, str | None] = {}  # an address's one host; None once another host used it too (not a set an
    for e in events:                   # address: 65k ranks' addresses, 14 MB)
        if e.kind == "interface" and e.host and e.get("scope") == "global":
            address = e.get("ip")
            if address:
                if address not in hosts:
                    hosts[address] = e.host
                elif hosts[address] != e.host:
                    hosts[address] = None
    for address, host in hosts.items():
        if host is not None:
            facts.ip_host.setdefault(address, host)


def _srun_hosts(events: Iterable[Event], facts: JobFacts) -> None:
    """srun's `host: tasks 2-7: ...` lines tell where the tasks (= ranks, without torchrun) ran."""
    limit = plausible_world(len(facts.present), max(facts.present, default=-1) + 1)
    for e in events:
        if e.kind == "slurm_task" and e.get("host") and e.get("tasks"):
            for r in expand_ranks(e.get("tasks", ""), limit):
                facts.rank_host.setdefault(r, e.get("host", ""))
