"""What the HTML timeline needs of a job's timeline (pure): each rank's first failure placed where it happened, and
the host events (GPU Xid and fallen-off-bus lines, OOM killer and slurmstepd memory kills) with their hosts.

Where a rank's first failure line carries no time, its place is read off the lines around it: by the first timed
failure of the rank's own that follows it (the exit record written as the exception left the script), else after
the last timed line before it (in its file, else of the rank). A culprit whose own lines say nothing of a failure of
its own (only the teardown's kill, or the timeout its peers saw too) failed by falling silent: it is placed at its
last sign of life before that line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from ddpslurm.analyze.diagnose.timeline import JobTimeline, RankTimeline
from ddpslurm.analyze.model import Event, HostEvent, RankRow, TimelineRow

#: the kinds a host (its kernel, its GPU driver, slurmstepd) reports, not a rank's process
HOST_KINDS = ("gpu", "oom_kill")
#: the exit records' kinds: written as the rank ended, never a sign of its life before a failure
EXIT_KINDS = ("exit", "exit_signal")
#: the host a syslog or journal line names after its time (RFC 3164 `Mar 02 03:14:07 HOST kernel:`, journalctl's
#: `short` and `short-iso` formats)
_SYSLOG_HOST = re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"
                          r"|\d{4}-\d\d-\d\dT[\d:.,]+(?:Z|[+-][\d:]+)?) ([A-Za-z0-9][\w.-]*) \S+?(?:\[\d+\])?:")
#: at most this many host events are carried to the report (a driver may repeat an Xid thousands of times)
MAX_HOST_EVENTS = 200
#: the text a timeline row keeps of its first failure
TEXT = 300
#: how a first failure without a time of its own was placed (TimelineRow.placed)
FELL_SILENT = "fell silent: its last sign of life before its first failure line"
BY_LATER_FAILURE = "the line has no time: by the rank's next timed failure line"
AFTER_LINE_BEFORE = "the line has no time: after the last timed line before it"
AFTER_RANK_LINE = "the line has no time: after the rank's last timed line"
#: the placements that are a failure line's own time (the others are the time of a line before it)
FAILURE_LINE_TIMES = (None, BY_LATER_FAILURE)


#: the timed lines placing a failure: (line, time) by file, and (-1, time) by rank
Lines = tuple[dict[str, list[tuple[int, float]]], dict[int, list[tuple[int, float]]]]


def timeline_rows(tl: JobTimeline, rows: Sequence[RankRow], culprit: int | None = None,
                  shown: Callable[[Event], str] = lambda e: e.text[:TEXT]) -> list[TimelineRow]:
    """One row per rank of the table: its first failure's text and where it happened, its last sign of life."""
    lines = _timed_lines(tl.events, *_needing_neighbours(tl, rows, culprit))
    out = []
    for row in rows:
        rt = tl.ranks.get(row.rank)
        first = rt.first_failure if rt is not None else None
        when, how = (None, None) if rt is None or first is None else placed(rt, first, lines, row.rank == culprit)
        out.append(TimelineRow(rank=row.rank, host=row.host, role=row.role,
                               first_failure_time=when, first_failure_text=shown(first) if first else None,
                               last_time=rt.last_time if rt is not None else None,
                               exit_status=rt.exit_status if rt is not None else None, placed=how))
    return out


def _needing_neighbours(tl: JobTimeline, rows: Sequence[RankRow], culprit: int | None) -> tuple[set[str], set[int]]:
    """The files and ranks whose timed lines place a failure: those of untimed first failures, and the culprit."""
    files: set[str] = set()
    ranks: set[int] = set()
    for row in rows:
        rt = tl.ranks.get(row.rank)
        if rt is None or rt.first_failure is None:
            continue
        if rt.first_failure.time is None:
            files.add(rt.first_failure.file)
            ranks.add(row.rank)
        elif row.rank == culprit:
            ranks.add(row.rank)
    return files, ranks


def _timed_lines(events: Iterable[Event], files: set[str], ranks: set[int]) -> Lines:
    """(line, time) of each timed event but exit records, in the files and of the ranks asked for."""
    by_file: dict[str, list[tuple[int, float]]] = {}
    by_rank: dict[int, list[tuple[int, float]]] = {}
    if not files and not ranks:
        return by_file, by_rank
    for e in events:
        if e.time is None or e.kind in EXIT_KINDS:
            continue
        if e.file in files:
            by_file.setdefault(e.file, []).append((e.line, e.time))
        if e.rank in ranks:
            by_rank.setdefault(e.rank, []).append((-1, e.time))
    return by_file, by_rank


def placed(rt: RankTimeline, first: Event, lines: Lines, is_culprit: bool) -> tuple[float | None, str | None]:
    """Where the rank's first failure goes on the axis, and how that was read (None: the line's own time)."""
    by_file, by_rank = lines
    if is_culprit and first.role == "victim":
        before = [t for _, t in by_rank.get(rt.rank, ()) if first.time is None or t < first.time]
        if before:
            return max(before), FELL_SILENT
    if first.time is not None:
        return first.time, None
    after = [e.time for e in rt.failures if e.time is not None and e.role in ("culprit", "either")]
    if after:
        return min(after), BY_LATER_FAILURE
    before = [t for line, t in by_file.get(first.file, ()) if line < first.line]
    if before:
        return max(before), AFTER_LINE_BEFORE
    anywhere = [t for _, t in by_rank.get(rt.rank, ())]
    if anywhere:
        return max(anywhere), AFTER_RANK_LINE
    return None, None


def host_events(tl: JobTimeline, limit: int = MAX_HOST_EVENTS) -> list[HostEvent]:
    """The events a host reported (GPU driver, OOM killer, slurmstepd's memory kills), timed first, in time order."""
    found = [e for e in tl.events if e.kind in HOST_KINDS]
    found.sort(key=lambda e: (e.time is None, e.time or 0.0, e.file, e.line))
    return [HostEvent(time=e.time, host=e.host or syslog_host(e.text), rank=e.rank, kind=e.kind, file=e.file,
                      line=e.line, text=e.text) for e in found[:limit]]


def syslog_host(text: str) -> str | None:
    """The host a syslog or journal line names (`Mar 02 03:14:07 gpu-d07 kernel: ...` -> `gpu-d07`), else None."""
    match = _SYSLOG_HOST.match(text)
    return match[1] if match else None
