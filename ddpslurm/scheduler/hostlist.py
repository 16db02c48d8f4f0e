"""Slurm hostlist expressions (`gpu[01-04,07]`, `rack[1-2]-n[01-02]`) and task counts (`4(x2),3`). Pure.

Expansion follows Slurm's order: top-level groups left to right; inside a group with several
bracket expressions the leftmost bracket varies slowest (`a[1-2]b[1-2]` -> a1b1 a1b2 a2b1 a2b2);
numbers keep the zero padding of the range's lower bound (`n[008-011]` -> n008 ... n011).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from itertools import product

from ddpslurm.errors import EnvDerivationError

_HINT = "Give a Slurm hostlist such as `node[01-04,07]` or `a1,b[2-3]`"
_RANGE = re.compile(r"^([0-9]{1,18})(?:-([0-9]{1,18}))?$")  # ASCII digits, few enough for int()
_TASKS = re.compile(r"^([0-9]{1,18})(?:\(x([0-9]{1,18})\))?$")
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")
_SEPARATOR = re.compile(r"\s*,\s*|\s+")
_PIECE = re.compile(r"([^\[\]]*)(?:\[([^\[\]]*)\])?")
#: Refuse expressions that would expand to absurd sizes (a typo like `n[1-99999999]`).
MAX_HOSTS = 1_000_000


def _bad(text: str, why: str) -> EnvDerivationError:
    return EnvDerivationError(f"malformed hostlist {text!r}: {why}", _HINT)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets; raise on unbalanced brackets."""
    groups, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise _bad(text, "nested '['")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _bad(text, "']' without '['")
        elif char == "," and depth == 0:
            groups.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise _bad(text, "'[' without ']'")
    groups.append(text[start:])
    return groups


def _expand_ranges(body: str, text: str) -> list[str]:
    """`01-03,07` -> ['01', '02', '03', '07'] keeping the lower bound's width."""
    out: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise _bad(text, f"bad range {part!r} in [{body}]")
        lo_text, hi_text = match.group(1), match.group(2)
        lo, hi = int(lo_text), int(hi_text if hi_text is not None else lo_text)
        if hi < lo:
            raise _bad(text, f"reversed range [{part}]")
        if hi - lo + 1 > MAX_HOSTS:
            raise _bad(text, f"range [{part}] is too large")
        if len(out) + hi - lo + 1 > MAX_HOSTS:
            raise _bad(text, f"[{body}] expands to too many hosts")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_group(group: str, text: str) -> list[str]:
    """One top-level group: literal pieces and bracket pieces, expanded as a cartesian product."""
    if "[]" in group:
        raise _bad(text, "empty brackets")
    pieces: list[list[str]] = []
    for literal, bracket in _PIECE.findall(group):
        if literal:
            pieces.append([literal])
        if bracket:
            pieces.append(_expand_ranges(bracket, text))
    if math.prod(len(piece) for piece in pieces) > MAX_HOSTS:  # before the product is built, not after
        raise _bad(text, "it expands to too many hosts")
    return ["".join(combo) for combo in product(*pieces)]


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in Slurm's order (duplicates kept)."""
    if text is None or not text.strip():
        raise _bad(text or "", "it is empty")
    cleaned = _SEPARATOR.sub(",", text.strip())  # Slurm also accepts blanks between hosts
    hosts: list[str] = []
    for group in _split_top_level(cleaned):
        if not group:
            raise _bad(text, "empty host name between commas")
        hosts.extend(_expand_group(group, text))
        if len(hosts) > MAX_HOSTS:
            raise _bad(text, "it expands to too many hosts")
    return hosts


def _runs(numbers: Sequence[str]) -> list[str]:
    """['01','02','03','07'] -> ['01-03', '07']: ascending runs that re-expand to the same strings."""
    parts: list[str] = []
    i = 0
    while i < len(numbers):
        lo = numbers[i]
        width, j = len(lo), i
        while j + 1 < len(numbers) and numbers[j + 1] == str(int(numbers[j]) + 1).zfill(width):
            j += 1
        parts.append(lo if j == i else f"{lo}-{numbers[j]}")
        i = j + 1
    return parts


def compress_hostlist(hosts: Iterable[str]) -> str:
    """Inverse of `expand_hostlist` for display: consecutive hosts sharing a prefix share one bracket.

    Order is preserved, so `expand_hostlist(compress_hostlist(h)) == list(h)`.
    """
    out: list[str] = []
    prefix: str | None = None
    numbers: list[str] = []

    def flush() -> None:
        if prefix is None:
            return
        if len(numbers) == 1:
            out.append(prefix + numbers[0])
        else:
            out.append(f"{prefix}[{','.join(_runs(numbers))}]")

    for host in hosts:
        match = _TRAILING_NUMBER.match(host)
        if not match:
            flush()
            prefix, numbers = None, []
            out.append(host)
            continue
        head, number = match.groups()
        if head != prefix:
            flush()
            prefix, numbers = head, []
        numbers.append(number)
    flush()
    return ",".join(out)


def expand_tasks_per_node(text: str) -> list[int]:
    """`4(x2),3` -> [4, 4, 3]: the form of SLURM_TASKS_PER_NODE and SLURM_STEP_TASKS_PER_NODE."""
    if text is None or not text.strip():
        raise EnvDerivationError(f"malformed tasks-per-node value {text!r}: it is empty",
                                 "Expected a Slurm value such as `4(x2),3`")
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _TASKS.match(part.strip())
        if not match:
            raise EnvDerivationError(f"malformed tasks-per-node value {text!r}: bad part {part!r}",
                                     "Expected a Slurm value such as `4(x2),3`")
        repeat = int(match.group(2) or 1)
        if repeat == 0:
            raise EnvDerivationError(f"malformed tasks-per-node value {text!r}: repeat count 0 in {part!r}",
                                     "Expected a Slurm value such as `4(x2),3`")
        if len(counts) + repeat > MAX_HOSTS:
            raise EnvDerivationError(f"malformed tasks-per-node value {text!r}: more than {MAX_HOSTS} nodes",
                                     "Expected a Slurm value such as `4(x2),3`")
        counts.extend([int(match.group(1))] * repeat)
    return counts
