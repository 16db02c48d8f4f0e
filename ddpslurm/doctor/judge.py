"""Per-node doctor records -> checks (name, node, ok, detail, advice). Pure: no I/O, no clock.

A record is the dict `probe.py` writes. Thresholds and advice are data; each check is a small function
of all the records, so a node is judged against its peers (versions, interface names, resolution).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

Record = Mapping[str, Any]

MIN_SHM_BYTES = 1 << 30  #: /dev/shm below this starves NCCL and DataLoader workers (Docker's default: 64 MiB)
MIN_FREE_BYTES = 1 << 30  #: free space in the job folder for logs and checkpoints
MAX_CLOCK_SKEW_S = 1.0  #: the analyzer orders events across nodes by time
#: Interface name prefixes of container bridges and virtual pairs: peers on other hosts cannot reach them.
BRIDGE_PREFIXES = ("docker", "virbr", "br-", "cni", "flannel", "cali", "veth", "lxcbr", "podman", "vxlan")

#: check name -> (cause in the analyzer's vocabulary, advice). Rules as data.
CHECKS: dict[str, tuple[str, str]] = {
    "probe": ("node_failure", "The node did not run the checks: look at the srun output; drain or --exclude it"),
    "interface": ("wrong_interface", "Pass --interface with a name that exists on every node (`ip -o addr`), "
                                     "or --exclude the node"),
    "hostname": ("network_unreachable", "Fix /etc/hosts or DNS so every node resolves every node name to the "
                                        "same routable address (Debian's 127.0.1.1 line breaks MASTER_ADDR)"),
    "master_port": ("network_unreachable", "Open TCP from every node to the rank-0 host on MASTER_PORT (firewall, "
                                           "routes), or --exclude the node"),
    "port_free": ("port_in_use", "Another process holds MASTER_PORT on the rank-0 host: pass --master-port with a "
                                 "free port, or --exclude that host"),
    "peers": ("network_unreachable", "Open TCP between the nodes on the interface NCCL/gloo use (firewall, a "
                                     "half-broken NIC), or --exclude the node"),
    "versions": ("nccl_version_mismatch", "Use one software environment on every node (same torch, CUDA, NCCL)"),
    "gpus": ("gpu_hardware", "A GPU is missing on the node (`nvidia-smi`, Xid in dmesg): drain or --exclude it"),
    "shm": ("shm_error", "Enlarge /dev/shm on the node (containers: --shm-size / --ipc=host)"),
    "disk": ("unknown", "Free space in the job folder, or pass --folder on a file system with room"),
    "clock": ("unknown", "Synchronize the node's clock (chrony/ntpd): cross-node timelines need it"),
}


@dataclass(frozen=True)
class Check:
    """One check on one node."""

    name: str
    node: str
    ok: bool
    detail: str
    advice: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(name: str, node: str, ok: bool, detail: str) -> Check:
    return Check(name, node, ok, detail, "" if ok else CHECKS[name][1])


def cause_of(check_name: str) -> str:
    """The analyzer's cause for a failed check."""
    return CHECKS[check_name][0]


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.1f} GiB"


def _majority(values: Sequence[Any]) -> Any:
    """The most common value (the first seen wins a tie)."""
    return Counter(values).most_common(1)[0][0] if values else None


def interface_problem(name: str | None, address: str | None) -> str | None:
    """Why an interface cannot carry DDP traffic between nodes, or None."""
    if not name:
        return "no interface routes to the other nodes"
    if address is None:
        return f"{name} does not exist or has no IPv4 address"
    if name == "lo" or address.startswith("127."):
        return f"{name} is the loopback interface ({address}): peers cannot reach it"
    if address.startswith("169.254."):
        return f"{name} has only a link-local address ({address})"
    if name.startswith(BRIDGE_PREFIXES):
        return f"{name} is a container bridge or virtual pair: other hosts cannot reach it"
    return None


def blamed_nodes(nodes: Sequence[str], failed_pairs: set[frozenset[str]],
                 suspects: frozenset[str] = frozenset()) -> list[str]:
    """The nodes that explain the failed links: the node in most failed pairs first, until none is left.

    One node cut off from every peer is the node to blame. When nodes tie (two nodes, one bad link), a
    `suspect` among them (it could not even connect to itself: a local firewall) is blamed alone; else every
    tied node is: which side drops the packets cannot be told from connections alone.
    """
    left, blamed = set(failed_pairs), []
    while left:
        counts = Counter(node for pair in left for node in pair)
        top = max(counts.values())
        worst = [node for node in nodes if counts.get(node) == top]
        worst = [node for node in worst if node in suspects] or worst
        blamed += worst
        left = {pair for pair in left if not pair & set(worst)}
    return blamed


def _failed_links(records: Mapping[str, Record]) -> dict[tuple[str, str], str]:
    """Failed connections (from, to) -> why, from every record's connection attempts."""
    return {(node, peer): f"{node} -> {peer}: {result.get('error') or 'failed'}"
            for node, record in records.items() for peer, result in (record.get("peers") or {}).items()
            if not result.get("ok")}


def _failed_pairs(records: Mapping[str, Record]) -> dict[frozenset[str], str]:
    """Failed links (either direction) -> why."""
    failed: dict[frozenset[str], str] = {}
    for (node, peer), why in _failed_links(records).items():
        failed.setdefault(frozenset((node, peer)), why)
    return failed


def check_probe(nodes: Sequence[str], records: Mapping[str, Record], _: int | None) -> list[Check]:
    return [_check("probe", node, node in records, "ran" if node in records else "no record: the checks did not run")
            for node in nodes]


def check_interface(nodes: Sequence[str], records: Mapping[str, Record], _: int | None) -> list[Check]:
    names = [rec["interface"].get("name") for rec in records.values() if rec.get("interface")]
    usual = _majority([name for name in names if name])
    out = []
    for node, rec in records.items():
        iface = rec.get("interface") or {}
        name, address = iface.get("name"), iface.get("address")
        problem = interface_problem(name, address)
        if problem is None and name != usual:
            problem = f"{name} here, {usual} on the others: one NCCL/GLOO_SOCKET_IFNAME cannot fit every node"
        out.append(_check("interface", node, problem is None, problem or f"{name} {address}"))
    return out


def check_hostname(nodes: Sequence[str], records: Mapping[str, Record], _: int | None) -> list[Check]:
    """Each node's lookups against the others' lookups of the same names (each node resolves only itself, the
    rank-0 host and its planned peers: a name is judged by the nodes that looked it up)."""
    seen: dict[str, list[Any]] = {}
    for rec in records.values():
        for host, addr in (rec.get("resolution") or {}).items():
            seen.setdefault(host, []).append(addr)
    agreed = {host: _majority(addrs) for host, addrs in seen.items()}
    out = []
    for node, rec in records.items():
        resolution = rec.get("resolution") or {}
        wrong = [f"{host} -> {addr} (the others: {agreed[host]})" for host, addr in resolution.items()
                 if not isinstance(addr, str) or addr.startswith("127.") or addr != agreed[host]]
        out.append(_check("hostname", node, not wrong, "; ".join(wrong) or f"{len(resolution)} names agree"))
    return out


def check_port_free(nodes: Sequence[str], records: Mapping[str, Record], _: int | None) -> list[Check]:
    first = nodes[0] if nodes else None
    rec = records.get(first) if first else None
    if rec is None or first is None:
        return []
    bind = rec.get("port_bind") or {}
    port = rec.get("port")
    detail = f"port {port} free" if bind.get("ok") else f"cannot listen on port {port}: {bind.get('error')}"
    return [_check("port_free", first, bool(bind.get("ok")), detail)]


def _pairs_by_node(failed: Mapping[frozenset[str], str]) -> dict[str, list[tuple[str, str]]]:
    """node -> (the other end, why) of each failed link it is an end of."""
    mine: dict[str, list[tuple[str, str]]] = {}
    for pair, why in failed.items():
        for node in pair:
            mine.setdefault(node, []).extend((other, why) for other in pair if other != node)
    return mine


def _links_detail(rec: Record, mine: Sequence[tuple[str, str]]) -> str:
    """What a node's links did: the failed ones, else how many planned links it tested both ways."""
    if mine:
        return "; ".join(why for _, why in mine)
    plan = rec.get("plan") or {}
    tried, heard = len(rec.get("peers") or {}), len(rec.get("heard_from") or [])
    expected = f" of {len(plan['in'])}" if isinstance(plan.get("in"), list) else ""
    return f"reached {tried} planned peer(s), reached by {heard}{expected}"


def check_links(nodes: Sequence[str], records: Mapping[str, Record], _: int | None) -> list[Check]:
    """master_port (every node -> the rank-0 host) and peers (every planned link), each failure on the blamed node.

    The links tested are those of the sparse plan (graph.probe_plan): a node cut off fails every link it has
    (its ring predecessor, its random peers, its rank-0 link), a bad link fails one; the node in most failed
    links is the one blamed, and the two ends of a link that fails alone are both named (which side drops
    the packets cannot be told) unless one of them cannot even reach itself.
    """
    failed, directed = _failed_pairs(records), _failed_links(records)
    suspects = frozenset(node for node, rec in records.items() if (rec.get("self") or {"ok": True}).get("ok") is False)
    blamed = blamed_nodes(nodes, set(failed), suspects)
    by_node, blamed_set = _pairs_by_node(failed), set(blamed)
    out = []
    first = nodes[0] if nodes else None
    for node in nodes[1:]:
        reason = directed.get((node, first)) or failed.get(frozenset((node, first)))
        if reason is None:
            out.append(_check("master_port", node, True, f"{node} -> {first}:{records[node].get('port')} ok"
                              if node in records else "no record"))
            continue
        out += [_check("master_port", side, False, reason) for side in (node, first) if side in blamed_set]
    for node, rec in records.items():
        ok, mine = node not in blamed_set, by_node.get(node, [])
        detail = _links_detail(rec, mine)
        if node in suspects:
            detail += f"; cannot connect to itself ({rec['self'].get('error')}): a local firewall"
        elif not ok and not suspects and all(other in blamed_set for other, _ in mine):
            detail += " (cannot tell which side)"  # a link that fails alone: both its ends are named
        out.append(_check("peers", node, ok, detail))
    return out


def _versions(rec: Record) -> str:
    versions = rec.get("versions") or {}
    return f"torch {versions.get('torch')}, CUDA {versions.get('cuda')}, NCCL {versions.get('nccl')}"


def check_versions(nodes: Sequence[str], records: Mapping[str, Record], _: int | None) -> list[Check]:
    usual = _majority([_versions(rec) for rec in records.values()])
    return [_check("versions", node, _versions(rec) == usual,
                   _versions(rec) if _versions(rec) == usual else f"{_versions(rec)}; the others: {usual}")
            for node, rec in records.items()]


def check_gpus(nodes: Sequence[str], records: Mapping[str, Record], expected: int | None) -> list[Check]:
    usual = _majority([rec.get("gpus") for rec in records.values()])
    want = expected if expected is not None else usual
    out = []
    for node, rec in records.items():
        seen = rec.get("gpus")
        ok = seen == want or (expected is not None and isinstance(seen, int) and seen >= expected)
        detail = f"{seen} GPU(s) visible" + ("" if ok else f", expected {want}")
        out.append(_check("gpus", node, ok, detail))
    return out


def check_space(nodes: Sequence[str], records: Mapping[str, Record], _: int | None) -> list[Check]:
    """/dev/shm size and free space in the job folder, against the thresholds above."""
    out = []
    for node, rec in records.items():
        for name, field, least, where in (("shm", "shm_bytes", MIN_SHM_BYTES, "/dev/shm size"),
                                          ("disk", "free_bytes", MIN_FREE_BYTES, "free in the job folder")):
            value = rec.get(field)
            ok = isinstance(value, int) and value >= least
            shown = _gib(value) if isinstance(value, int) else "unknown"
            out.append(_check(name, node, ok, f"{where}: {shown}" + ("" if ok else f" (< {_gib(least)})")))
    return out


def check_clock(nodes: Sequence[str], records: Mapping[str, Record], _: int | None) -> list[Check]:
    """Each node's clock against the rank-0 host's, measured over the master-port connection."""
    first = nodes[0] if nodes else None
    out = []
    for node, rec in records.items():
        if node == first:
            continue
        offset = ((rec.get("peers") or {}).get(first) or {}).get("offset_s")
        if not isinstance(offset, int | float):
            continue  # no connection to the rank-0 host: master_port says so
        ok = abs(offset) <= MAX_CLOCK_SKEW_S
        out.append(_check("clock", node, ok, f"{offset:+.3f} s from {first}"
                          + ("" if ok else f" (more than {MAX_CLOCK_SKEW_S:g} s)")))
    return out


JUDGES: tuple[Callable[[Sequence[str], Mapping[str, Record], int | None], list[Check]], ...] = (
    check_probe, check_interface, check_hostname, check_port_free, check_links, check_versions, check_gpus,
    check_space, check_clock,
)


def judge(nodes: Sequence[str], records: Mapping[str, Record], expected_gpus: int | None = None) -> list[Check]:
    """Every check on every node. `nodes` is the allocation in node-rank order (the first hosts rank 0)."""
    return [check for run in JUDGES for check in run(nodes, records, expected_gpus)]


def failing_nodes(checks: Sequence[Check]) -> list[str]:
    """The nodes with a failed check, in first-failure order."""
    return list(dict.fromkeys(check.node for check in checks if not check.ok))


def verdict(checks: Sequence[Check]) -> dict[str, Any]:
    """The `doctor --json` object: ok, checks, failing_nodes."""
    failing = failing_nodes(checks)
    return {"ok": not failing, "checks": [check.to_dict() for check in checks], "failing_nodes": failing}
