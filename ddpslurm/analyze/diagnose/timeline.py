"""The per-rank timeline of a job, built once from the resolved events (pure).

A rank's timeline holds its host, pid, start and exit records, every failure event it logged (in time order
where times compare, else in file order), which of those it recovered from, how its log ended compared
with its peers' logs, and what srun said about its task. Job-level Slurm events and srun's task lines are
kept in their own order; the evidence producers read nothing else.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from ddpslurm.analyze.diagnose.knowledge import group
from ddpslurm.analyze.diagnose.resolve import JOB_KINDS, JobFacts, expand_ranks, plausible_world
from ddpslurm.analyze.model import FACT_KINDS, Event, FileSummary, SourceFile
from ddpslurm.analyze.parse.file_summary import TAIL_LINES, marks_of, shape_mark
from ddpslurm.analyze.parse.timestamps import comparable

FAILURE_ROLES = ("culprit", "victim", "either")
#: kinds that show a rank got past init and into the collectives (an earlier start-up error was recovered)
ALIVE_KINDS = ("nccl_init", "nccl_rank_map", "progress", "watchdog_timeout", "peer_lost", "barrier", "hang",
               "ras_report", "dump_signal", "mismatch_report", "desync_verdict")
#: kinds a rank logs when it starts (again): a new attempt after a preemption or time limit
RESTART_KINDS = ("nccl_init", "start", "attempt_start", "rank_info", "store_barrier")
#: kinds that show the job's process group was initialized: every rank had connected to the rendezvous
INITIALIZED_KINDS = ("nccl_init", "watchdog_timeout", "progress", "hang", "dump_signal", "mismatch_report",
                     "desync_verdict")
#: what srun and slurmstepd say of a task killed by the step's teardown, not by its own fault
TEARDOWN_STATUSES = ("Terminated",)
TEARDOWN_EXIT_CODES = ("143", "15", "137")
#: a job-level event from Slurm about the step or job as a whole, not about a rank
TEARDOWN_MARKERS = re.compile(r"_step_signal|Terminating (?:StepId|job step)|STEP \S+ (?:ON \S+ )?CANCELLED|"
                              r"Job step aborted|Force Terminated")
#: kinds whose lines are no failure of a rank's (a record of its start or end, a fact), or of no rank (a job's)
_NOT_FAILURES = ("start", "exit", *FACT_KINDS)
_NOT_UNRANKED = JOB_KINDS + FACT_KINDS


@dataclass
class RankTimeline:
    """Everything the logs say about one rank."""

    rank: int
    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    started: bool = False
    exit: Event | None = None
    failures: list[Event] = field(default_factory=list)
    recovered: list[Event] = field(default_factory=list)
    first_time: float | None = None
    last_time: float | None = None
    time_family: str | None = None
    log_lines: int = 0
    stopped_early: bool = False

    @property
    def exit_status(self) -> str | None:
        """`ok`, `exception`, `signal SIGKILL`, `stopped ...` from the exit record; None without one."""
        if self.exit is None:
            return None
        if self.exit.kind == "exit_signal":
            return f"signal {self.exit.get('signal') or '?'}"
        return self.exit.get("status") or "exited"

    @property
    def own_failures(self) -> list[Event]:
        """Failures the rank reported about itself and did not recover from."""
        return [e for e in self.failures if e.role in ("culprit", "either") and e not in self.recovered]

    @property
    def first_failure(self) -> Event | None:
        return self.failures[0] if self.failures else None


@dataclass(frozen=True)
class TaskStatus:
    """One rank or node named in srun's `host: task(s) N: status` lines, in srun's order."""

    position: int
    ranks: tuple[int, ...]
    host: str | None
    status: str
    exit_code: str | None
    before_teardown: bool
    event: Event

    @property
    def own_death(self) -> bool:
        """Killed, a signal, a non-zero exit of its own: not the step's teardown of a healthy task."""
        return self.status not in TEARDOWN_STATUSES and self.exit_code not in TEARDOWN_EXIT_CODES


@dataclass
class JobTimeline:
    """The job: per-rank timelines (sparse), Slurm's job events and task lines, and the facts."""

    facts: JobFacts
    ranks: dict[int, RankTimeline]
    job_events: list[Event]
    tasks: list[TaskStatus]
    unranked: list[Event]
    events: list[Event]

    def went_on_after(self, e: Event) -> bool:
        """A new attempt started after `e` (init lines, start records, a restart count): `e` did not end the job.
        Errors printed during the teardown that `e` began are not a new attempt."""
        timed = e.time is not None
        return any(_after_in_time(e, f) if timed else f.kind == "attempt_start" and precedes(e, f)
                   for f in self.events if f.kind in RESTART_KINDS)

    def rank(self, rank: int) -> RankTimeline:
        return self.ranks.get(rank) or RankTimeline(rank=rank, host=self.facts.rank_host.get(rank))

    def failure_lines(self) -> list[Event]:
        """Every failure line of the job: those of no known rank first, then each rank's."""
        return [*self.unranked, *(f for rt in self.ranks.values() for f in rt.failures)]

    @property
    def world_size(self) -> int | None:
        return self.facts.world_size


def build_timeline(events: list[Event], facts: JobFacts, sources: Sequence[SourceFile],
                   summaries: Sequence[FileSummary]) -> JobTimeline:
    """One pass over the resolved events: per rank, per job, per srun task."""
    ranks: dict[int, RankTimeline] = {}
    job_events: list[Event] = []
    unranked: list[Event] = []
    for e in events:
        if e.kind == "slurm_job":
            job_events.append(e)
        elif e.rank is not None and e.kind not in JOB_KINDS:
            _add(_timeline_of(ranks, e.rank), e)
        elif e.role in FAILURE_ROLES and e.kind not in _NOT_UNRANKED:
            unranked.append(e)
    for rank in facts.started | set(facts.exited):
        _timeline_of(ranks, rank)
    initialized = any(e.kind in INITIALIZED_KINDS for e in events)
    # a rank's own events are read only where it may have recovered from a start-up error (recovered_failures)
    retry_causes = group("retried")
    retried = {tl.rank for tl in ranks.values() if any(f.cause in retry_causes for f in tl.failures)}
    by_rank: dict[int, list[Event]] = {}
    for e in events if retried else ():
        if e.rank in retried and e.kind not in JOB_KINDS:
            by_rank.setdefault(e.rank, []).append(e)
    for tl in ranks.values():
        tl.host = tl.host or facts.rank_host.get(tl.rank)
        tl.started = tl.rank in facts.started
        tl.exit = facts.exited.get(tl.rank)
        if len(tl.failures) > 1:
            tl.failures.sort(key=_order_key(tl.failures))
        tl.recovered = recovered_failures(tl, by_rank.get(tl.rank, []), initialized) if tl.failures else []
    _mark_log_ends(ranks, sources, summaries, labels_are_ranks=not facts.torchrun)
    return JobTimeline(facts=facts, ranks=ranks, job_events=job_events, tasks=task_statuses(events, facts),
                       unranked=unranked, events=events)


def _timeline_of(ranks: dict[int, RankTimeline], rank: int) -> RankTimeline:
    """The rank's timeline in `ranks`, added when new (not `setdefault`: that makes one for every event, to drop)."""
    tl = ranks.get(rank)
    if tl is None:
        tl = ranks[rank] = RankTimeline(rank=rank)
    return tl


def _add(tl: RankTimeline, e: Event) -> None:
    if e.pid is not None and e.kind in ("start", "nccl_init") and tl.pid is None:
        tl.pid = e.pid
    if e.local_rank is not None and tl.local_rank is None:
        tl.local_rank = e.local_rank
    if e.host and tl.host is None:
        tl.host = e.host
    if e.time is not None and (tl.time_family is None or comparable(tl.time_family, e.time_family)):
        tl.time_family = tl.time_family or e.time_family
        tl.first_time = e.time if tl.first_time is None else min(tl.first_time, e.time)
        tl.last_time = e.time if tl.last_time is None else max(tl.last_time, e.time)
    if e.role in FAILURE_ROLES and e.kind not in _NOT_FAILURES:
        tl.failures.append(e)


def _order_key(failures: list[Event]) -> Callable[[Event], tuple]:
    """Time order when every failure has a comparable time, else the order of the input."""
    timed = failures and all(e.time is not None for e in failures) and \
        all(comparable(failures[0].time_family, e.time_family) for e in failures)
    if timed:
        return lambda e: (e.time, e.file, e.line)
    return lambda e: (e.file, e.line)


def recovered_failures(tl: RankTimeline, own_events: list[Event], job_initialized: bool = False) -> list[Event]:
    """Start-up errors the rank got past: a later sign of life on the same rank (init done, a collective), or
    a connect failure in a job whose process group was initialized (every rank had connected)."""
    out = []
    retry_causes = group("retried")
    for f in tl.failures:
        if f.cause not in retry_causes or (f.role == "culprit" and f.kind != "socket"):
            continue
        if any(_later(f, e) or (_needs_connected(f, e) and not _later(e, f)) for e in own_events if _got_past(f, e)) \
                or tl.exit_status == "ok" or (job_initialized and f.kind == "socket"):
            out.append(f)
    return out


def _needs_connected(failure: Event, e: Event) -> bool:
    """`e` could only happen once the connect that `failure` reports went through (a store wait, init done, a
    collective): it shows the retry succeeded even where the two lines cannot be ordered (no times, two files)."""
    return failure.kind == "socket" and (e.kind in ALIVE_KINDS or e.kind == "store_barrier")


def _got_past(failure: Event, e: Event) -> bool:
    """`e` shows the rank got past `failure`: init done, a collective, or (after a connect failure) a store
    barrier or a failure of another phenomenon than not reaching its peers."""
    if e.kind in ALIVE_KINDS:
        return True
    return failure.kind == "socket" and (e.kind == "store_barrier" or (
        e.role is not None and e.kind != "socket" and e.cause not in group("retried")))


def _later(a: Event, b: Event) -> bool:
    return precedes(a, b)


def _after_in_time(a: Event, b: Event) -> bool:
    return b.time is not None and comparable(a.time_family, b.time_family) and b.time > a.time  # type: ignore[operator]


def precedes(a: Event, b: Event) -> bool:
    """`a` came before `b`: by comparable times, else by position in the same file."""
    if a.time is not None and b.time is not None and comparable(a.time_family, b.time_family):
        return b.time > a.time
    return a.file == b.file and b.line > a.line


def task_statuses(events: Iterable[Event], facts: JobFacts) -> list[TaskStatus]:
    """srun's task lines in srun's order, each marked as before or after the step's teardown began."""
    out: list[TaskStatus] = []
    teardown = False
    limit = plausible_world(len(facts.present), max(facts.present, default=-1) + 1)
    for e in events:
        if e.kind == "slurm_job" or (e.rank is None and e.kind != "slurm_task" and TEARDOWN_MARKERS.search(e.text)):
            teardown = True
            continue
        if e.kind != "slurm_task":
            continue
        ranks = tuple(expand_ranks(e.get("tasks", "") or "", limit))
        status = _task_status(e)
        out.append(TaskStatus(position=len(out), ranks=ranks, host=e.get("host") or e.host, status=status,
                              exit_code=e.get("exit_code"), before_teardown=not teardown, event=e))
    return out


def _task_status(e: Event) -> str:
    for word in ("Killed", "Segmentation fault", "Bus error", "Aborted", "Terminated", "Exited"):
        if word in e.text:
            return word
    return e.get("status") or "failed"


def _mark_log_ends(ranks: dict[int, RankTimeline], sources: Sequence[SourceFile],
                   summaries: Sequence[FileSummary], labels_are_ranks: bool = True) -> None:
    """Line counts per rank, and the ranks whose log ends before the line most ranks' logs reach (`stopped_early`).
    A rank without a log of its own is read from its stream in a log srun --label merged (not under torchrun:
    labels number nodes)."""
    rank_of = {s.display: s.rank for s in sources if s.rank is not None and s.kind == "log"}
    last: dict[int, Sequence[int]] = {}
    whole: set[int] = set()
    decoded: dict[bytes, Sequence[int]] = {}  # the ranks' logs end alike: each ending decoded once, held once
    for summary in summaries:
        rank = rank_of.get(summary.file)
        if rank is None:
            continue
        _timeline_of(ranks, rank).log_lines += summary.lines
        if summary.end_marks:
            last[rank] = _decoded(summary.end_marks, decoded)  # its last file's (ranks' files come in one order)
            (whole.add if summary.lines <= TAIL_LINES else whole.discard)(rank)
    own = set(rank_of.values())
    last_only: set[int] = set()
    for summary in summaries if labels_are_ranks else ():
        for rank, (lines, shape) in summary.streams.items():
            if summary.file in rank_of or rank in own:
                continue
            _timeline_of(ranks, rank).log_lines += lines
            if shape is not None:
                last[rank] = _decoded(shape_mark(shape.encode("utf-8", errors="replace")), decoded)
                (whole if lines <= 1 else last_only).add(rank)
    for rank in stopped_early(last, {r: tl.log_lines for r, tl in ranks.items() if r in last}, whole, last_only):
        ranks[rank].stopped_early = True


def _decoded(packed: bytes, decoded: dict[bytes, Sequence[int]]) -> Sequence[int]:
    """The marks `packed` holds (`marks_of`), decoded once for all the logs that end alike."""
    marks = decoded.get(packed)
    if marks is None:
        marks = decoded[packed] = marks_of(packed)
    return marks


def stopped_early(tails: dict[int, Sequence[Hashable]], line_counts: dict[int, int],
                  whole: Iterable[int] = (), last_only: Iterable[int] = ()) -> set[int]:
    """Ranks whose log stopped before the line most ranks' logs reach (`_common_end`), judged on the shapes of
    each log's last lines (oldest first; `whole`: the ranks whose last lines are their whole log; `last_only`: those
    of which only the last line is known, a stream of a merged log).

    A rank's last lines that lack that line show it stopped early when they hold a line that comes before it in
    the other logs (the program's own output, which the ranks print alike in one order), when they are its whole
    log, or when its log is far shorter than most. Last lines of the rank's own only (warnings, retries, progress,
    a logged traceback: lines the other ranks' last lines do not hold) may have pushed that line out of view: they
    tell nothing, nor does a log that goes on past the others with them (rank 0's progress). Of a rank whose last
    line alone is known, a last line unlike that one tells it stopped early unless its log holds more lines than
    most. A rank whose last lines hold the line reached it, however many lines it printed before.

    Ranks that hold one object as their last lines (`_mark_log_ends` decodes each ending once) are read once."""
    if len(tails) < 3:
        return set()
    counts = sorted(line_counts.values())
    median = counts[len(counts) // 2] if counts else 0
    short = {r for r, n in line_counts.items() if median >= 4 and n * 2 < median}
    endings = _endings(tails)
    holders: Counter[Hashable] = Counter()
    for tail, n in endings:
        for shape in set(tail):
            holders[shape] += n
    end = _common_end(endings, len(tails), holders)
    if end is None:
        return short
    before = _before(end, endings, len(tails), holders)
    lacking = {id(tail): not before.isdisjoint(tail) for tail, _n in endings if end not in tail}
    whole, last_only = set(whole), set(last_only)
    return {r for r, tail in tails.items()
            if id(tail) in lacking and (r in short or r in whole or lacking[id(tail)] or
                                        (r in last_only and line_counts.get(r, 0) <= median))}


def _endings(tails: dict[int, Sequence[Hashable]]) -> list[tuple[Sequence[Hashable], int]]:
    """Each distinct object among the ranks' last lines, with how many ranks hold it."""
    held: dict[int, list] = {}
    for tail in tails.values():
        entry = held.get(id(tail))
        if entry is None:
            held[id(tail)] = [tail, 1]
        else:
            entry[1] += 1
    return [(tail, n) for tail, n in held.values()]


def _common_end(endings: list[tuple[Sequence[Hashable], int]], ranks: int,
                holders: Counter[Hashable]) -> Hashable | None:
    """The line shape that most ranks' last lines hold and some lack (held by more than half of the `ranks`, not by
    every one: a line every rank printed tells no rank from another) that comes last in most of them; None when
    there is none."""
    half, every = ranks // 2, ranks
    telling = {shape for shape, n in holders.items() if half < n < every}
    if not telling:
        return None
    latest: Counter[Hashable] = Counter()
    for tail, n in endings:
        if not telling.isdisjoint(tail):
            latest[next(s for s in reversed(tail) if s in telling)] += n
    return max(sorted(telling), key=lambda shape: latest[shape])


def _before(end: Hashable, endings: list[tuple[Sequence[Hashable], int]], ranks: int,
            holders: Counter[Hashable]) -> set[Hashable]:
    """The line shapes that more than half of the `ranks`' last lines hold and that come before `end` in every one
    that holds both (never after `end`'s last time): the lines the ranks print, in one order, before it."""
    half = ranks // 2
    common = {shape for shape, n in holders.items() if n > half}
    common.discard(end)
    seen: set[Hashable] = set()
    after: set[Hashable] = set()
    for tail, _n in endings:
        if end in tail:
            last_end = len(tail) - 1 - tail[::-1].index(end)
            seen |= common.intersection(tail[:last_end])
            after |= common.intersection(tail[last_end + 1:])
    return seen - after
