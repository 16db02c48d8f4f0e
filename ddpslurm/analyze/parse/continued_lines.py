"""Lines read with another line: a line and the lines waiting for their next one in, the events they make together.
The fourth layer of `FileState`. A watchdog head a log viewer or a width-limited collector cut in two, or a
launcher's report hard-wrapped before its exit code, is read together with the next line (a join). Torch's
`Last error:` line waits for its stream's next line, NCCL's own reason, which decides what the generic NCCL errors
of that stream just above mean (a refused connect, a lost peer, a full /dev/shm, not an "internal error"). While a
line is waited for, or a traceback or failure block is open, every line is read (`line_mode`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import regex

from ddpslurm.analyze.model import evolve
from ddpslurm.analyze.parse.attribution import body_rank, nccl_source
from ddpslurm.analyze.parse.failure_blocks import FailureBlocks
from ddpslurm.analyze.parse.line_streams import UNPREFIXED
from ddpslurm.analyze.parse.tracebacks import IDLE_PER_STREAM, ElasticBlock
from ddpslurm.analyze.rules.signatures import Signature

#: torch's line before NCCL's own reason (ProcessGroupNCCL's getNcclErrorDetailStr, torch 1.13+)
LAST_ERROR = "Last error:"
#: how many lines above `Last error:` the NCCL error it explains may start (message, interpretation, head)
LAST_ERROR_REACH = 4
#: lines (of any stream) after which a `Last error:` whose rank never wrote its reason is given up
PENDING_REACH = 50
#: the groups a launcher's report ends with (torchelastic's exit code, Open MPI's signal): a head that matched
#: without them may be hard-wrapped before them, and is read with the next line
WRAPPED_TAILS = ("exitcode", "signum")
#: a watchdog head a log viewer or a width-limited collector cut in two: read together with the next line
WRAPPED_HEAD = re.compile(r"(?:detected by watchdog at work|Watchdog caught collective operation timeout)(?!.*"
                          r"(?:last completed (?:NCCL )?work: -?\d|milliseconds))")


@dataclass(frozen=True)
class _Pending:
    what: str  # last_error | join
    stream: object
    line: int
    text: str
    time_text: str | None = None
    signature: str | None = None  #: a join's head matched this signature without its tail (the exit code)
    #: how many events the file had when the head was read: the head's own events come after (a join drops them)
    events_at: int = 0
    #: a `Last error:` line's place among the lines read, in all and of its stream (LineStreams.handled)
    handled: int = 0
    own: int = 0


@dataclass
class ContinuedLines(FailureBlocks):
    """The lines waiting for the next one (a wrapped head, torch's `Last error:`), and a line's signature event,
    which may leave one waiting: the fourth layer of `FileState`."""

    #: a wrapped head: its meaning is on the next line
    pending: _Pending | None = None
    #: torch's `Last error:` lines waiting for their stream's next line (NCCL's reason), oldest first
    waiting: dict[object, _Pending] = field(default_factory=dict)

    @property
    def line_mode(self) -> bool:
        """Whether every line is read now: a traceback or failure block open, a line waited for, a logged exception
        watched (asked per candidate line: the containers are tested directly, not through a call each)."""
        return bool(self.tracebacks.open or self.elastic or self.waiting or self.watching) or self.pending is not None

    @property
    def must_read_on(self) -> bool:
        """Whether a line's reading is part of something still open that later lines complete: a traceback or
        block open, a line waited for (a watched exception is not: its lines are each read on their own, and a line
        of a known shape may be replayed)."""
        return bool(self.tracebacks.open or self.elastic or self.waiting) or self.pending is not None

    def _match_line(self, body: str, lineno: int, time_text: str | None, rank: int | None, local: int | None,
                    host: str | None, stream: object) -> tuple[Signature, regex.Match] | None:
        """The signature event of one line (a fact of its kind, or a failure), if any signature matches; the match."""
        hit = self.sigs.match(body)
        if (hit is None or hit[0].kind != "watchdog_timeout") and WRAPPED_HEAD.search(body):
            self.pending = _Pending("join", stream, lineno, body, time_text, events_at=len(self.events))
        if hit is None:
            return None
        sig, m = hit
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        tails = [g for g in WRAPPED_TAILS if g in m.re.groupindex]
        if sig.kind == "agent_failed" and tails and not any(g in groups for g in tails):
            # a launcher's report hard-wrapped before its exit code or signal (a terminal, a paste, PRRTE's help
            # text): the next line may end it
            self.pending = _Pending("join", stream, lineno, body, time_text, signature=sig.id,
                                    events_at=len(self.events))
        emitted = self._signature_event(sig, groups, body, lineno, time_text, rank, local, host, nccl_source(body),
                                        body_rank(body))
        if emitted and "ChildFailedError" in body:
            self.elastic.setdefault(stream, ElasticBlock()).start()
        return hit

    def _follow(self, pending: _Pending, body: str, stream: object, lineno: int) -> bool:
        """The line after a wrapped head: True when it was read as that line's rest."""
        if lineno - pending.line > PENDING_REACH:
            return False
        if pending.what == "join":
            joined = f"{pending.text} {body.strip()}"
            hit = self.sigs.match(joined)
            wanted = hit is not None and (hit[0].id == pending.signature if pending.signature
                                          else hit[0].kind == "watchdog_timeout")
            if not wanted or lineno - pending.line > 1 or (pending.signature and not any(
                    hit[1].groupdict().get(g) for g in WRAPPED_TAILS)):
                return False
            # the head's own events, read alone: only those after the mark (a merged log of 16k ranks' wrapped
            # heads made the whole list filtered once per head, quadratic)
            self._rewrote(pending.events_at)
            self.events[pending.events_at:] = [e for e in self.events[pending.events_at:] if e.line != pending.line]
            with self._speaking_for(pending.stream) as (rank, local, host):
                self._match_line(joined, pending.line, pending.time_text, rank, local, host, pending.stream)
            self.pending = None
            return True
        return False

    def _await_reason(self, stream: object, lineno: int, body: str) -> None:
        """Torch's `Last error:` line: it waits for its stream's next line, NCCL's reason (`_reason_of`), in place
        of a `Last error:` of that stream waiting still, and as the newest of those waiting."""
        self.waiting.pop(stream, None)
        self.waiting[stream] = _Pending("last_error", stream, lineno, body, handled=self.handled,
                                        own=self.stream_lines[stream])

    def _reason_of(self, stream: object, body: str, lineno: int) -> bool:
        """Whether this line is NCCL's reason after its stream's `Last error:` (then it explains that stream's
        errors). A `Last error:` whose stream wrote nothing more is given up after PENDING_REACH lines, or
        IDLE_PER_STREAM per stream the log interleaves, whichever is more."""
        reach = max(PENDING_REACH, IDLE_PER_STREAM * len(self.streams))
        while self.waiting:
            first = next(iter(self.waiting.values()))
            if lineno - first.line <= reach:
                break
            del self.waiting[first.stream]
        pending = self.waiting.pop(stream, None)
        if pending is None and stream == UNPREFIXED:
            pending = self._continued(lineno)
        if pending is None:
            return False
        if not self._explain_last_error(body.strip(), lineno, pending):
            with self._speaking_for(pending.stream) as (rank, local, host):  # nothing generic above: a line of its own
                self._match_line(body, lineno, None, rank, local, host, pending.stream)
        return True

    def _continued(self, lineno: int) -> _Pending | None:
        """The `Last error:` of another stream on the line just above an unprefixed line: that line is its reason
        (the continuation of the same message)."""
        for owner, pending in self.waiting.items():
            if pending.line == lineno - 1:
                return self.waiting.pop(owner)
        return None

    def _explain_last_error(self, reason: str, lineno: int, pending: _Pending) -> int:
        """NCCL's own reason (the line after torch's `Last error:`) decides what the generic NCCL error lines
        of the same stream just above it mean: a refused connect, a lost peer, a full /dev/shm, not an "internal
        error". "Just above" is LAST_ERROR_REACH lines of that stream: the lines between, less the other streams'
        lines read between (an interleaved log of many ranks puts theirs in between). Returns how many it explained."""
        hit = self.sigs.match(reason)
        generic = []
        for record in reversed(self.generic.get(pending.stream, ())):
            index, handled, own, e = record
            if index >= len(self.events) or self.events[index] is not e:
                continue  # dropped since (a joined head's own reading)
            others = (pending.handled - handled) - (pending.own - own)
            if e.line < pending.line and pending.line - e.line - others <= LAST_ERROR_REACH:
                generic.append((index, record))
        for i, record in generic:
            e = self.events[i]
            self._rewrote(i)
            kept = tuple(f for f in e.fields if f[0] != "accuses")  # `_emit` put it last: it stays last
            if hit is None:
                accuses = tuple(f for f in e.fields if f[0] == "accuses")
                self.events[i] = record[3] = evolve(e, fields=(*kept, ("last_error", reason[:500]), *accuses))
                continue
            sig, m = hit
            groups = tuple(sorted((k, v) for k, v in m.groupdict().items() if v is not None))
            self.events[i] = record[3] = evolve(
                e, cause=sig.cause, role=sig.role, signature=sig.id, priority=sig.priority,
                fields=(*kept, *groups, ("last_error", reason[:500]), ("accuses", sig.accuses)))
        return len(generic)
