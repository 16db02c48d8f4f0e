"""events -> verdict: resolve ranks, refine events, build the per-rank timeline, weigh the producers' votes.

The three stages each test on their own (DESIGN.md, Analyze): `timeline.build_timeline` (pure),
`producers.PRODUCERS` (evidence as weighted votes) and `combiner.combine` (one answer, or none).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ddpslurm.analyze.diagnose.combiner import Verdict, combine
from ddpslurm.analyze.diagnose.resolve import resolve
from ddpslurm.analyze.diagnose.timeline import JobTimeline, build_timeline
from ddpslurm.analyze.model import FACT_KINDS, Event, FileSummary, SourceFile, evolve
from ddpslurm.analyze.parse.records import SIGNAL_CAUSES, SIGNAL_NAMES
from ddpslurm.analyze.parse.tracebacks import CUT_TRACEBACK
from ddpslurm.analyze.rules.loading import default_accuses
from ddpslurm.analyze.rules.signatures import SignatureSet


def judge(events: list[Event], sources: Sequence[SourceFile], summaries: Sequence[FileSummary],
          sigs: SignatureSet, facts_in: dict[str, Any] | None = None) -> tuple[Verdict, JobTimeline]:
    """The verdict on one job (or one pasted log) from all its events, and the timeline it was read from (the list
    is updated in place: an event replaced is freed at once, and a 16k-rank job's events are not held twice)."""
    events, facts = resolve(events, sources, summaries, facts_in or {})
    accuses = {s.id: s.accuses for s in sigs.signatures}
    for i, e in enumerate(events):
        found = with_accuses(refine_exit(e), accuses)
        if found is not e:
            events[i] = found
    events = teardown_kills(events)
    events = agents_went_on(events, sigs.went_on.agent_survives,
                            frozenset(s.file for s in summaries if s.torchrun))
    events = stuck_after_own_timeout(events)
    events = cut_tracebacks_told_otherwise(events)
    events = weaken_cut_lines(events, cut_last_lines(events, sources, summaries))
    timeline = build_timeline(events, facts, sources, summaries)
    verdict = combine(timeline, frozenset(c for c, info in sigs.causes.items() if info.node_level))
    return verdict, timeline


def with_accuses(e: Event, accuses: dict[str, str]) -> Event:
    """The event with its signature's `accuses` among its fields (records: from their role)."""
    if e.role is None or e.get("accuses"):
        return e
    who = accuses.get(e.signature or "") or default_accuses(e.role, "", e.kind, e.cause or "unknown")
    return evolve(e, fields=(*e.fields, ("accuses", who)))


def cut_last_lines(events: list[Event], sources: Sequence[SourceFile],
                   summaries: Sequence[FileSummary]) -> set[tuple[str, int]]:
    """(file, line) of failure lines that end their log without a newline: a log cut mid-line (a node that
    died, a paste cut short); torchelastic's one-line error.json, parsed whole, is not. The scan tells each file's
    last byte; a file it does not tell of is looked at, when its last line holds a failure (one byte)."""
    last = {s.file: s.lines for s in summaries if s.lines}
    whole = {s.file: s.ends_with_newline for s in summaries}
    on_last = {e.file for e in events if e.role is not None and last.get(e.file) == e.line}
    out = set()
    for source in sources:
        if source.display not in on_last or source.kind != "log":  # a record parsed whole is not cut
            continue
        ends = whole.get(source.display)
        if not (ends if ends is not None else _ends_with_newline(source.path)):
            out.add((source.display, last[source.display]))
    return out


def _ends_with_newline(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
    except OSError:
        return True  # unreadable now: say nothing about it


def weaken_cut_lines(events: list[Event], cut: set[tuple[str, int]]) -> list[Event]:
    """A failure line cut mid-way may have lost what named it: it counts as an `either` line (weak evidence). A line
    only the catch-all exception signature read (priority 0) says no cause either: its type survived, but the message
    that tells a victim's `RuntimeError: [...] Connection closed by peer` from a bug of the script's own did not."""
    if not cut:
        return events
    return [evolve(e, role="either", priority=0, cause="unknown" if _catch_all(e) else e.cause)
            if (e.file, e.line) in cut and e.role == "culprit" else e for e in events]


def _catch_all(e: Event) -> bool:
    return e.kind == "exception" and e.priority == 0


#: signals a job's teardown sends (srun, the agent, Slurm's cancel): a process they kill did not fail on its own
TEARDOWN_SIGNALS = ("Terminated", "SIGTERM", "Interrupt", "SIGINT", "Hangup", "SIGHUP")


def teardown_kills(events: list[Event]) -> list[Event]:
    """A failure line about a process killed by a teardown signal (a DataLoader worker `killed by signal:
    Terminated`), and the other lines about the same pid, are the teardown reaching the rank: victims."""
    torn = {(e.rank, e.file, e.get("worker_pids")) for e in events
            if e.get("signal") in TEARDOWN_SIGNALS and e.get("worker_pids")}
    if not torn:
        return events
    return [as_victim(e) if e.role in ("culprit", "either") and (e.rank, e.file, e.get("worker_pids")) in torn else e
            for e in events]


#: events with a rank that no worker of an agent writes: srun's and Slurm's lines name tasks and the job
_NOT_A_WORKER = ("slurm_task", "slurm_job")
#: events that only an agent's workers, or the agent's reports of them, make: its workers ran
_WORKER_KINDS = ("agent", "agent_failed", "agent_sigterm", "elastic_failure", "nccl_init", "nccl_rank_map",
                 "watchdog_timeout", "peer_lost", "rank_announce")


def agents_went_on(events: list[Event], survivable: frozenset[str], torchrun_files: frozenset[str]) -> list[Event]:
    """A launcher agent's log line of a failure it may survive (`WentOn.agent_survives`: c10d's store bind failures,
    logged, not raised) is no failure when the job's workers ran: a store that no agent could serve leaves no
    worker to start, so any worker's line (in any file: an agent's stderr and stdout are two) says the agent went
    on. The agent's lines carry no rank of their own (under torchrun, an srun task's id is its node's)."""
    def by_agent(e: Event) -> bool:
        return e.local_rank is None and (e.rank is None or
                                         (e.file in torchrun_files and e.get("srun_task") is not None))

    def by_worker(e: Event) -> bool:
        if e.kind in _NOT_A_WORKER or e.signature in survivable or (e.kind in FACT_KINDS and e.rank is None):
            return False
        return e.kind in _WORKER_KINDS or e.local_rank is not None or (e.rank is not None and not by_agent(e))

    candidates = [i for i, e in enumerate(events) if e.signature in survivable and e.kind != "exception"
                  and e.cause is not None and by_agent(e)]
    if not candidates or not any(by_worker(e) for e in events):
        return events
    out = list(events)
    for i in candidates:
        e = out[i]
        kept = tuple(f for f in e.fields if f[0] != "accuses")
        out[i] = replace(e, kind="went_on", cause=None, role=None, fields=(*kept, ("went_on", "workers-ran")))
    return out


#: a launcher (torchelastic, DeepSpeed, mpirun) reporting the worker that died first of this signal: SIGABRT is
#: the worker's own abort (an assertion, a C++ enforce) as often as its NCCL watchdog's, so it is not a victim
LAUNCHER_SIGNAL_ROLES = {"SIGABRT": "either"}


def stuck_after_own_timeout(events: list[Event]) -> list[Event]:
    """ProcessGroupNCCL's heartbeat monitor ('watchdog got stuck for N seconds') on a rank whose own watchdog timed
    out a collective: the watchdog thread hung in the timeout's teardown (dumping, aborting the communicator), the
    monitor fired N seconds later. A consequence of that rank's wait, not a hang of its own: a victim's line."""
    timed_out = {e.rank for e in events if e.kind == "watchdog_timeout" and e.rank is not None}
    if not timed_out:
        return events
    return [as_victim(e) if e.kind == "hang" and e.rank in timed_out and e.role in ("culprit", "either") else e
            for e in events]


def cut_tracebacks_told_otherwise(events: list[Event]) -> list[Event]:
    """A traceback cut before its exception line says only that its rank raised. Where that rank has a failure line
    of its own elsewhere (the traceback's rest in a second file, a rotated or split log; a victim's timeout whose
    traceback was cut; its exit record), that line tells what happened, and the cut one is dropped."""
    if not any(e.signature == CUT_TRACEBACK for e in events):
        return events
    told = {e.rank for e in events if e.role is not None and e.rank is not None and e.signature != CUT_TRACEBACK}
    return [e for e in events if e.signature != CUT_TRACEBACK or e.rank not in told]


def as_victim(e: Event) -> Event:
    """`e` as a victim's line that accuses nobody (a consequence of another failure, not a failure of its own)."""
    return replace(e, role="victim", fields=(*[f for f in e.fields if f[0] != "accuses"], ("accuses", "none")))


def refine_exit(e: Event) -> Event:
    """A torchelastic agent's failure entry: its cause and role follow the worker's exit code or signal."""
    if e.kind not in ("agent_failed", "elastic_failure"):
        return e
    code = e.get("exitcode") or ""
    signal = e.get("signal")
    signum = e.get("signum") or ""
    if signum.isdigit() and len(signum) < 4:  # a launcher that prints the signal's number (mpirun)
        signal = signal or SIGNAL_NAMES.get(int(signum), f"signal {signum}")
    if code.lstrip("-").isdigit() and len(code) < 6 and int(code) < 0:
        signal = signal or SIGNAL_NAMES.get(-int(code), f"signal {-int(code)}")
    root = e.kind != "elastic_failure" or e.get("section") in ("root", "tied")  # tied: alike roots (scan.tied_roots)
    if signal:
        cause, role = SIGNAL_CAUSES.get(signal, ("unknown", "either"))
        role = LAUNCHER_SIGNAL_ROLES.get(signal, role) if root else role
        if not root:
            role = "victim" if role != "culprit" else "either"
        return replace(e, cause=cause, role=role)
    if not root:
        return replace(e, role="either", priority=min(e.priority, 8))
    if (code.isdigit() or not code) and not _recorded_exception(e):  # an exit code (or none) says it failed, not why
        return replace(e, cause="unknown", role="either")
    return e


def _recorded_exception(e: Event) -> bool:
    """The agent's entry carries the worker's exception (error.json), not only its exit code."""
    return bool(e.get("exception")) or "Traceback" in (e.get("traceback") or "")
