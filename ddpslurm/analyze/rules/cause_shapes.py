"""Shapes of a cause that change what it says about a resubmission: `[[<cause>.shapes]]` tables of
`analyzer/causes.toml` in, `CauseShape`s out, and which one a job's failure lines take.

A shape is met when at least `reporters_at_least` distinct processes of the job (told apart by their rank, their
host and pid, or their srun task) report the cause in failure lines that carry the same value of `same_field`:
port_in_use's "several processes of one job each tried to host the store on one port" (one launcher per task) is
the job colliding with itself, which no resubmission cures, not a port another job holds. A bad table is an
`AnalyzeInputError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpslurm.analyze.model import RETRY, Event
from ddpslurm.errors import AnalyzeInputError

_KEYS = {"id", "description", "same_field", "reporters_at_least", "summary", "retry", "exclude_node", "advice",
         "cause_advice"}


@dataclass(frozen=True)
class CauseShape:
    """One declared shape of a cause and what it declares over the cause's defaults."""

    id: str
    same_field: str
    reporters_at_least: int = 2
    summary: str | None = None
    retry: str | None = None
    exclude_node: bool | None = None
    advice: tuple[str, ...] = ()
    cause_advice: bool = True


@dataclass(frozen=True)
class ShapeMatch:
    """A shape a job's lines take, with the values its summary and advice may name."""

    shape: CauseShape
    value: str
    reporters: int
    hosts: tuple[str, ...]

    def values(self) -> dict[str, str]:
        """`{<same_field>}`, `{reporters}` and `{reporter_hosts}` for the templates."""
        return {self.shape.same_field: self.value, "reporters": str(self.reporters),
                "reporter_hosts": ", ".join(self.hosts) if self.hosts else ""}


def parse_shapes(raw: Any, path: Path, cause: str) -> tuple[CauseShape, ...]:
    """The `[[<cause>.shapes]]` tables of a cause, validated."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise _fail(path, cause, "?", "`shapes` must be a list of [[<cause>.shapes]] tables")
    out = []
    for table in raw:
        shape_id = table.get("id")
        if not isinstance(shape_id, str) or not shape_id:
            raise _fail(path, cause, str(shape_id), "`id` must be a non-empty string")
        unknown = set(table) - _KEYS
        if unknown:
            raise _fail(path, cause, shape_id, f"unknown key(s) {', '.join(sorted(unknown))}")
        same = table.get("same_field")
        if not isinstance(same, str) or not same.isidentifier():
            raise _fail(path, cause, shape_id, "`same_field` must name an event field")
        least = table.get("reporters_at_least", 2)
        if not isinstance(least, int) or isinstance(least, bool) or least < 2:
            raise _fail(path, cause, shape_id, "`reporters_at_least` must be a whole number >= 2")
        retry = table.get("retry")
        if retry is not None and retry not in RETRY:
            raise _fail(path, cause, shape_id, f"`retry` must be one of {', '.join(RETRY)}")
        for key in ("exclude_node", "cause_advice"):
            if key in table and not isinstance(table[key], bool):
                raise _fail(path, cause, shape_id, f"`{key}` must be true or false")
        advice = table.get("advice", [])
        if not isinstance(advice, list) or not all(isinstance(a, str) and a for a in advice):
            raise _fail(path, cause, shape_id, "`advice` must be a list of strings")
        summary = table.get("summary")
        if summary is not None and not isinstance(summary, str):
            raise _fail(path, cause, shape_id, "`summary` must be a string")
        out.append(CauseShape(id=shape_id, same_field=same, reporters_at_least=least, summary=summary, retry=retry,
                              exclude_node=table.get("exclude_node"), advice=tuple(advice),
                              cause_advice=table.get("cause_advice", True)))
    return tuple(out)


def _fail(path: Path, cause: str, shape_id: str, what: str) -> AnalyzeInputError:
    return AnalyzeInputError(f"{path}: [[{cause}.shapes]] {shape_id!r}: {what}",
                             "fix that table (the keys are described at the top of analyzer/causes.toml)")


def reporters(events: Iterable[Event], cause: str, field_name: str) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Per value of `field_name`: how many distinct processes reported `cause` with it (failure lines, not a
    victim's), and their hosts. A process is told by its rank, by its host and pid, or by its srun task (`srun
    --label`); each way is counted apart and the largest count stands, so that one process named two ways (its
    log, its error file, the console) is never two. A line that tells none counts for none."""
    seen: dict[str, tuple[set, set, set, set]] = {}
    for e in events:
        value = e.get(field_name)
        if e.cause != cause or e.role == "victim" or not value:
            continue
        ranks, pids, tasks, hosts = seen.setdefault(value, (set(), set(), set(), set()))
        task = e.get("srun_task")
        if e.rank is not None:
            ranks.add(e.rank)
        if e.pid is not None:
            pids.add((e.host, e.pid))
        if task is not None:
            tasks.add(task)
        if e.host and (e.rank is not None or e.pid is not None or task is not None):
            hosts.add(e.host)
    return {value: (max(len(ranks), len(pids), len(tasks)), tuple(sorted(hosts)))
            for value, (ranks, pids, tasks, hosts) in seen.items()}


def shape_of(shapes: Iterable[CauseShape], events: Iterable[Event], cause: str) -> ShapeMatch | None:
    """The first declared shape the job's failure lines take (the value most processes share), or None."""
    lines = list(events)
    for shape in shapes:
        counted = reporters(lines, cause, shape.same_field)
        best = max(counted.items(), key=lambda kv: (kv[1][0], kv[0]), default=None)
        if best is not None and best[1][0] >= shape.reporters_at_least:
            value, (count, where) = best
            return ShapeMatch(shape=shape, value=value, reporters=count, hosts=where)
    return None
