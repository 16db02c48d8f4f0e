"""What the HTML report's timeline draws, derived from a Diagnosis (pure, no markup).

Ranks are grouped by node; alike neighbouring ranks on a node become one run (one mark), and for big jobs
alike neighbouring nodes become one row, so 16,384 ranks draw as a few hundred shapes. The Diagnosis'
`timeline` (each rank's first failure where it happened, report.timeline_rows), `job_events` and `host_events`
are read when present; without them, times come from the evidence.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ddpslurm.analyze.model import Diagnosis, Evidence

#: above this many nodes, alike neighbouring nodes share a row
MAX_NODE_ROWS = 64
#: above this many runs, the ranks of a node are grouped by role alone (what keeps 16k ranks under 5 MB)
MAX_RUNS = 3000
#: Slurm's job-level messages, when the Diagnosis carries no `job_events` (older engines)
_JOB_EVENT = re.compile(r"CANCELLED|TIME LIMIT|DUE TO|PREEMPT|requeue", re.IGNORECASE)


@dataclass(frozen=True)
class Mark:
    """One rank on the time axis."""

    rank: int
    host: str
    role: str
    time: float | None
    text: str
    where: str  # `file:line` of the rank's first evidence line, or ''
    last_time: float | None
    placed: str | None = None  # how `time` was read where the line has none (TimelineRow.placed)


@dataclass(frozen=True)
class Run:
    """Alike neighbouring ranks drawn as one mark: same role, same message shape, timed or not alike."""

    marks: tuple[Mark, ...]

    @property
    def role(self) -> str:
        return self.marks[0].role

    @property
    def ranks(self) -> str:
        ranks = [m.rank for m in self.marks]
        return str(ranks[0]) if len(ranks) == 1 else f"{min(ranks)}-{max(ranks)}"

    @property
    def times(self) -> list[float]:
        return [m.time for m in self.marks if m.time is not None]

    @property
    def last_time(self) -> float | None:
        lasts = [m.last_time for m in self.marks if m.last_time is not None]
        return max(lasts) if lasts else None


@dataclass(frozen=True)
class NodeRow:
    """One row of the timeline: a node (or, in a big job, a run of alike nodes) and its runs of ranks."""

    hosts: tuple[str, ...]
    runs: tuple[Run, ...]

    @property
    def label(self) -> str:
        if len(self.hosts) == 1:
            return self.hosts[0]
        return f"{self.hosts[0]}..{self.hosts[-1]} ({len(self.hosts)})"

    @property
    def has_culprit(self) -> bool:
        return any(run.role == "culprit" for run in self.runs)


@dataclass(frozen=True)
class Event:
    """A timed line drawn on its own: a Slurm job event (vertical rule) or one of the culprit's lines."""

    time: float
    text: str
    where: str


@dataclass(frozen=True)
class HostMark:
    """A line a host wrote (GPU driver, OOM killer, slurmstepd) on the axis, on its node's row where it has one."""

    time: float
    host: str | None
    kind: str
    text: str
    where: str


@dataclass(frozen=True)
class TimelineModel:
    """Everything the SVG needs: rows, the time span, Slurm's job and host events and the culprit's own lines."""

    rows: tuple[NodeRow, ...]
    start: float | None
    end: float | None
    job_events: tuple[Event, ...]
    culprit_events: tuple[Event, ...]
    host_events: tuple[HostMark, ...] = ()
    times: tuple[float, ...] = ()  # every time drawn: what the axis spans and where it breaks

    @property
    def timed(self) -> bool:
        return self.start is not None


def unix_time(text: str | float | None) -> float | None:
    """An ISO-8601 time (`...Z`, an offset, or naive = UTC) or a unix float as unix seconds; None if neither."""
    if text is None or isinstance(text, (int, float)):
        return float(text) if text is not None else None
    try:
        parsed = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()


def shape(text: str | None) -> str:
    """A message with numbers masked, so that lines differing only in rank, pid or address are alike."""
    return re.sub(r"\d+", "N", text or "")


def _where(evidence: Evidence) -> str:
    return f"{evidence.file}:{evidence.line}" if evidence.file else ""


def _first_evidence(evidence: Sequence[Evidence]) -> dict[int, Evidence]:
    """Each rank's earliest timed evidence line, else its first line."""
    first: dict[int, Evidence] = {}
    for item in evidence:
        if item.rank is None:
            continue
        known = first.get(item.rank)
        if known is None or (unix_time(known.time) is None and unix_time(item.time) is not None) or (
                unix_time(item.time) is not None and unix_time(item.time) < (unix_time(known.time) or 0.0)):
            first[item.rank] = item
    return first


def rank_marks(diagnosis: Diagnosis) -> list[Mark]:
    """One mark per rank, from `diagnosis.timeline` when the engine fills it, else from ranks + evidence."""
    first = _first_evidence(diagnosis.evidence)
    hosts = {row.rank: row.host for row in diagnosis.ranks}
    roles = {row.rank: row.role for row in diagnosis.ranks}
    timeline = getattr(diagnosis, "timeline", None) or []
    marks = []
    for row in timeline:
        seen = first.get(row.rank)
        when = unix_time(row.first_failure_time)
        if when is None and seen is not None:
            when = unix_time(seen.time)
        marks.append(Mark(row.rank, row.host or hosts.get(row.rank) or "?", roles.get(row.rank, row.role), when,
                          row.first_failure_text or (seen.text if seen else ""), _where(seen) if seen else "",
                          unix_time(row.last_time), getattr(row, "placed", None)))
    drawn = {m.rank for m in marks}
    for row in diagnosis.ranks:
        if row.rank in drawn:
            continue
        seen = first.get(row.rank)
        marks.append(Mark(row.rank, row.host or "?", row.role, unix_time(seen.time) if seen else None,
                          row.first_error or (seen.text if seen else ""), _where(seen) if seen else "", None))
    return sorted(marks, key=lambda m: m.rank)


def _alike(a: Mark, b: Mark) -> bool:
    return (b.rank == a.rank + 1 and a.role == b.role and "culprit" not in (a.role, b.role)
            and (a.time is None) == (b.time is None) and shape(a.text) == shape(b.text))


def runs_of(marks: Iterable[Mark]) -> list[Run]:
    """Neighbouring alike ranks (consecutive numbers, same role and message shape) as runs; a culprit alone."""
    runs: list[list[Mark]] = []
    for mark in marks:
        if runs and _alike(runs[-1][-1], mark):
            runs[-1].append(mark)
        else:
            runs.append([mark])
    return [Run(tuple(run)) for run in runs]


def by_role(marks: Iterable[Mark]) -> list[Run]:
    """The coarse grouping: a node's ranks by role and timed-or-not alone, whatever their messages."""
    groups: dict[tuple[str, bool], list[Mark]] = {}
    for mark in marks:
        groups.setdefault((mark.role, mark.time is None), []).append(mark)
    return [Run(tuple(groups[key])) for key in sorted(groups)]


def node_rows(marks: Sequence[Mark], max_rows: int = MAX_NODE_ROWS, max_runs: int = MAX_RUNS) -> list[NodeRow]:
    """Ranks grouped by node (nodes in order of their lowest rank), alike neighbours as runs; above `max_rows`
    nodes, alike nodes share a row; above `max_runs` runs, a node's ranks are grouped by role alone."""
    by_host: dict[str, list[Mark]] = {}
    for mark in marks:
        by_host.setdefault(mark.host, []).append(mark)
    rows = [NodeRow((host,), tuple(runs_of(group))) for host, group in by_host.items()]
    coarse = sum(len(row.runs) for row in rows) > max_runs
    if coarse:
        rows = [NodeRow((host,), tuple(by_role(group))) for host, group in by_host.items()]
    return rows if len(rows) <= max_rows else merge_alike_nodes(rows, _shape_counts if coarse else _shape_fine)


def _shape_fine(run: Run) -> tuple:
    return run.role, len(run.marks), bool(run.times), shape(run.marks[0].text)


def _shape_counts(run: Run) -> tuple:
    return run.role, len(run.marks), bool(run.times)


def merge_alike_nodes(rows: Sequence[NodeRow], likeness: Callable[[Run], tuple] = _shape_fine) -> list[NodeRow]:
    """Neighbouring nodes whose runs are alike (`likeness` of each run equal, in order) share one row;
    a culprit's node always keeps its own row."""
    merged: list[NodeRow] = []
    shapes: list[tuple] = []  # the shape of one node of each merged row
    for row in rows:
        this = tuple(likeness(run) for run in row.runs)
        last = merged[-1] if merged else None
        if last is None or row.has_culprit or last.has_culprit or shapes[-1] != this:
            merged.append(row)
            shapes.append(this)
            continue
        runs = tuple(Run(a.marks + b.marks) for a, b in zip(last.runs, row.runs, strict=True))
        merged[-1] = NodeRow(last.hosts + row.hosts, runs)
    return merged


def job_events(diagnosis: Diagnosis) -> list[Event]:
    """Slurm's job-level events with a time: `diagnosis.job_events`, else rank-less evidence that reads as one."""
    given = getattr(diagnosis, "job_events", None)
    source = given if given is not None else [e for e in diagnosis.evidence
                                              if e.rank is None and _JOB_EVENT.search(e.text or "")]
    events = [Event(t, e.text, _where(e)) for e in source if (t := unix_time(e.time)) is not None]
    return sorted(events, key=lambda e: e.time)


def culprit_events(diagnosis: Diagnosis) -> list[Event]:
    """The culprit rank's own timed evidence lines, to highlight what it did before the others failed."""
    rank = diagnosis.first_failing_rank
    if rank is None:
        return []
    events = [Event(t, e.text, _where(e)) for e in diagnosis.evidence
              if e.rank == rank and (t := unix_time(e.time)) is not None]
    return sorted(events, key=lambda e: e.time)


def host_marks(diagnosis: Diagnosis) -> list[HostMark]:
    """The hosts' own timed lines (`diagnosis.host_events`), one per host and message shape (a driver repeats)."""
    out, seen = [], set()
    for e in getattr(diagnosis, "host_events", None) or []:
        when = unix_time(e.time)
        key = (e.host, e.kind, shape(e.text))
        if when is None or key in seen:
            continue
        seen.add(key)
        out.append(HostMark(when, e.host, e.kind, e.text, f"{e.file}:{e.line}" if e.file else ""))
    return sorted(out, key=lambda e: e.time)


def build_model(diagnosis: Diagnosis, max_rows: int = MAX_NODE_ROWS) -> TimelineModel:
    """The timeline of a Diagnosis: rows by node, its time span, job and host events and the culprit's lines."""
    marks = rank_marks(diagnosis)
    slurm, culprit, hosts = job_events(diagnosis), culprit_events(diagnosis), host_marks(diagnosis)
    times = [m.time for m in marks if m.time is not None] + [m.last_time for m in marks if m.last_time is not None]
    times += [e.time for e in slurm] + [e.time for e in culprit] + [e.time for e in hosts]
    return TimelineModel(tuple(node_rows(marks, max_rows)), min(times) if times else None,
                         max(times) if times else None, tuple(slurm), tuple(culprit), tuple(hosts),
                         tuple(sorted(set(times))))
