"""Perturbations of a labelled case: a case folder -> a perturbed copy + the label mapped through the change.

Each perturbation is a pure function of the case's files (read here, written to a new folder) that keeps the
failure's meaning: renumbered ranks, renamed hosts, shifted clocks, stripped timestamps, benign noise, deleted
records, truncated tails, split or merged files. The expectation is always the ORIGINAL label mapped through the
perturbation; the analyzer must give it again. Where a case's tokens cannot be rewritten without guessing, the
perturbation raises `Unsupported` with the reason instead of producing a wrong copy.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from ddpslurm.analyze.parse.attribution import strip_prefixes
from ddpslurm.analyze.read.file_names import path_info

RECORD_SUFFIXES = (".start.json", ".exit.json")
JOB_RECORD = "ddpslurm.json"


class Unsupported(Exception):
    """The case cannot take this perturbation without guessing; the message says why."""


@dataclass(frozen=True)
class CaseFacts:
    """What a perturbation needs to know about a case: its files, label and the original diagnosis."""

    root: Path
    label: dict[str, Any]
    diagnosis: dict[str, Any]
    files: tuple[PurePath, ...] = field(default=())  # relative paths, label.json excluded

    def text(self, rel: PurePath) -> str:
        return (self.root / rel).read_bytes().decode("utf-8", errors="surrogateescape")


@dataclass(frozen=True)
class Perturbed:
    """A perturbed copy: its folder, the mapped label, and how strictly the rank must match."""

    root: Path
    label: dict[str, Any]
    rank_may_be_null: bool = False  # the perturbation removed what orders the ranks (the test decides per case)
    host_aliases: tuple[str, ...] = ()  # other spellings of the expected host (a FQDN's short name)


def load_facts(case: Path, diagnosis: dict[str, Any]) -> CaseFacts:
    files = tuple(sorted(p.relative_to(case) for p in case.rglob("*") if p.is_file() and p.name != "label.json"))
    return CaseFacts(root=case, label=json.loads((case / "label.json").read_text()), diagnosis=diagnosis, files=files)


# ---------------------------------------------------------------- writing a copy

Rewrite = Callable[[PurePath, str], str | None]  # (relative path, text) -> new text, or None to drop the file


def write_copy(facts: CaseFacts, dest: Path, rewrite: Rewrite, rename: Callable[[PurePath], PurePath] = lambda p: p,
               extra: Iterable[tuple[PurePath, str]] = ()) -> Path:
    """Write every file of the case through `rewrite` and `rename` under `dest`, plus `extra` files."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel in facts.files:
        text = rewrite(rel, facts.text(rel))
        if text is not None:
            _write(dest / rename(rel), text)
    for rel, text in extra:
        _write(dest / rel, text)
    return dest


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as handle:  # two sources may land in one file (a merge)
        handle.write(text.encode("utf-8", errors="surrogateescape"))


def is_record(rel: PurePath) -> bool:
    return rel.name.endswith(RECORD_SUFFIXES) or rel.name in (JOB_RECORD, "error.json")


def by_line(fn: Callable[[str], str]) -> Callable[[str], str]:
    """Apply `fn` to every line of a text, line endings kept."""
    return lambda text: "\n".join(fn(line) if line else line for line in text.split("\n"))


def _map_label(label: dict[str, Any], rank: Callable[[int], int] = lambda r: r,
               host: Callable[[str], str] = lambda h: h) -> dict[str, Any]:
    out = dict(label)
    if out.get("first_failing_rank") is not None:
        out["first_failing_rank"] = rank(out["first_failing_rank"])
    if out.get("first_failing_host") is not None:
        out["first_failing_host"] = host(out["first_failing_host"])
    if "exclude_nodes" in out:
        out["exclude_nodes"] = [host(h) for h in out["exclude_nodes"]]
    return out


# ---------------------------------------------------------------- hosts

_HN = r"[A-Za-z][A-Za-z0-9-]*[A-Za-z0-9]"
#: Places where a log names a host (the analyzer's and the tools' formats); the group `h` is the short name.
_HOST_PLACES = tuple(re.compile(p) for p in (
    rf"(?:^|[\s\[(>|]|\]:)(?P<h>{_HN})(?:\.[\w-]+)*:\d+:\d+ \[\d+\] ",  # NCCL host:pid:tid [dev]
    rf"(?:srun|slurmstepd)(?:-[\w.-]+)?: error: (?P<h>{_HN}): ",  # srun: error: host: task(s) ...
    rf"(?:[Nn]ode failure on|[Nn]odes?|ON|hostname=|host[= ]|on host|on|at) (?P<h>{_HN})(?=[\s,:;)(]|\.\s|$)",
    rf"slurmstepd-(?P<h>{_HN}):",
    rf"hostname=(?P<h>{_HN})[,)]",
    rf"^(?:[A-Z][a-z]{{2}} +\d+ \d\d:\d\d:\d\d) (?P<h>{_HN}) ",  # syslog / journalctl
    rf"\((?P<h>{_HN}), \d+\)",  # c10d (host, port)
    rf"\[(?P<h>{_HN})\]:\d+",  # c10d [host]:port
))
_NOT_HOSTS = {"localhost", "None", "null", "STEP", "JOB", "error"}


def _looks_like_host(name: str) -> bool:
    return bool(re.fullmatch(_HN, name)) and any(c.isdigit() for c in name) and name not in _NOT_HOSTS \
        and not re.fullmatch(r"(?:[Rr]ank|tasks?|default|cuda|sm|py|nccl|torch|[EWIF])\d+", name)


def known_hosts(facts: CaseFacts) -> set[str]:
    """Every host name the case knows: label, original diagnosis, records, path names and log lines."""
    found: set[str] = set()
    label, diag = facts.label, facts.diagnosis
    found.update(h for h in [label.get("first_failing_host"), *label.get("exclude_nodes", []),
                             diag.get("first_failing_host"), *diag.get("exclude_nodes", []),
                             *(row.get("host") for row in diag.get("ranks", []))] if isinstance(h, str))
    for rel in facts.files:
        found.add(path_info(rel).host or "")
        text = facts.text(rel)
        if rel.suffix == ".json":
            found.update(re.findall(rf'"(?:host|hostname|master_addr)": "({_HN})', text))
            continue
        for line in text.split("\n"):
            found.update(m["h"] for place in _HOST_PLACES for m in place.finditer(line))
            found.add(strip_prefixes(line).host or "")
    return {h.split(".")[0] for h in found if h and _looks_like_host(h.split(".")[0])}


@dataclass(frozen=True)
class HostMap:
    """Old short host name -> new name; stems (the part before the trailing digits) map for hostlists."""

    names: dict[str, str]
    stems: dict[str, tuple[str, int]]  # old stem -> (new stem, digit shift)
    fqdn: str = ""

    def __call__(self, host: str) -> str:
        short = host.split(".")[0]  # a written FQDN (or the trailing dot of a paste) keeps its tail
        return self.names[short] + self.fqdn + host[len(short):] if short in self.names else host


def _split_host(name: str) -> tuple[str, str]:
    m = re.fullmatch(r"(.*?)(\d*)", name)
    assert m is not None
    return m[1], m[2]


def host_map(hosts: Iterable[str], fqdn: str = "") -> HostMap:
    """Consistent new names: a different stem per old stem, the number shifted by 17 (zero padding kept)."""
    stems: dict[str, tuple[str, int]] = {}
    names: dict[str, str] = {}
    for host in sorted(hosts):
        stem, digits = _split_host(host)
        if stem not in stems:
            new_stem = f"r{len(stems) + 7}-gpu" + ("-" if stem.endswith("-") else "")
            stems[stem] = (new_stem + ("x" if len(new_stem) == len(stem) else ""), 17)
        new_stem, shift = stems[stem]
        names[host] = new_stem + (str(int(digits) + shift).zfill(len(digits)) if digits else "z")
    return HostMap(names=names, stems=stems, fqdn=fqdn)


def _hostlist_pattern(hmap: HostMap) -> re.Pattern[str] | None:
    stems = [re.escape(s) for s in sorted(hmap.stems, key=len, reverse=True) if s]
    return re.compile(rf"(?<![\w.-])(?P<stem>{'|'.join(stems)})\[(?P<body>[\d,\-]+)\]") if stems else None


def _rewrite_hostlist(hmap: HostMap, m: re.Match[str]) -> str:
    new_stem, shift = hmap.stems[m["stem"]]

    def shifted(n: re.Match[str]) -> str:
        return str(int(n[0]) + shift).zfill(len(n[0]))

    if not hmap.fqdn:
        return f"{new_stem}[{re.sub(r'[0-9]+', shifted, m['body'])}]"
    return ",".join(f"{new_stem}{int(n) + shift:0{len(n)}d}{hmap.fqdn}" for n in _expand(m["body"], keep_text=True))


def _expand(body: str, keep_text: bool = False) -> list[Any]:
    """`1-3,7` -> [1, 2, 3, 7] (or zero-padded strings with keep_text)."""
    out: list[Any] = []
    for part in body.split(","):
        lo, _, hi = part.strip().partition("-")
        width = len(lo)
        for n in range(int(lo), int(hi or lo) + 1):
            out.append(str(n).zfill(width) if keep_text else n)
    return out


def rename_hosts(facts: CaseFacts, dest: Path, fqdn: str = "") -> Perturbed:
    """Every host name replaced consistently (a different stem, number and length; optionally a FQDN)."""
    hosts = known_hosts(facts)
    if not hosts:
        raise Unsupported("the logs name no host")
    hmap = host_map(hosts, fqdn)
    alternation = "|".join(re.escape(h) for h in sorted(hosts, key=len, reverse=True))
    in_text = re.compile(rf"(?:(?<=slurmstepd-)|(?<![\w.-]))(?:{alternation})(?![\w-])")
    in_path = re.compile(rf"(?<![A-Za-z0-9])(?:{alternation})(?![A-Za-z0-9])")
    hostlist = _hostlist_pattern(hmap)

    def text_fn(rel: PurePath, text: str) -> str:
        if hostlist is not None:
            text = hostlist.sub(lambda m: _rewrite_hostlist(hmap, m), text)
        return in_text.sub(lambda m: hmap(m[0]), text)

    def rename(rel: PurePath) -> PurePath:
        return PurePath(*(in_path.sub(lambda m: hmap(m[0]), part) for part in rel.parts))

    root = write_copy(facts, dest, text_fn, rename)
    label = _map_label(facts.label, host=hmap)
    want = label.get("first_failing_host")
    aliases = (want.split(".")[0],) if fqdn and isinstance(want, str) else ()
    return Perturbed(root=root, label=label, host_aliases=aliases)


# ---------------------------------------------------------------- ranks

_SEP = r'(?:\s*[:=]\s*|"\s*:\s*"?|\s+|_)?'
#: Rank-bearing tokens. Group names say what the number is: r = global rank, rl = list of global ranks,
#: t = srun task list (ranks, or nodes under torchrun), n = node index, L = local rank of the r in the same
#: match, ring/tree = NCCL's ring orders and trees (all numbers are ranks). First rule wins on overlaps.
_RANK_RULES = tuple(re.compile(p) for p in (
    r"\[\d+,(?P<r>\d+)\]<std(?:out|err)>",  # Open MPI --tag-output
    r"JobEnvironment\(.*?local_rank=(?P<L>\d+)\(\d+\), node=(?P<n>\d+)\(\d+\), global_rank=(?P<r>\d+)\(",
    r"(?<![\w-])rank\s*:\s*(?P<r>\d+) \(local_rank: (?P<L>\d+)\)",  # torchelastic ChildFailedError
    r"(?<![\w/-])[Rr]anks:? (?P<rl>\d+(?:, ?\d+)+)",
    rf"(?<![\w/-])(?:global[_ ]|role_)?(?:rank|Rank|RANK){_SEP}(?P<r>\d+)(?!\d)",
    r"(?:fault-rank|SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK)[ =:]+(?P<r>\d+)(?!\d)",
    r"srun: error: [^:\s]+: tasks? (?P<t>\d[\d,\- ]*)(?=: )",
    r"(?:^|srun: error: )task (?P<t>\d+): ",
    r"tasks?: \[(?P<t>[\d,\-]+)\]",
    r"(?P<r>\d+)\[[0-9a-fx]+\] -> (?P<r2>\d+)\[",  # NCCL Channel a[dev] -> b[dev]
    r"(?:Channel \d+/\d+|Ring \d+) :(?P<ring>(?: +\d+)+) *$",
    r"Trees(?P<tree>(?: \[\d+\] [-\d/>]+)+)",
    rf"(?<![\w-])(?:node[_-]rank|group_rank|NODE_RANK|SLURM_NODEID){_SEP}(?P<n>\d+)(?!\d)",
    r"--node[-_]rank[= ](?P<n>\d+)",
    r"keys?: \S*/(?P<r>\d+)(?=[\"\\\s]|$)",  # gloo/c10d store key of the awaited rank
    # ProcessGroupNCCL's unique-id wait: the waiter and the root, ranks of the communicator (the job's, in the corpus)
    r"\[(?P<r>\d+)\] is setting up NCCL communicator and retrieving ncclUniqueId from \[(?P<r2>\d+)\]",
    # ProcessGroupNCCL's desync report (c10d TraceUtils.h): the reporter, the lagging ranks, the snapshot's ranks
    r"- \[(?P<r>\d+)\] Timeout at collective",
    r"ranks \[(?P<rl>\d+(?:, \d+)*)\] are the lagging ranks",
    r"\[(?P<rl>\d+(?:, \d+)*)\] (?=joined but didn|finished collective #|started [A-Z_]|finished [A-Z_])",
    r"\[(?![Rr]ank)[A-Za-z_]+(?P<l>\d+)\]:",  # torchrun --tee `[default3]:` (local rank of the line's node)
    r"local_rank:? (?P<l>\d+) \(pid: (?P<pid>\d+)",  # torchelastic agent `failed (...) local_rank: 3 (pid: N)`
    r"(?:LOCAL_RANK|SLURM_LOCALID)=(?P<l>\d+)",
    r"--local[_-]rank=(?P<l>\d+)",  # deepspeed/torch.distributed.launch worker argv
))
_SRUN_LABEL = re.compile(r"^(?P<t> *\d{1,6})(?=: )")
_LOCAL_ONLY = re.compile(r"\[(?![Rr]ank)[A-Za-z_]+\d+\]:|local_rank:? \d+ \(pid|LOCAL_RANK=\d+|SLURM_LOCALID=\d+")
_WORLD_CLAIMS = re.compile(r"nranks (\d+)|world_size[\"=:\s]+(\d+)|global_rank=\d+\((\d+)\)|(?<![\w-])rank \d+/(\d+)"
                           r"|WORLD_SIZE=(\d+)")
_PER_NODE_CLAIMS = (re.compile(r'"local_world_size": (\d+)'), re.compile(r"local_rank=\d+\((\d+)\)"),
                    re.compile(r"nproc[-_]per[-_]node[= ](\d+)"))
_TORCHRUN = re.compile(r"torchrun|torch\.distributed\.(?:run|elastic|launch)|\"launcher\": \"torchrun\""
                       r"|\[default\d+\]:")


def _bit_fmt(values: Iterable[int]) -> str:
    """Slurm's task list form: sorted, runs as `a-b`, joined by commas."""
    nums = sorted(set(values))
    runs: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        runs.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(runs)


@dataclass(frozen=True)
class RankMap:
    """A rank permutation that keeps the job's shape: rank 0 fixed, ranks = node * per_node + local."""

    ranks: dict[int, int]
    nodes: dict[int, int]
    per_node: int
    tasks_are_nodes: bool
    locals_change: bool = False  # on 1-2 nodes the permutation reverses local ranks

    def local(self, node: int | None, local: int, line: str = "") -> int:
        """A local rank of `node` under the permutation; without the node only when locals do not change."""
        if not self.locals_change:
            return local
        if node is None and len(self.nodes) == 1:
            node = 0  # a one-node job: every local rank is node 0's
        if node is None:
            raise Unsupported(f"a local rank whose node the case does not tell: {line.strip()[:100]!r}")
        return self.rank(node * self.per_node + local) % self.per_node

    def rank(self, r: int) -> int:
        return self.ranks.get(r, r)

    def task(self, t: int) -> int:
        return self.nodes.get(t, t) if self.tasks_are_nodes else self.rank(t)

    def value(self, kind: str, text: str, match_rank: int | None, node: int | None = None, line: str = "") -> str:
        """The new text of one group of kind `kind` (see _RANK_RULES); `node` is the line's node, when known."""
        if kind == "l":
            return str(self.local(node, int(text), line))
        if kind == "r":
            return str(self.rank(int(text)))
        if kind == "n":
            return str(self.nodes.get(int(text), int(text)))
        if kind == "L":
            return str(self.rank(match_rank) % self.per_node) if match_rank is not None else text
        if kind == "rl":
            return re.sub(r"\d+", lambda m: str(self.rank(int(m[0]))), text)
        if kind == "t":
            if text.strip().isdigit():
                return str(self.task(int(text))).rjust(len(text))
            return _bit_fmt(self.task(n) for n in _expand(text.replace(" ", "")))
        if kind == "ring":
            return re.sub(r"\d+", lambda m: str(self.rank(int(m[0]))), text)
        if kind == "tree":
            return re.sub(r"(?<![\[\d-])\d+(?![\]\d])", lambda m: str(self.rank(int(m[0]))), text)
        raise ValueError(kind)


@dataclass(frozen=True)
class Writers:
    """Which node wrote a line, where the case tells: by the line's host prefix, or a worker's pid."""

    host_nodes: dict[str, int] = field(default_factory=dict)
    pid_ranks: dict[int, int] = field(default_factory=dict)  # from torchelastic's ChildFailedError blocks

    def node(self, line: str) -> int | None:
        if not self.host_nodes:
            return None
        head = nccl_head_host(line)
        host = head or strip_prefixes(line).host
        return self.host_nodes.get(host) if host else None


def nccl_head_host(line: str) -> str | None:
    head = re.search(r"(?:^|\s)([A-Za-z][\w.-]*):\d+:\d+ \[\d+\] ", line)
    return head[1] if head else None


def rewrite_rank_line(line: str, rmap: RankMap, srun_label: bool, seen: list[int] | None = None,
                      node: int | None = None, writers: Writers | None = None) -> str:
    """Every rank-bearing token of `line` mapped through `rmap` (spans of earlier rules win).

    `node` is the node of the file's writer when the file tells it; under torchrun an srun label names it per line,
    else `writers` may (the line's host, a worker's pid).
    """
    spans: list[tuple[int, int, str]] = []
    rules = ((_SRUN_LABEL, *_RANK_RULES) if srun_label else _RANK_RULES)
    label = _SRUN_LABEL.match(line) if srun_label and rmap.tasks_are_nodes else None
    by_host = writers.node(line) if writers and rmap.locals_change else None
    node = int(label["t"]) if label else by_host if by_host is not None else node
    for rule in rules:
        for m in rule.finditer(line):
            match_rank = int(m["r"]) if "r" in rule.groupindex and m["r"] is not None else None
            pid = int(m["pid"]) if "pid" in rule.groupindex and m["pid"] else None
            if writers and pid in writers.pid_ranks:
                match_node: int | None = writers.pid_ranks[pid] // rmap.per_node
            else:
                match_node = node
            for name, value in m.groupdict().items():
                if value is None or name == "pid":
                    continue
                start, end = m.span(name)
                if any(start < e and s < end for s, e, _ in spans):
                    continue
                kind = name.rstrip("0123456789")
                if seen is not None and kind in ("r", "rl", "ring"):
                    seen.extend(int(v) for v in re.findall(r"\d+", value))
                spans.append((start, end, rmap.value(kind, value, match_rank, match_node, line)))
    for start, end, new in sorted(spans, reverse=True):
        line = line[:start] + new + line[end:]
    return line


def _is_srun_labelled(text: str) -> bool:
    return sum(1 for _ in re.finditer(r"(?m)^ *\d{1,6}: \S", text)) >= 3


@dataclass(frozen=True)
class RankLayout:
    """The job's shape as the case tells it."""

    world: int
    per_node: int
    tasks_are_nodes: bool
    local_only: str  # a local-rank-only token the case holds ("" when none), e.g. `[default1]:`


def _per_node_from_hosts(diagnosis: dict[str, Any]) -> int | None:
    """Ranks per node from the original diagnosis' rank table, when every host holds a contiguous aligned block."""
    by_host: dict[str, list[int]] = {}
    for row in diagnosis.get("ranks", []):
        if isinstance(row.get("host"), str):
            by_host.setdefault(row["host"], []).append(row["rank"])
    if len(by_host) < 2:
        return None
    size = max(len(v) for v in by_host.values())
    for ranks in by_host.values():
        if min(ranks) % size or max(ranks) - min(ranks) >= size:
            return None
    return size


_CHILD_FAILED = re.compile(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)")


_NODE_TOKENS = re.compile(r"(?:node[_-]rank|group_rank|NODE_RANK|SLURM_NODEID)\W{1,4}[1-9]|--nnodes[= ]?[2-9]")


def _one_node_agent(texts: list[tuple[PurePath, str]], diagnosis: dict[str, Any]) -> bool:
    """One torchelastic agent's output and nothing of a second node (no second host, no srun label, no node rank
    above 0, ChildFailedError's rank == local_rank): a one-node job, whose local ranks are its global ranks."""
    pairs = [(int(m[1]), int(m[2])) for _, text in texts for m in _CHILD_FAILED.finditer(text)]
    hosts = {row.get("host") for row in diagnosis.get("ranks", [])}
    hosts |= {strip_prefixes(line).host for _, text in texts for line in text.split("\n")[:5000]}
    return all(r == local for r, local in pairs) and len(hosts - {None}) <= 1 and not any(
        _is_srun_labelled(text) or _NODE_TOKENS.search(text) for _, text in texts)


def world_size(facts: CaseFacts) -> int:
    """The job's size: the largest size the logs or the label state (nranks, world_size, rank R/W), else one more
    than the highest rank any token names. A rank at or above a stated size is invalid and stays as it is."""
    identity = RankMap({}, {}, 1, False)
    seen: list[int] = [r["rank"] for r in facts.diagnosis.get("ranks", [])]
    claims: list[int] = [facts.label["world_size"]] if isinstance(facts.label.get("world_size"), int) else []
    for rel in facts.files:
        text = facts.text(rel)
        labelled = _is_srun_labelled(text)
        for line in text.split("\n"):
            rewrite_rank_line(line, identity, labelled, seen)
        claims += [int(n) for m in _WORLD_CLAIMS.finditer(text) for n in m.groups() if n]
    if facts.label.get("first_failing_rank") is not None:
        seen.append(facts.label["first_failing_rank"])
    stated = [c for c in claims if 0 < c < 4096]
    return max(stated) if stated else max([r + 1 for r in seen if r < 4096] + [1])


def rank_layout(facts: CaseFacts) -> RankLayout:
    texts = [(rel, facts.text(rel)) for rel in facts.files]
    world = world_size(facts)
    per_node: list[int] = []
    local_only = ""
    for rel, text in texts:
        per_node += [int(m[1]) for pattern in _PER_NODE_CLAIMS for m in pattern.finditer(text)]
        found = _LOCAL_ONLY.search(text)
        local_only = local_only or (found[0] if found else "")
        local_only = local_only or (str(rel) if path_info(rel).local_rank is not None else "")
    per = per_node[0] if per_node else _per_node_from_hosts(facts.diagnosis)
    per = per or agent_workers_per_node(text for _, text in texts)
    if per is None and _one_node_agent(texts, facts.diagnosis):
        locals_seen = [int(m[1]) for _, text in texts for m in re.finditer(r"local_rank:? (\d+) \(pid", text)]
        world = per = max([world, *(n + 1 for n in locals_seen)])
    if per is None:
        if local_only:
            raise Unsupported(f"ranks per node unknown and the case has local-rank tokens ({local_only})")
        per = 1
    tasks_are_nodes = any(_TORCHRUN.search(text) for _, text in texts)
    return RankLayout(world=world, per_node=per, tasks_are_nodes=tasks_are_nodes, local_only=local_only)


NO_PERMUTATION = "no other permutation keeps rank 0 and the job's shape"


def rank_permutation(layout: RankLayout) -> RankMap:
    """Reverse the nodes after node 0 (locals kept); on 1-2 nodes reverse the local ranks instead (rank 0 kept)."""
    world, per = layout.world, layout.per_node
    world = -(-world // per) * per  # the highest rank seen may sit on a node whose later ranks the logs never name
    n_nodes = world // per
    if n_nodes >= 3:
        nodes = {n: (n_nodes - n if n else 0) for n in range(n_nodes)}
        ranks = {r: nodes[r // per] * per + r % per for r in range(world)}
    else:  # local ranks change: every local-rank token must tell its node (RankMap.local refuses otherwise)
        nodes = {n: n for n in range(n_nodes)}
        ranks = {}
        for n in range(n_nodes):
            locals_ = list(range(per)) if n else list(range(1, per))
            for old, new in zip(locals_, reversed(locals_), strict=True):
                ranks[n * per + old] = n * per + new
        ranks[0] = 0
    if all(k == v for k, v in ranks.items()):
        raise Unsupported(f"{world} rank(s): {NO_PERMUTATION}")
    return RankMap(ranks=ranks, nodes=nodes, per_node=per, tasks_are_nodes=layout.tasks_are_nodes,
                   locals_change=n_nodes < 3)


_FILE_TASK = re.compile(r"^(?P<pre>\d+(?:_\d+)?_)(?P<t>\d+)(?=_(?:log\.(?:out|err)|result\.pkl|submitted\.pkl)$)")
_FILE_RANK = re.compile(r"^(?P<pre>rank_)(?P<r>\d+)(?=\.start\.json$|\.exit\.json$|\.log$|\.out$|\.err$|$)")


def _rename_rank_path(rel: PurePath, rmap: RankMap, node: int | None) -> PurePath:
    name = _FILE_TASK.sub(lambda m: m["pre"] + str(rmap.task(int(m["t"]))), rel.name)
    name = _FILE_RANK.sub(lambda m: m["pre"] + str(rmap.rank(int(m["r"]))), name)
    local = path_info(rel).local_rank
    if local is None:
        return rel.with_name(name)
    parts = list(rel.parts[:-1])  # torchrun --log-dir: <run>/attempt_N/<local_rank>/<file>
    at = max(i for i, part in enumerate(parts) if re.fullmatch(r"attempt_\d+", part)) + 1
    parts[at] = parts[at].replace(str(local), str(rmap.local(node, local, str(rel))))
    return PurePath(*parts, name)


_OWN_RANK = re.compile(r"comm \S+ rank (\d+) nranks")


def _writer_node(rel: PurePath, text: str, rmap: RankMap) -> int | None:
    """The node whose process wrote a file, where its name or its own-rank lines tell it."""
    task, rank = _FILE_TASK.match(rel.name), _FILE_RANK.match(rel.name)
    if task and rmap.tasks_are_nodes:
        return int(task["t"])
    if rank:
        return int(rank["r"]) // rmap.per_node
    own = {int(m[1]) for m in _OWN_RANK.finditer(text)}
    prefixes = map(strip_prefixes, text.split("\n")[:2000])
    own |= {p.rank for p in prefixes if p.rank is not None and not p.rank_from_label}
    nodes = {r // rmap.per_node for r in own}
    return nodes.pop() if len(nodes) == 1 else None


def _tree_nodes(facts: CaseFacts, rmap: RankMap) -> dict[PurePath, int | None]:
    """torchrun --log-dir: the node of each agent's tree (<run>/attempt_N/...), from its files' own ranks."""
    found: dict[PurePath, set[int | None]] = {}
    for rel in facts.files:
        if path_info(rel).local_rank is None:
            continue
        tree = PurePath(*rel.parts[:[i for i, p in enumerate(rel.parts) if p.startswith("attempt_")][-1]])
        found.setdefault(tree, set()).add(_writer_node(rel, facts.text(rel), rmap))
    return {tree: (nodes - {None}).pop() if len(nodes - {None}) == 1 else None for tree, nodes in found.items()}


_BLOCK_RANK = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)")
_BLOCK_PID = re.compile(r"\(pid: (\d+)\)|received by PID (\d+)")


def writers_of(facts: CaseFacts, per_node: int) -> Writers:
    """Host -> node from lines that carry both a host and a global rank; pid -> rank from ChildFailedError blocks."""
    host_nodes: dict[str, set[int]] = {}
    pid_ranks: dict[int, int] = {}
    for rel in facts.files:
        block_rank, block_left = None, 0
        for line in facts.text(rel).split("\n"):
            prefix = strip_prefixes(line)
            own = _OWN_RANK.search(line)
            host = nccl_head_host(line) or prefix.host
            rank = int(own[1]) if own else prefix.rank if not prefix.rank_from_label else None
            if host and rank is not None:
                host_nodes.setdefault(host, set()).add(rank // per_node)
            found = _BLOCK_RANK.search(line)
            block_rank, block_left = (int(found[1]), 5) if found else (block_rank, block_left - 1)
            for m in _BLOCK_PID.finditer(line):
                if block_rank is not None and block_left > 0:
                    pid_ranks[int(m[1] or m[2])] = block_rank
    nodes = {host: ns.pop() for host, ns in host_nodes.items() if len(ns) == 1}
    return Writers(host_nodes=nodes, pid_ranks=pid_ranks)


_AGENT_PID = re.compile(r"Sending process (\d+) closing signal|failed \(exitcode: -?\d+\) local_rank: \d+ "
                        r"\(pid: (\d+)\)")
_GLOG_AGENT = re.compile(r"^[IWEF]\d{4} [\d:.]+ (\d+) ")


def agent_workers_per_node(texts: Iterable[str]) -> int | None:
    """Workers per node from torchelastic agents: the pids one agent SIGTERMs plus the one that failed."""
    groups: dict[str, set[int]] = {}
    run = 0
    for text in texts:
        for line in text.split("\n"):
            prefix = strip_prefixes(line)
            m = _AGENT_PID.search(prefix.text)
            if not m:
                run += 1
                continue
            glog = _GLOG_AGENT.match(prefix.text)
            key = prefix.host or (glog[1] if glog else f"run{run}")
            groups.setdefault(key, set()).add(int(m[1] or m[2]))
    sizes = [len(pids) for pids in groups.values()]
    return max(sizes) if sizes and max(sizes) >= 2 else None


def _node_of(rel: PurePath, text: str, rmap: RankMap, trees: dict[PurePath, int | None]) -> int | None:
    for tree, node in trees.items():
        if rel.parts[: len(tree.parts)] == tree.parts:
            return node
    return _writer_node(rel, text, rmap)


def _fix_record_local_rank(text: str, rmap: RankMap) -> str:
    """A record's local_rank follows its (already mapped) rank."""
    rank = re.search(r'"rank": (\d+)', text)
    if not rank:
        return text
    local = int(rank[1]) % rmap.per_node
    return re.sub(r'"local_rank": \d+', f'"local_rank": {local}', text)


def renumber_ranks(facts: CaseFacts, dest: Path) -> Perturbed:
    """Every rank-bearing token, file name and record mapped through one shape-keeping permutation."""
    rmap = rank_permutation(rank_layout(facts))
    trees = _tree_nodes(facts, rmap)
    nodes = {rel: _node_of(rel, facts.text(rel), rmap, trees) for rel in facts.files}
    writers = writers_of(facts, rmap.per_node) if rmap.locals_change else None

    def text_fn(rel: PurePath, text: str) -> str:
        labelled = _is_srun_labelled(text)
        text = "\n".join(rewrite_rank_line(line, rmap, labelled, node=nodes[rel], writers=writers)
                         for line in text.split("\n"))
        return _fix_record_local_rank(text, rmap) if rel.suffix == ".json" else text

    root = write_copy(facts, dest, text_fn, lambda rel: _rename_rank_path(rel, rmap, nodes[rel]))
    return Perturbed(root=root, label=_map_label(facts.label, rank=rmap.rank))


# ---------------------------------------------------------------- clocks

_ISO = re.compile(r"(?<!\d)(?P<y>(?:19|20)\d\d)-(?P<mo>[01]\d)-(?P<d>[0-3]\d)(?P<sep>[T _])"
                  r"(?P<h>[0-2]\d):(?P<mi>[0-5]\d):(?P<s>[0-6]\d)(?:(?P<fs>[.,])(?P<frac>\d{1,9}))?"
                  r"(?P<tz> ?(?:Z|[+-][01]\d:?[0-5]\d))?(?!\d)")  # a collector's offset may follow a space
_GLOG = re.compile(r"(?<![\w])(?P<lvl>[IWEF])(?P<mo>1[0-2]|0?[1-9])(?P<d>[0-3]\d) (?P<h>[0-2]\d):(?P<mi>[0-5]\d):"
                   r"(?P<s>[0-6]\d)(?:\.(?P<frac>\d{1,9}))?(?P<tid> +\d+)?")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_CTIME = re.compile(rf"(?:{'|'.join(_DAYS)}) (?P<mon>{'|'.join(_MONTHS)}) (?P<d> ?\d{{1,2}}) "
                    r"(?P<h>[0-2]\d):(?P<mi>[0-5]\d):(?P<s>[0-6]\d)(?P<zone> [A-Z]{3,4})? (?P<y>(?:19|20)\d\d)")
_SYSLOG = re.compile(rf"^(?P<mon>{'|'.join(_MONTHS)}) (?P<d>[ 0-3]\d) (?P<h>[0-2]\d):(?P<mi>[0-5]\d):(?P<s>[0-6]\d)")
_EPOCH_FIELD = re.compile(r'(?P<key>"(?:\w*unix\w*|timestamp)"\s*:\s*"?)(?P<v>1\d{9}(?:\.\d+)?)')
_TIME_KEYS = ("time", "unix", "timestamp", "submit_time", "submit_unix", "start_time", "end_time")
#: 40 days 7 hours: crosses at least one month boundary (and a year for December jobs).
CLOCK_SHIFT = 40 * 86400 + 7 * 3600


def _moved(y: int, mo: int, d: int, h: int, mi: int, s: int, delta: float, frac: str | None = None
           ) -> tuple[dt.datetime, str]:
    """The moment plus `delta`, and its fraction written with the original's digits (exact for whole deltas)."""
    whole = int(delta // 1)
    part = delta - whole
    fraction = _frac(frac) + part
    carry = int(fraction // 1)
    moment = dt.datetime(y, mo, d, h, mi, min(s, 59)) + dt.timedelta(seconds=whole + carry)
    if not frac:
        return moment, ""
    return moment, frac if not part else f"{fraction - carry:.9f}"[2:2 + len(frac)]


def _frac(text: str | None) -> float:
    return float("0." + text) if text else 0.0


def shift_line(line: str, delta: float, year: int) -> str:
    """Every timestamp of a line moved by `delta` seconds, in its own format."""

    def iso(m: re.Match[str]) -> str:
        t, frac = _moved(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), delta,
                         m["frac"])
        return f"{t:%Y-%m-%d}{m['sep']}{t:%H:%M:%S}{m['fs'] + frac if frac else ''}{m['tz'] or ''}"

    def glog(m: re.Match[str]) -> str:
        t, frac = _moved(year, int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), delta, m["frac"])
        month = f"{t.month:02d}" if len(m["mo"]) == 2 else str(t.month)
        return f"{m['lvl']}{month}{t:%d %H:%M:%S}{'.' + frac if frac else ''}{m['tid'] or ''}"

    def ctime(m: re.Match[str]) -> str:
        t, _ = _moved(int(m["y"]), _MONTHS.index(m["mon"]) + 1, int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                      delta)
        day = str(t.day).rjust(len(m["d"]))
        return f"{_DAYS[t.weekday()]} {_MONTHS[t.month - 1]} {day} {t:%H:%M:%S}{m['zone'] or ''} {t.year}"

    def syslog(m: re.Match[str]) -> str:
        t, _ = _moved(year, _MONTHS.index(m["mon"]) + 1, int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), delta)
        return f"{_MONTHS[t.month - 1]} {t.day:02d} {t:%H:%M:%S}" if m["d"][0] != " " else f"{t:%b} {t.day:2d} {t:%X}"

    def epoch(m: re.Match[str]) -> str:
        decimals = len(m["v"].partition(".")[2])
        return m["key"] + (f"{float(m['v']) + delta:.{decimals}f}" if decimals else str(int(float(m["v"]) + delta)))

    line = _CTIME.sub(ctime, line)
    line = _ISO.sub(iso, line)
    line = _GLOG.sub(glog, line)
    line = _SYSLOG.sub(syslog, line)
    return _EPOCH_FIELD.sub(epoch, line)


def _case_year(facts: CaseFacts) -> int:
    for rel in facts.files:
        m = _ISO.search(facts.text(rel))
        if m:
            return int(m["y"])
    return dt.datetime.now(dt.timezone.utc).year


def _who(rel: PurePath, line: str) -> str:
    """Whose clock wrote a line: the NCCL or pdsh host, else the rank, else the file."""
    head = re.search(r"(?:^|\s)([A-Za-z][\w.-]*):\d+:\d+ \[\d+\] ", line)
    if head:
        return head[1].split(".")[0]
    prefix = strip_prefixes(line)
    if prefix.host or prefix.rank is not None:
        return prefix.host or f"rank{prefix.rank}"
    host = re.search(r'"host": "([^"]+)"', line)
    return host[1] if host else str(rel)


def _skew(who: str) -> float:
    """A stable per-writer clock skew below half a second."""
    return (sum(ord(c) * 31 ** i for i, c in enumerate(who)) % 450) / 1000.0


def shift_clocks(facts: CaseFacts, dest: Path, skew: bool = False) -> Perturbed:
    """Every timestamp moved by the same delta (crossing a month); with `skew`, plus a per-host offset < 0.5 s."""
    year = _case_year(facts)

    def text_fn(rel: PurePath, text: str) -> str:
        json_host = re.search(r'"host": "([^"]+)"', text) if rel.suffix == ".json" else None
        out = []
        for line in text.split("\n"):
            who = json_host[1] if json_host else _who(rel, line)
            out.append(shift_line(line, CLOCK_SHIFT + (_skew(who) if skew else 0.0), year))
        return "\n".join(out)

    return Perturbed(root=write_copy(facts, dest, text_fn), label=dict(facts.label))


def _drop_json_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_json_times(v) for k, v in value.items() if k not in _TIME_KEYS}
    if isinstance(value, list):
        return [_drop_json_times(v) for v in value]
    return value


_ISO_WRAPPED = re.compile(rf"[\[(]?{_ISO.pattern}[\])]?:?(?: - | )?")


def drop_line_times(line: str) -> str:
    """A line without its timestamps (Slurm's `CANCELLED AT ts` is message content and stays)."""
    if "CANCELLED AT" in line:
        return line
    line = _CTIME.sub("", line)
    line = _SYSLOG.sub("", line).lstrip(" ") if _SYSLOG.match(line) else line
    line = _ISO_WRAPPED.sub("", line)
    return _GLOG.sub(lambda m: m["lvl"], line)


def drop_timestamps(facts: CaseFacts, dest: Path) -> Perturbed:
    """Every timestamp stripped (prefixes, NCCL_DEBUG_TIMESTAMP, glog headers, record times)."""

    def text_fn(rel: PurePath, text: str) -> str:
        if rel.suffix == ".json":
            try:
                return json.dumps(_drop_json_times(json.loads(text)), indent=1)
            except ValueError:
                return text
        return by_line(drop_line_times)(text)

    return Perturbed(root=write_copy(facts, dest, text_fn), label=dict(facts.label), rank_may_be_null=True)


# ---------------------------------------------------------------- benign noise

_NCCL_HEAD = re.compile(r"(?P<head>[A-Za-z][\w.-]*:\d+:\d+ \[\d+\]) NCCL INFO (?:comm \S+ rank (?P<rank>\d+) nranks)?")


def _c10d_retry(master: str) -> list[str]:
    line = (f"[W socket.cpp:663] [c10d] The client socket has failed to connect to [{master}]:29500 "
            "(errno: 111 - Connection refused).")
    return [line, line]


def _ib_fallback(head: str) -> list[str]:
    return [f"{head} misc/ibvwrap.cc:106 NCCL WARN Failed to open libibverbs.so[.1]",
            f"{head} NCCL INFO NET/IB : No device found.",
            f"{head} NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>"]


def _progress(steps: Iterable[int]) -> list[str]:
    return [f"step {s} loss {2.3 - s / 10000:.4f}" for s in steps]


def _nccl_heads(texts: dict[PurePath, str]) -> tuple[dict[int, str], dict[PurePath, str]]:
    """`host:pid:tid [dev]` per rank (from Init lines) and per file (its first NCCL line)."""
    by_rank: dict[int, str] = {}
    by_file: dict[PurePath, str] = {}
    for rel, text in texts.items():
        for m in _NCCL_HEAD.finditer(text):
            by_file.setdefault(rel, m["head"])
            if m["rank"] is not None:
                by_rank.setdefault(int(m["rank"]), m["head"])
    return by_rank, by_file


def _rank_streams(rel: PurePath, lines: list[str], tasks_are_nodes: bool) -> dict[int, tuple[int, str]]:
    """rank -> (index of its first line, that line's prefix) in one file; index -1 = the whole file is the rank's."""
    info = path_info(rel)
    if info.rank is not None and not (info.task_file and tasks_are_nodes):
        return {info.rank: (-1, "")}
    streams: dict[int, tuple[int, str]] = {}
    for i, line in enumerate(lines):
        prefix = strip_prefixes(line)
        if prefix.rank is not None and prefix.rank not in streams and prefix.text.strip():
            streams[prefix.rank] = (i, line[: len(line) - len(prefix.text)])
    if info.task_file and tasks_are_nodes and info.rank == 0 and 0 not in streams:
        streams[0] = (-1, "")  # torchrun's node 0: rank 0's lines carry no prefix
    return streams


def _noise_for_file(rel: PurePath, text: str, ctx: dict[str, Any]) -> str:
    lines = text.split("\n")
    streams = _rank_streams(rel, lines, ctx["tasks_are_nodes"])
    inserts: dict[int, list[str]] = {}
    for rank, (index, prefix) in streams.items():
        head = ctx["heads_by_rank"].get(rank) or (ctx["heads_by_file"].get(rel) if index < 0 else None)
        body = (_c10d_retry(ctx["master"]) if rank else []) + (_ib_fallback(head) if head and ctx["has_nccl"] else [])
        if rank == 0:
            body += _progress((100, 200))
        # after the rank's first line (its banner), unless that line is already its failure (a one-line paste)
        at = index + 1 if index >= 0 and index + 1 not in ctx["decisive"].get(rel, ()) else max(index, 0)
        inserts.setdefault(at, []).extend(prefix + b for b in body)
        if rank == 0 and ctx["late_progress"]:
            end = len(lines) - 1 if lines[-1] == "" else len(lines)  # before the final newline's empty tail
            after = max([index] + [n - 1 for n in ctx["decisive"].get(rel, [])]) + 1 if index >= 0 else end
            late = [prefix + b for b in _progress((300, 400, 500))]
            inserts.setdefault(min(after, end), []).extend(late)
    out: list[str] = []
    for i, line in enumerate([*lines, None]):
        out.extend(inserts.get(i, []))
        if line is not None:
            out.append(line)
    return "\n".join(out)


def _decisive_lines(facts: CaseFacts) -> dict[PurePath, list[int]]:
    """The original diagnosis' evidence lines (1-based) per case file."""
    found: dict[PurePath, list[int]] = {}
    for ev in facts.diagnosis.get("evidence", []):
        path = Path(str(ev.get("file")))
        try:
            rel = path.resolve().relative_to(facts.root.resolve())
        except ValueError:
            continue
        if isinstance(ev.get("line"), int):
            found.setdefault(PurePath(rel), []).append(ev["line"])
    return found


def benign_noise(facts: CaseFacts, dest: Path) -> Perturbed:
    """On every rank's log at start-up: a retried c10d refusal, NCCL's IB fallback WARN; progress on rank 0 only."""
    texts = {rel: facts.text(rel) for rel in facts.files if not is_record(rel)}
    heads_by_rank, heads_by_file = _nccl_heads(texts)
    rank0_host = next((r.get("host") for r in facts.diagnosis.get("ranks", []) if r.get("rank") == 0), None)
    ctx = {"tasks_are_nodes": any(_TORCHRUN.search(t) for t in texts.values()),
           "heads_by_rank": heads_by_rank, "heads_by_file": heads_by_file, "has_nccl": bool(heads_by_file),
           "master": rank0_host or "127.0.0.1", "decisive": _decisive_lines(facts),
           "late_progress": facts.label.get("first_failing_rank") not in (None, 0)}

    def text_fn(rel: PurePath, text: str) -> str:
        return text if is_record(rel) or rel.suffix in (".sh", ".json") else _noise_for_file(rel, text, ctx)

    return Perturbed(root=write_copy(facts, dest, text_fn), label=dict(facts.label))


# ---------------------------------------------------------------- benign library

#: tests/corpus/benign/: lines healthy runs print, one family per file (its README.md says the format).
BENIGN_DIR = Path(__file__).resolve().parent / "benign"
BENIGN_LINES = 4  # records injected into every rank's log
#: the library's hosts: gpu-a01 is the writer's, gpu-a00 rank 0's (the MASTER_ADDR)
_LIB_HOST = re.compile(r"(?<![\w.])gpu-a0(?P<which>[01])(?![A-Za-z0-9-])")
_LIB_HEAD = re.compile(r"(?<![\w.-])gpu-a01:\d+:\d+ \[\d+\]")
_ANY_HEAD = re.compile(r"(?:^|\s)(?P<head>[A-Za-z][\w.-]*:\d+:\d+ \[\d+\]) ")
_OWN_RANK_TAG = re.compile(r"^\[rank0\]:")
_RANK_TAG = re.compile(r"\[[Rr]ank ?\d+\]:")
#: Not a rank's log: kernel and daemon logs, the hang monitor's stacks, scripts and binary records.
_NOT_A_RANK_LOG = re.compile(r"(?:^|/)(?:dmesg|journal|kernel|slurmd|slurmctld)|\.stacks\.txt$|\.(?:sh|json|pkl)$")
#: Where a rank's failure starts (no benign line goes after it): its first line of these, or of the original
#: diagnosis' evidence. Coarse on purpose: stopping early only narrows where lines go.
_FAILURE_HINT = re.compile(
    r"Traceback \(most recent call last\)|^\s*[\w.]*(?:Error|Exception|Interrupt)\b[:(]|NCCL WARN|[Ww]atchdog|CANCELL"
    r"|Killed|SIG(?:TERM|KILL|SEGV|ABRT|BUS|USR)|[Ss]egmentation fault|exit ?code|[Tt]imed out|[Tt]imeout|NCCL error"
    r"|nccl\w*Error|out of memory|Xid|ECC|ChildFailedError|\bfailed\b|FAILED|[Ee]rror:|ended: |terminated")
#: Causes of a job whose rendezvous may never have completed: an agent's store-bind notice (`# writer:
#: torchrun-agent`) is benign only where the workers then ran, and in such a job it may be what went wrong.
RENDEZVOUS_NEVER_COMPLETED = ("rendezvous_timeout", "network_unreachable", "port_in_use")
#: Launchers a record may name; such a record goes only into a job whose logs show the same launcher.
_LAUNCHERS = {"torchrun": _TORCHRUN, "submitit": re.compile(r"submitit")}
#: what names a launcher in a benign record: its marks in a case's text, and torchrun's modules by the source path a
#: glog-style line names them by (`torch/distributed/elastic/agent/server/api.py:525]`), which the analyzer reads as
#: a torchrun agent's line (parse.line_streams.TORCHRUN): such a record goes only into a job launched so
_RECORD_LAUNCHERS = {**_LAUNCHERS, "torchrun": re.compile(
    _TORCHRUN.pattern + r"|torch/distributed/(?:run|elastic|launch)")}
_BLOCK_OPENERS = ("Traceback (most recent call last):", "During handling of the above exception",
                  "The above exception was the direct cause")


@dataclass(frozen=True)
class BenignRecord:
    """One or more lines a process prints together, from one family file of the library."""

    family: str
    lines: tuple[str, ...]
    writer: str = ""  # `# writer: store-host` (rank 0, or a torchrun job) or `torchrun-agent` (a torchrun job)


def load_benign_library(folder: Path = BENIGN_DIR) -> tuple[BenignRecord, ...]:
    """Every record of every `*.txt` family file: `---` lines separate records where a file has them, else one a
    line; the leading `#` lines are the file's sources (`# writer: W` among them says who prints them); blank lines
    around records are dropped, inner ones kept."""
    records: list[BenignRecord] = []
    for path in sorted(folder.glob("*.txt")):
        lines = path.read_bytes().decode("utf-8", errors="surrogateescape").split("\n")
        writer = ""
        while lines and lines[0].startswith("#"):
            if lines[0].startswith("# writer: "):
                writer = lines[0][len("# writer: "):].strip()
            lines.pop(0)
        if "---" in lines:
            groups: list[list[str]] = [[]]
            for line in lines:
                if line == "---":
                    groups.append([])
                else:
                    groups[-1].append(line)
        else:
            groups = [[line] for line in lines]
        for group in groups:
            while group and not group[0].strip():
                group.pop(0)
            while group and not group[-1].strip():
                group.pop()
            if group:
                records.append(BenignRecord(family=path.stem, lines=tuple(group), writer=writer))
    return tuple(records)


@dataclass
class _Stream:
    """One writer's lines in one file: a rank (prefixed lines, or the whole file), a host, or the file itself."""

    key: Any
    rank: int | None
    host: str | None
    indices: list[int] = field(default_factory=list)  # its lines' indices in the file
    head: str | None = None  # the `host:pid:tid [dev]` its NCCL lines carry
    #: whether a torchrun agent writes these lines: not a worker's own file or prefix (an agent's lines are bare)
    agent_lines: bool = False


def _benign_streams(rel: PurePath, lines: list[str], ctx: dict[str, Any]) -> list[_Stream]:
    info = path_info(rel)
    end = len(lines) - 1 if lines and lines[-1] == "" else len(lines)
    host_of = ctx["rank_hosts"]
    if info.rank is not None and not (info.task_file and ctx["tasks_are_nodes"]):
        streams = [_Stream(("rank", info.rank), info.rank, host_of.get(info.rank) or info.host, list(range(end)))]
    else:
        keyed: dict[Any, _Stream] = {}
        loose: list[int] = []
        for i in range(end):
            if not lines[i].strip():
                continue
            p = strip_prefixes(lines[i])
            if p.rank is not None and not (p.rank_from_label and ctx["tasks_are_nodes"]):
                key, rank, host = ("rank", p.rank), p.rank, host_of.get(p.rank) or p.host
            elif p.rank is not None:  # `N: ` of srun under torchrun: node N's agent, no rank
                key, rank, host = ("task", p.rank), None, p.host
            elif p.host:
                key, rank, host = ("host", p.host), None, p.host
            else:
                loose.append(i)
                continue
            keyed.setdefault(key, _Stream(key, rank, host)).indices.append(i)
        if keyed and info.task_file and ctx["tasks_are_nodes"] and info.rank == 0 and ("rank", 0) not in keyed:
            keyed[("rank", 0)] = _Stream(("rank", 0), 0, host_of.get(0), loose,  # torchrun's node 0: rank 0 bare
                                         agent_lines=True)
        streams = list(keyed.values()) if keyed else [_Stream(None, None, info.host, loose)]
        for stream in streams:
            stream.agent_lines = stream.agent_lines or stream.rank is None
    for stream in streams:
        head = next((m["head"] for i in stream.indices if (m := _ANY_HEAD.search(lines[i]))), None)
        stream.head = head or (ctx["heads_by_rank"].get(stream.rank) if stream.rank is not None else None)
    return streams


def _insert_points(stream: _Stream, lines: list[str], cut: int) -> list[int]:
    """Positions j in the stream (insert before its j-th line; len = after its last) up to `cut` that split no
    block: the line after is not indented, the line before opens nothing (`...:`, a traceback header)."""
    texts = [strip_prefixes(lines[i]).text for i in stream.indices]
    points = []
    for j in range(cut + 1):
        if j < len(texts) and texts[j][:1] in (" ", "\t"):
            continue
        if j > 0 and (texts[j - 1].rstrip().endswith((":", "\\")) or texts[j - 1].startswith(_BLOCK_OPENERS)):
            continue
        points.append(j)
    return points or [0]


def _neighbour_time(stream: _Stream, lines: list[str], j: int, year: int) -> tuple[float, bool] | None:
    """The time of the stream's nearest timed line before position j (True), else after it (False)."""
    from ddpslurm.analyze.parse.timestamps import parse_time

    order = list(range(j - 1, max(-1, j - 400), -1)) + list(range(j, min(len(stream.indices), j + 400)))
    for k in order:
        found = parse_time(lines[stream.indices[k]][:200], year)
        if found:
            return found[0], k < j
    return None


def _adapt_record(record: BenignRecord, stream: _Stream, prefix: str, when: tuple[float, bool] | None,
                  ctx: dict[str, Any]) -> list[str] | None:
    """The record as this stream's writer prints it, or None where the stream lacks what it names."""
    from ddpslurm.analyze.parse.timestamps import parse_time

    text = "\n".join(record.lines)
    if any(mark.search(text) and name not in ctx["launchers"] for name, mark in _RECORD_LAUNCHERS.items()):
        return None
    torchrun = "torchrun" in ctx["launchers"]
    if (record.writer == "store-host" and not (torchrun or stream.rank == 0)) or \
            (record.writer == "torchrun-agent" and
             not (torchrun and stream.agent_lines and not ctx["rendezvous_failed"])):
        return None
    if stream.rank:  # on the library's own tokens, before hosts and heads of the case come in
        rmap = RankMap(ranks={0: stream.rank}, nodes={}, per_node=1, tasks_are_nodes=False)
        text = "\n".join(rewrite_rank_line(line, rmap, srun_label=False) for line in text.split("\n"))
    if _LIB_HEAD.search(text):
        if stream.head is None:
            return None
        text = _LIB_HEAD.sub(lambda m: stream.head or "", text)
    hosts = {"1": stream.host, "0": ctx["rank_hosts"].get(0)}
    if any(hosts[m["which"]] is None for m in _LIB_HOST.finditer(text)):
        return None
    text = _LIB_HOST.sub(lambda m: hosts[m["which"]] or "", text)
    out = text.split("\n")
    if _RANK_TAG.search(prefix):  # the prefix carries torch's own `[rankN]:` already (torchrun --tee)
        out = [_OWN_RANK_TAG.sub("", line) for line in out]
    stamped = next((found[0] for line in out if (found := parse_time(line[:200], ctx["year"]))), None)
    if stamped is not None and when is not None:  # whole seconds (fractions kept): not before the line before it
        delta = math.ceil(when[0] - stamped) if when[1] else math.floor(when[0] - stamped)
        out = [shift_line(line, delta, ctx["year"]) for line in out]
    elif stamped is not None:
        out = [drop_line_times(line) for line in out]
    return [prefix + line for line in out]


def _failure_cut(stream: _Stream, lines: list[str], decisive: set[int]) -> int:
    for j, i in enumerate(stream.indices):
        if i in decisive or _FAILURE_HINT.search(strip_prefixes(lines[i]).text):
            return j
    return len(stream.indices)


def _library_for_file(rel: PurePath, text: str, ctx: dict[str, Any], rng: Any, manifest: list[dict[str, Any]] | None
                      ) -> str:
    lines = text.split("\n")
    decisive = {n - 1 for n in ctx["decisive"].get(rel, [])}
    inserts: dict[int, list[tuple[str, BenignRecord | None, int]]] = {}
    for stream in _benign_streams(rel, lines, ctx):
        points = _insert_points(stream, lines, _failure_cut(stream, lines, decisive))
        for _ in range(ctx["n"]):
            j = rng.choice(points)
            at = stream.indices[j] if j < len(stream.indices) else (
                stream.indices[-1] + 1 if stream.indices else (len(lines) - 1 if lines[-1] == "" else len(lines)))
            near = stream.indices[min(j, len(stream.indices) - 1)] if stream.indices else None
            prefix = "" if near is None else lines[near][: len(lines[near]) - len(strip_prefixes(lines[near]).text)]
            when = _neighbour_time(stream, lines, j, ctx["year"]) if stream.indices else None
            for _attempt in range(30):
                record = ctx["pick"](rng)
                adapted = _adapt_record(record, stream, prefix, when, ctx)
                if adapted is not None:
                    inserts.setdefault(at, []).extend((line, record, k) for k, line in enumerate(adapted))
                    break
    out: list[str] = []
    for i, line in enumerate([*lines, None]):
        for new, record, k in inserts.get(i, []):
            out.append(new)
            if manifest is not None and record is not None:
                manifest.append({"file": str(rel), "line": len(out), "family": record.family,
                                 "record": record.lines[0], "part": k, "text": new})
        if line is not None:
            out.append(line)
    return "\n".join(out)


def benign_library(facts: CaseFacts, dest: Path, n: int = BENIGN_LINES, seed: int = 0,
                   library: tuple[BenignRecord, ...] | None = None,
                   manifest: list[dict[str, Any]] | None = None) -> Perturbed:
    """`n` records of tests/corpus/benign/ in every rank's log, at random places before the rank's failure, each as
    that rank prints it (its prefix, host, NCCL head, rank, clock). Deterministic: seeded by the case name and `seed`;
    the family first (uniform), then a record of it. `manifest` (a list) receives one entry per injected line."""
    import random

    library = library if library is not None else load_benign_library()
    families: dict[str, list[BenignRecord]] = {}
    for record in library:
        families.setdefault(record.family, []).append(record)
    names = sorted(families)
    texts = {rel: facts.text(rel) for rel in facts.files if not is_record(rel)}
    heads_by_rank, _ = _nccl_heads(texts)
    rank_hosts = {row["rank"]: row["host"] for row in facts.diagnosis.get("ranks", [])
                  if isinstance(row.get("rank"), int) and isinstance(row.get("host"), str)}
    ctx = {"tasks_are_nodes": any(_TORCHRUN.search(t) for t in texts.values()), "heads_by_rank": heads_by_rank,
           "launchers": {name for name, mark in _LAUNCHERS.items()
                         if any(mark.search(t) or mark.search(str(rel)) for rel, t in texts.items())},
           "rank_hosts": rank_hosts, "decisive": _decisive_lines(facts), "year": _case_year(facts), "n": n,
           "rendezvous_failed": facts.diagnosis.get("cause") in RENDEZVOUS_NEVER_COMPLETED
           or not facts.diagnosis.get("ranks"),
           "pick": lambda rng: rng.choice(families[rng.choice(names)])}
    rng = random.Random(f"benign_library:{facts.root.name}:{seed}")

    def text_fn(rel: PurePath, text: str) -> str:
        if is_record(rel) or _NOT_A_RANK_LOG.search(rel.as_posix()):
            return text
        return _library_for_file(rel, text, ctx, rng, manifest)

    return Perturbed(root=write_copy(facts, dest, text_fn), label=dict(facts.label))


# ---------------------------------------------------------------- records, truncation, split, merge

def delete_records(facts: CaseFacts, dest: Path) -> Perturbed:
    """ddpslurm's start/exit records and job record removed: the logs must say the same."""
    if not any(is_record(rel) and rel.name != "error.json" for rel in facts.files):
        raise Unsupported("no ddpslurm records")
    root = write_copy(facts, dest, lambda rel, text: None if is_record(rel) and rel.name != "error.json" else text)
    return Perturbed(root=root, label=dict(facts.label))


def truncate_tails(facts: CaseFacts, dest: Path, fraction: float = 0.10) -> Perturbed:
    """Each log's last 10% cut (mid-line), never past the original diagnosis' evidence lines."""
    decisive = _decisive_lines(facts)

    def text_fn(rel: PurePath, text: str) -> str:
        if is_record(rel) or rel.suffix in (".sh", ".json"):
            return text
        cut = int(len(text) * (1 - fraction))
        keep_lines = max(decisive.get(rel, [0]))
        if keep_lines:
            cut = max(cut, len("\n".join(text.split("\n")[:keep_lines])) + 1)
        return text[:cut]

    return Perturbed(root=write_copy(facts, dest, text_fn), label=dict(facts.label))


def _split_target(rel: PurePath, files: set[PurePath]) -> PurePath | None:
    """Where a log's second half can go and still be read as the same writer's."""
    if _FILE_TASK.match(rel.name):  # submitit: the task's other stream (appended to)
        return rel.with_name(rel.name[:-3] + ("err" if rel.name.endswith("out") else "out"))
    if path_info(rel).local_rank is not None and rel.name in ("stdout.log", "stderr.log"):  # torchrun --log-dir
        return rel.with_name("stderr.log" if rel.name == "stdout.log" else "stdout.log")
    if _FILE_RANK.match(rel.name):
        for suffix in (".err", ".out"):
            other = rel.with_name(rel.name.split(".")[0] + suffix)
            if other not in files:
                return other
        return None
    if path_info(rel).rank is None and path_info(rel).local_rank is None:
        return rel.with_name(f"{rel.stem}.part2{rel.suffix}")
    return None


def split_file(facts: CaseFacts, dest: Path) -> Perturbed:
    """The culprit's decisive log (else the largest) split in two files at its middle line."""
    files = set(facts.files)
    logs = [rel for rel in facts.files if not is_record(rel) and rel.suffix not in (".sh", ".json")]
    order = [rel for rel in _decisive_lines(facts) if rel in logs] + \
        sorted(logs, key=lambda r: -len(facts.text(r)))
    target = next(((rel, to) for rel in order if (to := _split_target(rel, files)) is not None), None)
    if target is None:
        raise Unsupported("no log whose second half can keep its writer's name")
    source, to = target
    lines = facts.text(source).split("\n")
    middle = len(lines) // 2
    head, tail = "\n".join(lines[:middle]) + "\n", "\n".join(lines[middle:])

    def text_fn(rel: PurePath, text: str) -> str:
        return head if rel == source else text

    extra = [(to, tail if tail.endswith("\n") or not tail else tail + "\n")]
    return Perturbed(root=write_copy(facts, dest, text_fn, extra=extra), label=dict(facts.label))


def _time_key(line: str, last: float) -> float:
    from ddpslurm.analyze.parse.timestamps import parse_time

    found = parse_time(line[:200])
    return found[0] if found else last


def merge_ranks(facts: CaseFacts, dest: Path, interleave: bool = False) -> Perturbed:
    """Per-rank (or per-task) logs merged into one slurm-J.out with `srun --label` prefixes, in time order.

    `interleave`: as ranks writing at once reach srun: the lines of one second (and the untimed lines after it) of
    different ranks alternate one by one, each rank's own lines in their order (tracebacks, NCCL's `Last error:`
    blocks and agents' reports of several ranks then cross). srun's and slurmstepd's own lines of that second come
    after the ranks' (they report tasks that ended)."""
    task_files = [rel for rel in facts.files if _FILE_TASK.match(rel.name)]
    rank_files = [rel for rel in facts.files if _FILE_RANK.match(rel.name) and not is_record(rel)]
    chosen = task_files or rank_files
    if len({_task_of(rel) for rel in chosen}) < 2:
        raise Unsupported("fewer than two per-rank logs to merge")
    width = len(str(max(_task_of(rel) for rel in chosen)))
    rows: list[tuple[float, bool, int, int, int, str]] = []
    for order, rel in enumerate(chosen):
        last = float("-inf")
        run = 0  # the line's place among its rank's lines of the same second
        for i, line in enumerate(facts.text(rel).split("\n")):
            if not line:
                continue
            key = _time_key(line, last)
            run = run + 1 if interleave and (key // 1 == last // 1 or key == last) else 0
            last = key
            slurm = interleave and line.startswith(("srun: ", "srun:", "slurmstepd"))
            rows.append((key // 1 if interleave else key, slurm, run, order, i,
                         f"{str(_task_of(rel)).rjust(width)}: {line}"))
    rows.sort(key=lambda row: row[:5])
    job = re.match(r"\d+", chosen[0].name)
    merged = PurePath(chosen[0].parent, f"slurm-{job[0] if job else 1}.out")
    extra = [(merged, "\n".join(row[5] for row in rows) + "\n")]
    root = write_copy(facts, dest, lambda rel, text: None if rel in chosen else text, extra=extra)
    return Perturbed(root=root, label=dict(facts.label))


def _task_of(rel: PurePath) -> int:
    m = _FILE_TASK.match(rel.name) or _FILE_RANK.match(rel.name)
    assert m is not None
    return int(m["t"] if "t" in m.groupdict() else m["r"])


# ---------------------------------------------------------------- the catalogue

PERTURBATIONS: dict[str, Callable[[CaseFacts, Path], Perturbed]] = {
    "rename_hosts": rename_hosts,
    "rename_hosts_fqdn": lambda facts, dest: rename_hosts(facts, dest, fqdn=".cluster.example.org"),
    "renumber_ranks": renumber_ranks,
    "shift_clocks": shift_clocks,
    "skew_clocks": lambda facts, dest: shift_clocks(facts, dest, skew=True),
    "drop_timestamps": drop_timestamps,
    "benign_noise": benign_noise,
    "benign_library": benign_library,
    "delete_records": delete_records,
    "truncate_tails": truncate_tails,
    "split_file": split_file,
    "merge_ranks": merge_ranks,
    "interleave_ranks": lambda facts, dest: merge_ranks(facts, dest, interleave=True),
}
