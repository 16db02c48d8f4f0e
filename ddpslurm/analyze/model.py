"""The plain types that cross the analyzer's stages: `SourceFile` and `FileSummary` (read -> parse),
the frozen `Event` every parser yields (parse -> diagnose), the `Diagnosis` and its rows (diagnose -> report),
and the vocabulary they share (causes, roles, fact kinds, retry values)."""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from operator import attrgetter
from sys import intern
from typing import Any

#: The cause vocabulary (DESIGN.md). `unknown` is kept for "nothing matched".
CAUSES: tuple[str, ...] = (
    "network_unreachable", "port_in_use", "rendezvous_timeout", "rank_config_mismatch",
    "stale_rendezvous_state", "wrong_interface", "infiniband_error", "nccl_version_mismatch",
    "duplicate_gpu", "cuda_oom", "host_oom", "gpu_hardware", "collective_timeout", "collective_mismatch",
    "user_code_exception", "unused_parameters", "slurm_time_limit", "slurm_cancelled", "preempted",
    "node_failure", "shm_error", "dataloader_worker_killed", "nccl_internal_error", "segfault", "unknown",
)
ROLES = ("culprit", "victim", "either")
#: kinds whose lines record a fact of the run (an interface picked, a pid's NCCL rank, an ncclras report, progress,
#: a launcher's rank announcement, a connect c10d retries, an exception the process went on after), never a
#: failure: the scanner gives them no cause, the timeline no failure
FACT_KINDS = ("interface", "nccl_rank_map", "ras_report", "progress", "rank_announce", "connect_retry", "went_on",
              "hostlist")
RETRY = ("requeue", "stop", "unknown")
#: the cause of a job whose every rank ended normally: no failure, not a failure nobody recognised
NO_FAILURE = "none"
#: the version of the `--json` object (DESIGN.md): raised when a key changes meaning or goes away
SCHEMA_VERSION = 1
#: the most ranks one `2-7`-style list may expand to, and a file's set of ranks seen may hold (a real job has at most
#: a few hundred thousand)
MAX_RANK_LIST = 1 << 20


@dataclass(frozen=True, slots=True)
class Event:
    """One fact found in a log: who said it (rank/host/pid), when, what kind, and the matched fields."""

    file: str
    line: int
    kind: str
    text: str
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    time: float | None = None
    time_family: str | None = None
    cause: str | None = None
    role: str | None = None
    signature: str | None = None
    priority: int = 0
    fields: tuple[tuple[str, str], ...] = field(default=())

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of field `name` (a named group of the signature, or a parser field)."""
        for key, value in self.fields:
            if key == name:
                return value
        return default

    def order_key(self) -> tuple[str, int]:
        """Stable order inside the input: file, then line."""
        return (self.file, self.line)

    def __reduce__(self) -> tuple:
        """Pickled as its values (workers send 100k's of events), loaded by `loaded_event`: 4.2 -> 1.4 us an event."""
        return (loaded_event, (self.file, self.line, self.kind, self.text, self.rank, self.host, self.pid,
                               self.local_rank, self.time, self.time_family, self.cause, self.role, self.signature,
                               self.priority, self.fields))


#: each field's slot setter, in field order: what `new_event` sets a new event's values with
_SET = tuple(Event.__dict__[name].__set__ for name in Event.__dataclass_fields__)
_NEW = object.__new__


def new_event(file: str, line: int, kind: str, text: str, rank: int | None = None, host: str | None = None,
              pid: int | None = None, local_rank: int | None = None, time: float | None = None,
              time_family: str | None = None, cause: str | None = None, role: str | None = None,
              signature: str | None = None, priority: int = 0,
              fields: tuple[tuple[str, str], ...] = ()) -> Event:
    """`Event(...)` for the hot paths (the scan's events, unpickling, `resolve.evolve`): the same event, built
    through its slots' setters. A frozen dataclass's `__init__` sets each field through `object.__setattr__`
    (2.7 us an event); this takes 0.9 us, and the event stays frozen for everyone else."""
    e = _NEW(Event)
    s = _SET
    s[0](e, file)
    s[1](e, line)
    s[2](e, kind)
    s[3](e, text)
    s[4](e, rank)
    s[5](e, host)
    s[6](e, pid)
    s[7](e, local_rank)
    s[8](e, time)
    s[9](e, time_family)
    s[10](e, cause)
    s[11](e, role)
    s[12](e, signature)
    s[13](e, priority)
    s[14](e, fields)
    return e


def loaded_event(file: str, line: int, kind: str, text: str, rank: int | None, host: str | None, *rest) -> Event:
    """An event a worker sent: its file and host names are the parent's own strings (`sys.intern`; the discovery
    interns each file's name, the pool its summary's), not one more copy per file: 4 MB less at 16k ranks."""
    return new_event(intern(file), line, kind, text, rank, host if host is None else intern(host), *rest)


def moved(e: Event, line: int, fields: tuple[tuple[str, str], ...]) -> Event:
    """The event at another line number (with these fields): what a file's ranges, merged, need for every event of
    a range after the first (without `dataclasses.replace`'s checks, which a big merged log would feel)."""
    return new_event(e.file, line, e.kind, e.text, e.rank, e.host, e.pid, e.local_rank, e.time, e.time_family,
                     e.cause, e.role, e.signature, e.priority, fields)


#: event fields that hold a line number of the file (a traceback's first line, the line a process went on at)
LINE_FIELDS = ("traceback_line", "went_on_line")


def is_line_number(value: str) -> bool:
    """Whether a field's value is a line number as the scan writes one (`str` of an int)."""
    return value.isascii() and value.isdigit() and str(int(value)) == value


def moved_by(e: Event, lines: int) -> Event:
    """The event `lines` further down the file: its line and the line numbers among its fields (a later range's
    events counted from the file's start, a repeated block's copies)."""
    fields = e.fields
    if any(name in LINE_FIELDS for name, _ in fields):
        fields = tuple((name, str(int(value) + lines)) if name in LINE_FIELDS and is_line_number(value)
                       else (name, value) for name, value in fields)
    return moved(e, e.line + lines, fields)



def evolve(e: Event, **changes: Any) -> Event:
    """`dataclasses.replace` for the hot path: a copy of the frozen event with `changes` (no re-validation; a name
    that is no field raises KeyError)."""
    values = list(_event_values(e))
    for name, value in changes.items():
        values[_FIELD_AT[name]] = value
    return new_event(*values)


EVENT_FIELDS = tuple(f.name for f in dataclass_fields(Event))
#: an event's values in field order, read at once (`evolve`), and each field's place among them
_event_values = attrgetter(*EVENT_FIELDS)
_FIELD_AT = {name: i for i, name in enumerate(EVENT_FIELDS)}


@dataclass(slots=True)
class SourceFile:
    """A file to scan, with what its path tells about the writer (rank, host, attempt)."""

    path: str
    display: str
    rank: int | None = None
    host: str | None = None
    local_rank: int | None = None
    attempt: int | None = None
    kind: str = "log"  # log | start_record | exit_record | job_record | elastic_error
    size: int = 0
    task_file: bool = False  # the rank came from an srun task id (a node index under torchrun)
    restart: int | None = None  # K of `attempt_N/<host>/restart_K/`; None for the usual names (`discover.restart_of`)


@dataclass(slots=True)
class FileSummary:
    """What the scanner keeps per file besides events: small and bounded."""

    file: str
    lines: int = 0
    bytes: int = 0
    tail: list[str] | tuple[str, ...] = field(default_factory=list)  #: the last lines, of the first files only
    last_line: str | None = None  #: the shape (digits deleted) of its last line, ddpslurm's and submitit's own aside
    #: the marks (8 bytes each, `file_summary.line_marks`) of the shapes of the file's last lines, oldest first
    end_marks: bytes = b""
    #: ranks the file's line prefixes name, but a log file's own rank (a scan returns an empty set frozen)
    ranks_seen: set[int] | frozenset[int] = field(default_factory=set)
    binary: bool = False
    truncated_lines: int = 0
    error: str | None = None
    match_timeouts: int = 0  # lines on which a signature's regex ran past its timeout (that signature skipped)
    torchrun: bool = False  # the file shows a torchrun agent (then srun task ids are nodes)
    ends_with_newline: bool | None = None  # its last byte, as the scan saw it (None: not known, look at the file)
    #: a byte range's scan only: lines after its end it read to finish a traceback or block open there, or a logged
    #: exception's watch (the next range reads them too, out of context; scan.merge_parts keeps this range's reading)
    read_past_end: int = 0
    #: a log srun --label merged (stream_ends): per label, its lines and its last line with its numbers masked
    streams: dict[int, tuple[int, str | None]] = field(default_factory=dict)
    #: a log srun --label merged, too big to tally its streams (stream_ends.MAX_BYTES): its ranks' ends not compared
    streams_untallied: bool = False
    #: read by the main process: its result had not come back when a worker process ended abruptly (killed: out of
    #: memory?)
    rescanned: bool = False

    def __reduce__(self) -> tuple:
        """Pickled as its values (a worker sends one per file): 5.2 -> 2.7 us a summary, sent and loaded."""
        return (FileSummary, _summary_values(self))


#: a summary's values in field order (FileSummary.__reduce__)
_summary_values = attrgetter(*FileSummary.__dataclass_fields__)

@dataclass(frozen=True)
class Evidence:
    """One log line that supports the diagnosis."""

    file: str
    line: int
    rank: int | None
    time: str | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "rank": self.rank, "time": self.time, "text": self.text}


@dataclass(frozen=True)
class RankRow:
    """One rank of the per-rank table."""

    rank: int
    host: str | None
    role: str  # culprit | victim | ok | unknown
    first_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "role": self.role, "first_error": self.first_error}


@dataclass(frozen=True)
class TimelineRow:
    """One rank on the job's time axis (for the HTML report): its first failure and its last sign of life."""

    rank: int
    host: str | None
    role: str  # culprit | victim | ok | unknown
    first_failure_time: float | None
    first_failure_text: str | None
    last_time: float | None
    exit_status: str | None
    #: how `first_failure_time` was read where the line itself has no time (report.timeline_rows); None: its own
    placed: str | None = None


@dataclass(frozen=True)
class HostEvent:
    """A line a host wrote (its GPU driver, its OOM killer, slurmstepd), for the HTML timeline's axis."""

    time: float | None
    host: str | None
    rank: int | None
    kind: str
    file: str
    line: int
    text: str


@dataclass
class Diagnosis:
    """What went wrong, who failed first, how sure, and what to do."""

    cause: str
    first_failing_rank: int | None
    first_failing_host: str | None
    confidence: str
    summary: str
    advice: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    ranks: list[RankRow] = field(default_factory=list)
    retry: str = "unknown"
    exclude_nodes: list[str] = field(default_factory=list)
    #: paths not read (or not wholly), each {"path", "reason"}: nothing is left out silently
    skipped: list[dict[str, str]] = field(default_factory=list)
    #: why this rank, what was not read, what the times could not tell (the text report and `--json`)
    notes: list[str] = field(default_factory=list)
    accounting: dict[str, Any] | None = None
    #: the attempt and in-place restart diagnosed (`read.discover.RunChoice.to_dict`): `--json`'s `run`, only for an
    #: attempt that restarted in place or a restart asked for
    run: dict[str, Any] | None = None
    #: not part of the JSON schema: per-rank times and Slurm's job-level events, for the HTML timeline
    timeline: list[TimelineRow] = field(default_factory=list)
    job_events: list[Evidence] = field(default_factory=list)
    host_events: list[HostEvent] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the `--json` object of DESIGN.md."""
        return {
            "schema_version": SCHEMA_VERSION,
            "cause": self.cause,
            "first_failing_rank": self.first_failing_rank,
            "first_failing_host": self.first_failing_host,
            "confidence": self.confidence,
            "summary": self.summary,
            "advice": list(self.advice),
            "evidence": [e.to_dict() for e in self.evidence],
            "ranks": [r.to_dict() for r in self.ranks],
            "retry": self.retry,
            "exclude_nodes": list(self.exclude_nodes),
            "skipped": [dict(s) for s in self.skipped],
            "notes": list(self.notes),
            **({"run": dict(self.run)} if self.run is not None else {}),
        }
