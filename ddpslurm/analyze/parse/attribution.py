"""Who said a line: rank, local rank and host from its prefixes (pure functions; file names: read/file_names.py).

Prefixes are peeled from the front of a line, several may be stacked (`node02: [rank3]: ...`,
`[default0]:[rank3]:`, `3: ` from `srun --label`, `[1,3]<stdout>:` from Open MPI, `[pod] ` from cloud
pods, CI timestamps). A bracketed number such as `[80746]` is a log viewer's line number, not a rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from ddpslurm.analyze.read.file_names import HOST as _HOST

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """Remove ANSI escape sequences and control characters (keeps tabs); keep what follows a last `\\r`."""
    if text.isprintable():  # no control character at all (nor a tab, an escape or a carriage return)
        return text
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _CONTROL.sub("", text)


class Prefix(NamedTuple):
    """What the prefixes of one line tell; `text` is the line without them. A named tuple: every line read builds
    one, and a tuple is built in half a frozen dataclass's time."""

    text: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    time_text: str | None = None
    task: int | None = None  # srun --label task id (a node index when torchrun runs one task per node)
    rank_from_label: bool = False
    #: `host` came from a tag shaped like a host name (`node02: `, `[trainer-1] `) that a script's own head
    #: (`GPU3: `, `Epoch1: `, `[rank7] `) has too: a host only where a place that carries host names says it too
    host_tag: bool = False


# Each rule: (regex anchored at the start, what the groups mean). Order matters only for overlaps.
RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # CI / collector timestamps in front: `2024-05-08T08:47:31.1234567Z `, `[2024-05-08 08:47:31] `,
    # `2025-11-09 15:39:31.043 +08:00 ` (a collector's offset after a space)
    (re.compile(r"\[?(?P<time>(?:19|20)\d\d-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?: ?(?:Z|[+-]\d\d:?\d\d))?)\]?:?\s+"
                r"(?=\S)(?!\[?[A-Z]?[a-z]*(?:\]|,\d))"), "time"),
    # log viewer line numbers: `[80746] ` or `80746| ` (never a rank; torch's desync verdict `[100] finished
    # collective #S, ...` lists ranks that way)
    (re.compile(r"\[\d{3,}\]\s+(?!joined but|finished collective #)|\d+\s*\|\s"), "lineno"),
    # Open MPI --tag-output: `[1,3]<stdout>:`
    (re.compile(r"\[\d+,(?P<rank>\d{1,18})\]<std(?:out|err)>:\s?"), "rank"),
    # Determined's trial logs: `[] [rank=3] ` (CLI, web UI), `fa88a9df [rank=3] || ` (a container id before it);
    # `[rank=3]: ` (a launcher's or a script's own rank head; after its colon, a traceback's indentation is the line's)
    (re.compile(r"(?:\[\] |[0-9a-f]{8} )?\[rank=(?P<rank>\d{1,18})\](?::\s?|(?: (?:\|\| ?)?)(?=\S))"), "rank"),
    # torch >= 2.2: `[rank3]:`, also `[Rank 3]:`
    (re.compile(r"\[[Rr]ank ?(?P<rank>\d{1,18})\]:\s?"), "rank"),
    # torchrun --tee / --log-line-prefix: `[default0]:`, `[trainer3]:`
    (re.compile(r"\[(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<local>\d{1,18})\]:\s?"), "local"),
    # srun --label: `3: ` (padded with spaces)
    (re.compile(r" *(?P<rank>\d{1,6}): (?=.)"), "label"),
    # pdsh / DeepSpeed: `node02: `, `10.0.0.2: ` (a name is a tag: `GPU3: `, `Epoch1: ` have the same shape)
    # (a Python exception's qualified name, `urllib3.exceptions.MaxRetryError: `, is not a host)
    (re.compile(rf"(?P<host>{_HOST})(?<!Error)(?<!Exception)(?<!Warning): (?=.)"), "tag"),
    # Ray workers: `(RayTrainWorker pid=1234, ip=10.0.0.5) `
    (re.compile(r"\((?:[\w.]+ )?pid=\d+(?:, ip=(?P<host>[\d.]+|[0-9a-fA-F:]+))?\) (?=\S)"), "host"),
    # container / trial log collectors: `0c41e7b2 || `
    (re.compile(r"(?P<host>[\w.-]+) \|\| ?"), "host"),
    # cloud pods: `[trainer-worker-1] ` (a tag: a script's `[rank7] ` has the same shape)
    (re.compile(r"\[(?=[a-z0-9.-]*[a-z])(?=[a-z0-9.]*[-\d])(?P<host>[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?)\] (?=\S)"),
     "tag"),
)
#: whether some rule matches, and not empty, at the start of a text: one match where most lines meet none, not one
#: per rule (a rule's groups become plain groups, as names repeat; the lookbehind after each alternative refuses an
#: empty match, so that the engine backtracks into the others as the per-rule loop would try them)
ANY_RULE = re.compile("|".join(f"(?:{re.sub(r'[(][?]P<[a-z_]+>', '(?:', rule.pattern)})(?<=[\\s\\S])"
                               for rule, _ in RULES))
#: `[rank3]:` after a tag no rule knows (a job name, a logger's own head): taken when no rank was found before it
EMBEDDED_RANK = re.compile(r"(?<=[\s\]):|])\[[Rr]ank ?(?P<rank>\d{1,18})\]:\s?")
#: NCCL's line head `host:pid:tid [dev] `; a host name starts with a letter or digit (RFC 1123): a head cut inside its
#: host (`-worker-1:946:988 [0] `, a paste) names no host
NCCL_SOURCE = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] ")


Span = tuple[int, int]
#: an address in a tag's place (pdsh -w with addresses, DeepSpeed's hostfile of IPs) is a host's address, not a tag
_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")


@dataclass(frozen=True, slots=True)
class PrefixSpans:
    """Where `strip_prefixes` found what it found in a line: the start of the text after the prefixes, and the
    (start, end) of each value. The rules are digit-blind but for the timestamp's `19|20`, so lines of one shape
    (digits written as 0) whose shape holds no `0000-00-00` have the same spans (scan.py's line recipes)."""

    start: int = 0
    rank: Span | None = None
    local_rank: Span | None = None
    host: Span | None = None
    time_text: Span | None = None
    label: Span | None = None
    host_tag: bool = False  #: the host span is a tag's (Prefix.host_tag)

    def prefix(self, line: str) -> Prefix:
        """What these spans say of `line`."""
        rank = number(line, self.rank)
        label = number(line, self.label)
        local_rank = number(line, self.local_rank)
        from_label = rank is None and label is not None and local_rank is None
        if from_label:
            rank = label  # srun --label with one task per rank; with torchrun it numbers nodes, not ranks
        return Prefix(text=line[self.start:], rank=rank, local_rank=local_rank, host=piece(line, self.host),
                      time_text=piece(line, self.time_text), task=label, rank_from_label=from_label,
                      host_tag=self.host_tag)


def piece(line: str, span: Span | None) -> str | None:
    """The part of `line` at `span` (None for no span)."""
    return None if span is None else line[span[0]:span[1]]


def number(line: str, span: Span | None) -> int | None:
    """The number written in `line` at `span` (None for no span)."""
    return None if span is None else int(line[span[0]:span[1]])


def strip_prefixes(line: str, max_prefixes: int = 6) -> Prefix:
    """Peel the known prefixes off `line`; returns the rest and what they said."""
    return prefix_spans(line, max_prefixes).prefix(line)


def prefix_spans(line: str, max_prefixes: int = 6) -> PrefixSpans:
    """Where the known prefixes of `line` end and where each value they say sits (`strip_prefixes`)."""
    rank = local_rank = label = host = time_text = None
    host_tag = False
    text, base = line, 0
    for _ in range(max_prefixes):
        for pattern, meaning in RULES if ANY_RULE.match(text) else ():
            m = pattern.match(text)
            if not m or m.end() == 0:
                continue
            if meaning == "label":
                label = label or _span(m, "rank", base)
            elif meaning == "rank":
                rank = _span(m, "rank", base)  # the innermost explicit rank wins
            elif meaning == "local":
                local_rank = local_rank or _span(m, "local", base)
            elif meaning in ("host", "tag"):
                if NCCL_SOURCE.match(text) or (m["host"] or "").startswith(("slurmstepd", "srun", "slurmd")):
                    continue
                if host is None:
                    host = _span(m, "host", base)  # None for a Ray head without its ip
                    host_tag = host is not None and meaning == "tag" and not _IPV4.fullmatch(m["host"])
            elif meaning == "time":
                time_text = time_text or _span(m, "time", base)
            text, base = text[m.end():], base + m.end()
            break
        else:
            m = EMBEDDED_RANK.search(text, 0, 160) if rank is None and may_embed_rank(text) else None
            if m is None:
                break
            rank, text, base = _span(m, "rank", base), text[m.end():], base + m.end()
    return PrefixSpans(start=base, rank=rank, local_rank=local_rank, host=host, time_text=time_text, label=label,
                       host_tag=host_tag)


def may_embed_rank(text: str) -> bool:
    """Whether `text` holds the literal EMBEDDED_RANK starts with (`[rank` or `[Rank`) where it is looked for: a
    cheap test first, as most lines hold none (the search itself tries the lookbehind at every position)."""
    head = text[:160]
    return "[rank" in head or "[Rank" in head


def _span(m: re.Match[str], group: str, base: int) -> Span | None:
    start, end = m.span(group)
    return None if start < 0 else (base + start, base + end)


def nccl_source(text: str) -> tuple[str, int] | None:
    """`(host, pid)` from NCCL's `host:pid:tid [dev] ` line head, or None."""
    m = NCCL_SOURCE.match(text)
    return (m["host"], int(m["pid"])) if m else None


BODY_RANK = re.compile(r"\[(?:PG (?:ID )?\S+ (?:PG GUID [^\]]*? |\([^)]*\) )?)?Rank (?P<rank>\d{1,7})\]")


def body_rank(body: str) -> int | None:
    """The rank named by a `[Rank N]` / `[PG ... Rank N]` tag inside a message body (torch's C++ logs), or None."""
    if "Rank " not in body:
        return None
    m = BODY_RANK.search(body, 0, 400)
    return int(m["rank"]) if m else None


#: NCCL's interface listing `[0]eth0:10.0.0.1<0> [1]ib0:fe80::1%ib0<0>` (an alias `eth0:1` keeps its colon). A name
#: starts where a run of name characters does: tried inside every word, the pattern is costly on a `Using` line
#: (and finds nothing more: whatever matches from inside a run matches from its start)
_IF_ENTRY = re.compile(r"(?:\[\d+\])?(?<![\w.@-])(?P<ifname>[\w.@-]+(?::\d+)?)"
                       r":(?P<ip>[0-9a-fA-F.:]+(?:%[\w.-]+)?)<\d+>")
#: interface name prefixes of container and VM bridges and their virtual ends (docker, podman/CNI, libvirt, k8s CNIs)
_BRIDGE_NAMES = ("docker", "br-", "virbr", "veth", "cni", "flannel", "cali", "vxlan", "lxcbr", "lxdbr", "podman",
                 "kube-", "weave", "tunl", "genev")


def interface_list(body: str) -> list[tuple[str, str]]:
    """Every `(ifname, ip)` an NCCL `Using` line lists (after `; OOB` for NET/IB, else after `Using `), in order.
    The list is looked for only there: tried on NCCL's `host:pid:tid` head too, the pattern backtracks through
    it (a Bootstrap line then costs several times as much)."""
    if "; OOB" in body:
        tail = body.split("; OOB", 1)[1]
    else:
        start = body.find("Using ")
        tail = body[start:] if start >= 0 else body
    return [(m["ifname"], m["ip"]) for m in _IF_ENTRY.finditer(tail)]


def interface_scope(ifname: str, ip: str) -> str:
    """`loopback`, `link_local`, `bridge` (a container/VM bridge: reaches no other host) or `global`."""
    address = ip.split("%", 1)[0].lower()
    if ifname == "lo" or address.startswith("127.") or address == "::1":
        return "loopback"
    if address.startswith(("169.254.", "fe8", "fe9", "fea", "feb")):
        return "link_local"
    if ifname.startswith(_BRIDGE_NAMES):
        return "bridge"
    return "global"
