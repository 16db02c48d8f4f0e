"""Tracebacks and torchelastic failure blocks: a stream's lines in, the events of the blocks they make up out.
The third layer of `FileState`. A Python traceback (`TracebackAssembler`) or torchelastic's failure block
(`ElasticBlock`, the agent's `Root Cause` report after a `ChildFailedError`) spans many lines, read whole while it
is open (line mode): its event is made when it ends, for the stream that wrote it, or at the file's end (`finish`).
A block's entries that failed alike in the same second are made equals (`tied_roots`): the agent's choice of one of
them as root cause tells nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpslurm.analyze.parse.line_events import LineEvents, small_int
from ddpslurm.analyze.parse.tracebacks import (
    CUT_TRACEBACK,
    ElasticBlock,
    Exc,
    TracebackAssembler,
    in_library,
)
from ddpslurm.analyze.rules.signatures import ROOT_CAUSE_HEADER

_DIGITS = re.compile(r"\d+")


@dataclass
class FailureBlocks(LineEvents):
    """The tracebacks and failure blocks a file's streams have open: the third layer of `FileState`."""

    tracebacks: TracebackAssembler = field(default_factory=TracebackAssembler)
    #: torchelastic failure blocks being read, by the stream that wrote them (agents of a merged log report at once)
    elastic: dict[object, ElasticBlock] = field(default_factory=dict)

    def _elastic_line(self, body: str, lineno: int, stream: object, host: str | None) -> bool:
        """Feed a line to its stream's open failure block, or to one it opens (a block whose head is not in the
        input: its header line); the events of the entries that block finished. Whether the block took the line."""
        block = self.elastic.get(stream) if self.elastic else None
        if block is None and ROOT_CAUSE_HEADER in body and body.lstrip().startswith(ROOT_CAUSE_HEADER):
            # a block whose head is not in the input (a substring test first: no copy of every line read)
            block = self.elastic[stream] = ElasticBlock()
            block.start()
        if block is None:
            return False
        consumed, entries = block.feed(body, lineno)
        if not block.active:
            del self.elastic[stream]
        for entry in tied_roots(entries):
            self._elastic_event(entry, host)
        return consumed

    def _exception(self, exc: Exc, stream: object) -> None:
        """The event of a finished traceback, for the stream that wrote it."""
        with self._speaking_for(stream) as (rank, local, host):
            self._exception_event(exc, stream, rank, local, host)

    def _exception_event(self, exc: Exc, stream: object, rank: int | None, local: int | None,
                         host: str | None) -> None:
        extra = (("where", exc.where),) if exc.where else ()
        extra += (("traceback_line", str(exc.start_line)),)
        if exc.cut:  # no exception line: the traceback says that this stream raised, not what
            if rank is not None and not in_library(exc.where):  # inside a library call a victim's reads the same
                self._emit(exc.line, "exception", exc.text, rank, host, None, local, None,
                           sig=self.sigs.by_id(CUT_TRACEBACK), fields=extra, stream=stream)
            return
        hit = self.sigs.match(exc.text)
        if exc.wrapped_by:
            extra += (("wrapped_by", exc.wrapped_by),) + ((("wrapped_process", exc.process),) if exc.process else ())
        if hit:
            sig, m = hit
            groups = tuple(sorted((k, v) for k, v in m.groupdict().items() if v is not None))
            kind = sig.kind if sig.kind != "signature" else "exception"
            if local is None:  # a launcher's exception naming its child (spawn's 'process N terminated ...')
                local = small_int(m.groupdict().get("local_rank"))
            self._emit(exc.line, kind, exc.text, rank, host, None, local, None, sig=sig, fields=groups + extra,
                       stream=stream)
        else:
            sig = self.sigs.by_id("python-exception")
            self._emit(exc.line, "exception", exc.text, rank, host, None, local, None, sig=sig, fields=extra,
                       stream=stream)
        if "ChildFailedError" in exc.text:
            self.elastic.setdefault(stream, ElasticBlock()).start()

    def _elastic_event(self, entry: dict[str, str], host: str | None) -> None:
        from ddpslurm.analyze.parse.timestamps import parse_record_time

        sig_id = "elastic-root-cause" if entry.get("section") in ("root", "tied") else "elastic-other-failure"
        sig = self.sigs.by_id(sig_id)
        rank = small_int(entry.get("rank"))
        local = small_int(entry.get("local_rank"))
        pid = small_int(entry.get("pid"))
        when = parse_record_time(entry.get("time", "")) if entry.get("time") else None
        text = entry.get("exception") or entry.get("traceback") or f"exitcode {entry.get('exitcode')}"
        fields = tuple(sorted((k, v) for k, v in entry.items() if k not in ("line",)))
        rank = rank if rank is not None and rank >= 0 else None
        self._emit(int(entry.get("line", "0")), "elastic_failure", text, rank,
                   entry.get("host") or host, pid, local, None, sig=sig, fields=fields, time=when,
                   family="iso" if when is not None else None)

    def finish(self) -> None:
        for stream, block in list(self.elastic.items()):
            host = (self.streams.get(stream) or (None, None, None))[2] or self.source.host
            for entry in tied_roots(block.finish()):
                self._elastic_event(entry, host)
        self.elastic.clear()
        for stream, exc in self.tracebacks.close_all():
            self._exception(exc, stream)


def tied_roots(entries: list[dict[str, str]]) -> list[dict[str, str]]:
    """A torchelastic failure block's entries, its root cause and the entries that failed alike in the same second
    made equals (section `tied`). The agent names as root the failure with the earliest timestamp, in whole seconds,
    the lowest rank among equals (ChildFailedError.get_first_failure): a root whose second and exit code are
    another entry's, and its error too (pids aside) where both tell one, is the first of several alike by its
    number alone. Entries that show no time (a paste without them) cannot be ordered either."""
    roots = [e for e in entries if e.get("section") == "root"]
    tied = [e for e in entries if any(e is not root and _alike(e, root) for root in roots)]
    if not tied:
        return entries
    tied += [root for root in roots if any(_alike(e, root) for e in tied)]
    return [{**e, "section": "tied"} if any(e is t for t in tied) else e for e in entries]


def _alike(a: dict[str, str], b: dict[str, str]) -> bool:
    """Two failure entries the agent could not order: the same second (or neither shows one), the same exit code,
    and the same error where both tell one (a cut paste may lose an entry's last lines)."""
    told = [_DIGITS.sub("N", e.get("exception") or e.get("traceback") or "") for e in (a, b)]
    return (a.get("time") == b.get("time") and a.get("exitcode") is not None and a.get("exitcode") == b.get("exitcode")
            and (told[0] == told[1] or not all(told)))
