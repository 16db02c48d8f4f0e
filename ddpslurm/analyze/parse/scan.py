"""Streaming scan of log files: bounded chunks, a cheap anchor prefilter, then per-line parsing.

A file is read in binary, in chunks of `CHUNK` bytes, cut at line ends; overlong lines are truncated
to `MAX_LINE` bytes (the rest is skipped without being held in memory). Only lines containing one of the
signature set's anchors are decoded and parsed, except inside a traceback or a torchelastic failure block,
where every line is read until the block ends. A line whose shape (its digits written as 0) was read before is
replayed from the spans its first reading left (`LineRecipe`), or skipped when that shape can say nothing (inert
lines). Per-file state is small; files are scanned in parallel worker processes when the input is large, and
their events merged in input order.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import functools
import gc
import itertools
import os
import re
import stat
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import regex

from ddpslurm.analyze.diagnose.resolve import MAX_RANK_LIST
from ddpslurm.analyze.model import FACT_KINDS, Event, FileSummary, SourceFile, moved, new_event
from ddpslurm.analyze.parse import stream_ends
from ddpslurm.analyze.parse.attribution import (
    BODY_RANK,
    NCCL_SOURCE,
    Prefix,
    PrefixSpans,
    Span,
    body_rank,
    clean,
    interface_list,
    interface_scope,
    nccl_source,
    number,
    piece,
    prefix_spans,
)
from ddpslurm.analyze.parse.timestamps import EVERY_FORM, TimePlan, parse_planned, parse_time, time_plan
from ddpslurm.analyze.parse.tracebacks import (
    CUT_TRACEBACK,
    IDLE_PER_STREAM,
    ROOT_CAUSE_HEADER,
    ElasticBlock,
    Exc,
    TracebackAssembler,
    in_library,
)
from ddpslurm.analyze.read import line_count
from ddpslurm.analyze.read.discover import METADATA_THREADS, round_trips
from ddpslurm.analyze.read.line_count import newlines
from ddpslurm.analyze.read.prefilter import TUNE_SAMPLE_BYTES, candidate_starts, tune
from ddpslurm.analyze.rules.digit_shape import shape
from ddpslurm.analyze.rules.signatures import HEAD_ANCHORS, PLANNED_CHARS, Signature, SignatureSet, memo_key, remember

CHUNK = 4 << 20
MAX_LINE = 16 * 1024
TAIL_LINES = 6
PARALLEL_MIN_BYTES = 8 << 20
#: inputs from this size on have the prefilter's anchor order timed on a sample of them first (prefilter.tune: ~8 ms
#: for 48 anchors in one automaton; 57 ms for the 73 of 2026-11-28 in two, 4.3 ms to build each of its 8 candidates,
#: which timed on and off alternately broke even on the 1 GB job and won 3% of the 0.59 GB torchrun one's wall)
TUNE_MIN_BYTES = 64 << 20
SPLIT_MIN_BYTES = 32 << 20
#: the most ranges one file is cut into: ranges of SPLIT_MIN_BYTES up to this many, so that the workers share a file
#: whose costly lines sit in one part (a merged log's NCCL start-up of every rank at its head) and not only its bytes
MAX_RANGES = 64
OVERRUN_BYTES = 4 << 20
HEAD_BYTES = 64 << 10
#: seconds one file may take to read (a hung network filesystem, an endless pseudo-file): then the rest is skipped
READ_DEADLINE = 300.0
HEAD_ANCHOR_BYTES = tuple(a.encode() for a in HEAD_ANCHORS)

_NCCL_INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
                        r"(?: cudaDev (?P<dev>\d+))?.*?Init (?P<stage>COMPLETE|START)")
#: `_NCCL_INIT` with NCCL's `0x` read as any digit: no line of a shape it cannot match is an init line
_NCCL_INIT_ANY_DIGIT = re.compile(_NCCL_INIT.pattern.replace("0x", r"\dx"))
_TORCHRUN = re.compile(r"torchrun|torch\.distributed\.run|elastic/agent")
_RESTART = re.compile(r"SLURM_RESTART_COUNT\s*[=:]\s*(\d+)")
#: NCCL's per-channel connection line with its direction (facts.toml `nccl-rank-map-channel`): the NCCL rank of the
#: printing process is the sender's on [send], the receiver's on [receive]
_CHANNEL_LINE = re.compile(rb" NCCL INFO Channel \d+(?:/\d+)? : (\d+)\[[0-9a-fA-F]+\] -> (\d+)\[[0-9a-fA-F]+\] "
                           rb"\[(send|receive)\] via")
#: distinct (line head, NCCL rank) pairs a file remembers to skip repeated channel lines: one per process and
#: communicator (a merged log of a 16k-rank job holds 16k; at 10,000 its channel lines past them were each read in
#: full, 8.0 -> 5.8 s for its start-up part); past this a line is read, not skipped, so nothing is lost
MAX_CHANNEL_KEYS = 1_000_000


def channel_key(head: bytes, m: re.Match[bytes]) -> tuple[bytes, bytes]:
    """What a channel line `_CHANNEL_LINE` matched tells: its head (the bytes before the match) and the printing
    process's NCCL rank (the sender's on [send], the receiver's on [receive])."""
    return head, m[1] if m[3] == b"send" else m[2]
_SUBMITIT_ENV = re.compile(r"JobEnvironment\(job_id=[^,]*, hostname=(?P<host>[^,]+), local_rank=(?P<local>\d+)\(\d+\), "
                           r"node=(?P<node>\d+)\(\d+\), global_rank=(?P<rank>\d+)\((?P<world>\d+)\)\)")


_SLURM_HEAD = re.compile(r"^(?:srun|slurmstepd|slurmd|sbatch)(?:-[\w.-]+)?: ")


def body_is_slurm(text: str) -> bool:
    """Lines written by srun/slurmstepd into a task's output file."""
    return bool(_SLURM_HEAD.match(text))


def mentions_torchrun(body: str) -> bool:
    """Whether a line mentions torchrun or its agent (`_TORCHRUN`), its words looked for first: the search tries
    the three alternatives at every position of every line read in full (1-1.5 us; the words, 0.1)."""
    return ("torch" in body or "elastic/agent" in body) and _TORCHRUN.search(body) is not None


_CONTROL_BYTES = bytes(b for b in range(32) if b not in (8, 9, 10, 12, 13, 27)) + b"\x7f"


#: a run of NULs this long is a hole (what a node crash leaves at the end of a log on NFS/Lustre), not binary data
_NUL_RUN = re.compile(rb"\x00{16,}")


def is_binary(head: bytes) -> bool:
    """Heuristic: NUL bytes or mostly non-text bytes in the first block, zero-filled holes aside."""
    if b"\x00" in head:
        head = _NUL_RUN.sub(b"", head)
    if not head:
        return False
    if head.count(b"\x00") > max(1, len(head) // 100):
        return True
    control = len(head) - len(head.translate(None, _CONTROL_BYTES))
    return control / len(head) > 0.1


#: the read buffer a process reuses for every file it scans (a fresh 4 MB per read costs more than reading it)
_BUFFER: list[bytearray] = []


def _read_buffer(size: int) -> bytearray:
    """A buffer of at least `size` bytes, taken from the process's spare one when it is free (give it back with
    `_BUFFER.append`); a nested reader gets a fresh one."""
    if _BUFFER and len(_BUFFER[-1]) >= size:
        return _BUFFER.pop()
    return bytearray(size)


def iter_blocks(handle, chunk: int = CHUNK, max_line: int = MAX_LINE
                ) -> Iterator[tuple[bytes | bytearray, int, int]]:
    """Blocks of complete lines from a binary handle (`readinto`, `seek`, `tell`): `(buffer, end, truncated)`,
    where `buffer[:end]` are whole lines, each ending with b'\\n', and `truncated` counts the lines cut at
    `max_line` bytes (their rest is skipped without being held in memory).

    Nothing is copied: the buffer is read into and reused, so it is valid only until the next block is asked for,
    and the bytes after `end` are not lines of this block (a partial line is read again with the next block).
    """
    buf = _read_buffer(chunk)
    view = memoryview(buf)[:chunk]
    try:
        yield from _blocks(handle, buf, view, max_line)
    finally:
        _BUFFER.append(buf)


def _blocks(handle, buf: bytearray, view: memoryview, max_line: int) -> Iterator[tuple[bytes | bytearray, int, int]]:
    discarding = False  # inside an overlong line whose first max_line bytes were yielded
    while True:
        got = handle.readinto(view)
        if not got:
            return
        if discarding:
            nl = buf.find(b"\n", 0, got)
            if nl >= 0:
                discarding = False
                handle.seek(handle.tell() - got + nl + 1)
            continue
        last = buf.rfind(b"\n", 0, got)
        if last < 0:
            if got > max_line:
                yield bytes(view[:max_line]) + b"\n", max_line + 1, 1
                discarding = True
                continue
            piece = bytes(view[:got])  # an unterminated piece: the file's last line, unless more follows
            handle.seek(handle.tell() - got)
            more = _read_more(handle, view, got)
            if more <= got:
                yield piece + b"\n", got + 1, 0
                return
            handle.seek(handle.tell() - more)
            continue
        rest = got - last - 1
        if rest > max_line:
            yield buf, last + 1, 0
            yield bytes(view[last + 1:last + 1 + max_line]) + b"\n", max_line + 1, 1
            discarding = True
            continue
        if rest:
            handle.seek(handle.tell() - rest)
        yield buf, last + 1, 0


def _read_more(handle, view: memoryview, had: int) -> int:
    """Read again from a piece of `had` bytes without a line end: how many bytes are there now (the file may grow)."""
    total = 0
    while total < len(view):
        got = handle.readinto(view[total:])
        if not got:
            break
        total += got
        if total > had:
            break
    return total


#: the stream of a line without a prefix of its own
UNPREFIXED = (None, None, None)
#: the lines torch's NCCL error message continues on after its first (ProcessGroupNCCL: "NCCL error ..., NCCL version
#: V" + getNcclErrorDetailStr: "\nncclRemoteError: <what it means>" + "\nLast error:\n<NCCL's reason>"); a log line
#: prefix (`[rankR]:`) is put on the message's first line only
_CONTINUATION = re.compile(r"nccl[A-Z]\w*Error: |Last error:\s*$")


def continues(body: str) -> bool:
    """Whether a line is one torch's NCCL error message continues on (its reason: `_FileState._continued`)."""
    return _CONTINUATION.match(body) is not None
#: torch's line before NCCL's own reason (ProcessGroupNCCL's getNcclErrorDetailStr, torch 1.13+)
LAST_ERROR = "Last error:"
#: how many lines above `Last error:` the NCCL error it explains may start (message, interpretation, head)
LAST_ERROR_REACH = 4
#: lines (of any stream) after which a `Last error:` whose rank never wrote its reason is given up
PENDING_REACH = 50
#: signatures that only say "NCCL failed"; the `Last error:` reason replaces their meaning
GENERIC_NCCL_SIGNATURES = ("nccl-internal-error", "nccl-unhandled-cuda-error", "distributed-library-exception",
                           "python-exception", "nccl-warn-other")
#: a watchdog head a log viewer or a width-limited collector cut in two: read together with the next line
WRAPPED_HEAD = re.compile(r"(?:detected by watchdog at work|Watchdog caught collective operation timeout)(?!.*"
                          r"(?:last completed (?:NCCL )?work: -?\d|milliseconds))")


#: raw lines of at most this many bytes may be remembered as saying nothing (SignatureSet.inert_lines), and so many
MAX_INERT = 50_000
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")

#: values a worker shares between its events instead of holding one copy per line (hosts, field pairs, whole
#: field tuples: 16k ranks' alike watchdog lines); bounded, so that a log of unique values cannot grow it
_CANONICAL: dict = {}
MAX_CANONICAL = 200_000


def canonical(value):
    """One shared object for equal values (their pickle then carries one copy per batch, not one per event)."""
    if value is None:
        return None
    found = _CANONICAL.get(value)
    if found is not None:
        return found
    remember(_CANONICAL, value, value, MAX_CANONICAL)
    return value


def canonical_fields(fields: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """`fields` made of shared pairs (a rank's number differs, its op, timeout and sequence number do not)."""
    memo = _CANONICAL
    found = memo.get(fields)
    if found is not None:
        return found
    if len(memo) + len(fields) >= MAX_CANONICAL:
        memo.clear()  # as `remember` does, once for the pairs and the tuple
    shared = tuple([memo.setdefault(pair, pair) for pair in fields])
    return memo.setdefault(shared, shared)


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
    #: a `Last error:` line's place among the lines read, in all and of its stream (_FileState.handled)
    handled: int = 0
    own: int = 0


def small_int(text: str | None) -> int | None:
    """A rank, local rank or pid written in a log: a non-negative int of at most 18 digits, else None (int() of a
    number the log made up may be huge or refused outright)."""
    return int(text) if text and len(text) <= 18 and text.isascii() and text.isdigit() else None


def interface_fields(body: str, ifname: str, ip: str) -> dict[str, str]:
    """`scope` of the interface a `Using` line names first, and every interface it lists (`ifnames`)."""
    listed = interface_list(body) or [(ifname, ip)]
    return {"scope": interface_scope(ifname, ip), "ifnames": ",".join(name for name, _ip in listed),
            "scopes": ",".join(interface_scope(name, addr) for name, addr in listed)}


#: raw line shapes a process remembers how to replay (SignatureSet.line_recipes)
MAX_RECIPES = 50_000
#: words of lines that are never replayed: start-up lines the scanner reads with patterns of its own, the head of a
#: torchelastic failure block, C++ frames, torch's `Last error:` (NCCL's `Init` lines: `_NCCL_INIT_ANY_DIGIT`)
NOT_REPLAYED = ("JobEnvironment(", "RESTART_COUNT", "ChildFailedError", "frame #", LAST_ERROR)


@functools.cache
def recipe_patterns_blind() -> bool:
    """Whether every pattern a line recipe stands in for is digit-blind (digit_shape): else none is made."""
    from ddpslurm.analyze.parse.attribution import EMBEDDED_RANK, RULES
    from ddpslurm.analyze.rules.digit_shape import digit_blind

    patterns = (*(rule for rule, meaning in RULES if meaning != "time"), EMBEDDED_RANK, NCCL_SOURCE, BODY_RANK,
                _SLURM_HEAD, _TORCHRUN, WRAPPED_HEAD)
    return all(digit_blind(p.pattern) for p in patterns)


@dataclass(frozen=True, slots=True)
class LineRecipe:
    """How every line of one shape is read: where its prefixes' values and its text start, whether srun wrote it or
    it mentions torchrun, the signature that matches it (None: none) and where that match's groups, NCCL's
    `host:pid` head and a `[Rank N]` tag sit in its text (spans relative to the text after the prefixes)."""

    prefix: PrefixSpans
    slurm: bool
    torchrun: bool
    checks: tuple[int, ...] = ()  #: digit-sensitive signatures that, matching a line, make it read in full
    signature: int | None = None
    groups: tuple[tuple[str, int, int], ...] = ()
    source: tuple[Span, Span] | None = None
    body_rank: Span | None = None
    #: where its text holds a time, if anywhere (`time_plan`): its lines are searched for that form from there only
    time: TimePlan = EVERY_FORM

    @classmethod
    def of(cls, body: str, spans: PrefixSpans, slurm: bool, torchrun: bool, checks: tuple[int, ...],
           hit: tuple[Signature, regex.Match] | None, sigs: SignatureSet) -> LineRecipe:
        """The recipe of a line whose text after the prefixes is `body`, which `hit` matched (or nothing)."""
        if hit is None:
            return cls(spans, slurm, torchrun, checks)
        sig, m = hit
        groups = tuple((name, *m.span(name)) for name, value in sorted(m.groupdict().items()) if value is not None)
        head = NCCL_SOURCE.match(body)
        tag = BODY_RANK.search(body, 0, 400) if "Rank " in body else None
        return cls(spans, slurm, torchrun, checks, sigs.index_of(sig), groups,
                   (head.span("host"), head.span("pid")) if head else None, tag.span("rank") if tag else None,
                   time_plan(shape(body)))


@dataclass
class _FileState:
    source: SourceFile
    sigs: SignatureSet
    year: int | None
    events: list[Event] = field(default_factory=list)
    summary: FileSummary | None = None
    tracebacks: TracebackAssembler = field(default_factory=TracebackAssembler)
    #: torchelastic failure blocks being read, by the stream that wrote them (agents of a merged log report at once)
    elastic: dict[object, ElasticBlock] = field(default_factory=dict)
    #: per stream: the rank, local rank and host its lines speak for, and its label_rank and prefix_rank
    streams: dict[object, tuple[int | None, int | None, str | None, int | None, int | None]] = \
        field(default_factory=dict)
    label_rank: int | None = None
    prefix_rank: int | None = None
    #: a wrapped head: its meaning is on the next line
    pending: _Pending | None = None
    #: torch's `Last error:` lines waiting for their stream's next line (NCCL's reason), oldest first
    waiting: dict[object, _Pending] = field(default_factory=dict)
    #: lines read so far (handled or replayed), in all and per stream, and the stream of the line at hand
    handled: int = 0
    stream_lines: dict[object, int] = field(default_factory=dict)
    stream_now: object = None
    #: per stream, its last generic NCCL error events: [index in events, handled, stream's lines, the event]
    generic: dict[object, list[list]] = field(default_factory=dict)
    #: (host, pid, NCCL rank, nranks) already told by a rank-map line: one event each, not one per channel line
    rank_maps: set[tuple] = field(default_factory=set)
    #: (bytes before NCCL's "NCCL INFO Channel", the printer's NCCL rank) of the channel lines read so far
    channel_lines: set[tuple[bytes, bytes]] = field(default_factory=set)
    #: the number and stream of the last line read (handled or replayed): what an unprefixed continuation continues
    previous: tuple[int, object] = (-1, UNPREFIXED)
    #: (host, pid, comm, NCCL rank) of the `Init START` lines whose COMPLETE is not read yet: their event's index
    init_starts: dict[tuple, int] = field(default_factory=dict)

    @property
    def line_mode(self) -> bool:
        """Whether every line is read now: a traceback or failure block open, a line waited for (asked per
        candidate line: the containers are tested directly, not through a call each)."""
        return bool(self.tracebacks.open or self.elastic or self.waiting) or self.pending is not None

    def repeated_channel_line(self, raw: bytes) -> bool:
        """A channel line with the same head and NCCL rank as one read before: it can only repeat that line's
        rank-map fact (deduplicated anyway), so it is skipped before any decoding (NCCL prints one per channel
        and peer: most of an INFO log's candidate lines). Asked only outside line mode."""
        if b"INFO Channel " not in raw:
            return False
        m = _CHANNEL_LINE.search(raw)
        if m is None:
            return False
        key = channel_key(raw[:m.start()], m)
        if key in self.channel_lines:
            return True
        if len(self.channel_lines) < MAX_CHANNEL_KEYS:
            self.channel_lines.add(key)
        return False

    def handle(self, raw: bytes, lineno: int) -> None:
        key = None
        if not self.line_mode:
            if len(raw) <= PLANNED_CHARS:
                key = memo_key(raw.translate(_DIGITS_TO_ZERO))
                known = self.sigs.inert_lines.get(key)
                if known is not None and self.still_inert(raw, *known):
                    return
            if self.repeated_channel_line(raw):
                return
        if key is not None:
            recipe = self.sigs.line_recipes.get(key)
            if recipe is not None and self.replay(recipe, raw.decode("ascii"), lineno):
                return
        text = clean(raw[:MAX_LINE].decode("utf-8", errors="replace").rstrip("\n"))
        if not text:
            return
        spans = prefix_spans(text)
        p = spans.prefix(text)
        slurm = body_is_slurm(p.text)
        rank, local, host, stream = self._take_prefix(p, slurm, lineno)
        body = p.text
        torchrun = mentions_torchrun(body)
        if torchrun and self.summary is not None:
            self.summary.torchrun = True
        block = self.elastic.get(stream) if self.elastic else None
        if block is None and ROOT_CAUSE_HEADER in body and body.lstrip().startswith(ROOT_CAUSE_HEADER):
            # a block whose head is not in the input (a substring test first: no copy of every line read)
            block = self.elastic[stream] = ElasticBlock()
            block.start()
        if block is not None:
            consumed, entries = block.feed(body, lineno)
            if not block.active:
                del self.elastic[stream]
            for entry in tied_roots(entries):
                self._elastic_event(entry, host)
            if consumed:
                return
        consumed, finished = self.tracebacks.feed(stream, body, lineno)
        for ended, exc in finished:
            self._exception(exc, ended)  # a stream's own rank: another stream's traceback may end on this line
        if consumed:
            return
        if "RESTART_COUNT" in body:
            m = _RESTART.search(body)
            if m:
                self._emit(lineno, "attempt_start", body, None, host, None, None, None, fields=(("attempt", m[1]),))
                return
        if "JobEnvironment(" in body:
            m = _SUBMITIT_ENV.search(body)
            if m:
                self._emit(lineno, "rank_info", body, int(m["rank"]), m["host"], None, int(m["local"]), None,
                           fields=(("node", m["node"]), ("world_size", m["world"])))
                return
        if "Init " in body:
            m = _NCCL_INIT.search(body)
            ns = nccl_source(body)
            if m:
                self._nccl_init(m, body, lineno, rank, host if not ns else ns[0], ns[1] if ns else None, local,
                                p.time_text)
                return
        if body.startswith("frame #"):
            return  # C++ stack frames of a c10 exception: the message came before them
        if self.waiting and self._reason_of(stream, body, lineno):
            return
        pending, self.pending = self.pending, None
        if pending is not None and self._follow(pending, body, stream, lineno):
            return
        if body.rstrip() == LAST_ERROR:
            self.waiting.pop(stream, None)
            self.waiting[stream] = _Pending("last_error", stream, lineno, body, handled=self.handled,
                                            own=self.stream_lines[stream])
            return
        hit = self._match_line(body, lineno, p.time_text, rank, local, host, stream)
        if key is None:
            return
        if hit is None:
            self.note_inert(key, raw, text, p, body)
        self.note_recipe(key, raw, text, spans, hit, slurm, torchrun)

    def _nccl_init(self, m: re.Match[str], body: str, lineno: int, rank: int | None, host: str | None,
                   pid: int | None, local: int | None, time_text: str | None) -> None:
        """NCCL's `Init START` (2.19+) or `Init COMPLETE` line of a communicator, its stage in field `init`. A START
        whose COMPLETE follows says `complete` from then on (the COMPLETE then repeats it: `without_told_facts`); one
        without stays `start`: the process was still waiting for its peers in the collective init."""
        stage = "complete" if m["stage"] == "COMPLETE" else "start"
        fields = (("nccl_rank", m["rank"]), ("nranks", m["nranks"]), ("comm", m["comm"]))
        key = (host, pid, m["comm"], m["rank"])
        started = self.init_starts.pop(key, None) if stage == "complete" else None
        e = self.events[started] if started is not None and started < len(self.events) else None
        if e is not None and e.kind == "nccl_init" and (e.host, e.pid, e.get("comm"), e.get("nccl_rank")) == key \
                and e.get("init") == "start":  # (the list may have changed since: a joined head's events dropped)
            self.events[started] = replace(e, fields=canonical_fields(tuple(
                ("init", "complete") if f == ("init", "start") else f for f in e.fields)))
        if stage == "start" and len(self.init_starts) < MAX_CHANNEL_KEYS:  # as many as channel keys: one per process
            self.init_starts[key] = len(self.events)
        self._emit(lineno, "nccl_init", body, rank, host, pid, local, time_text, fields=(*fields, ("init", stage)))

    def _take_prefix(self, p: Prefix, slurm: bool, lineno: int) -> tuple[int | None, int | None, str | None, tuple]:
        """The rank, local rank and host a line speaks for (its prefixes, else its file's), and its stream; notes
        the rank it names and which kind of prefix named it (`_emit` reads them). A line without a prefix that
        continues torch's NCCL error message on the line above speaks for that line's stream (`continues`)."""
        if p.rank is None and p.host is None and self.previous[0] == lineno - 1 and self.previous[1] != UNPREFIXED \
                and continues(p.text):
            stream = self.previous[1]
            rank, local, host, self.label_rank, self.prefix_rank = self.streams[stream]
            self.previous = (lineno, stream)
            self.handled += 1
            self.stream_lines[stream] += 1
            self.stream_now = stream
            return rank, local, host, stream
        src = self.source
        rank = p.rank if p.rank is not None else src.rank
        local = p.local_rank if p.local_rank is not None else src.local_rank
        host = p.host or src.host
        if p.rank is not None and self.summary is not None and len(self.summary.ranks_seen) < MAX_RANK_LIST and \
                (p.rank != src.rank or src.kind != "log"):  # resolve counts a log file's own rank present anyway
            self.summary.ranks_seen.add(p.rank)
        if slurm:
            rank, local, host = p.rank, p.local_rank, p.host  # srun/slurmstepd speak for the job, not this file's rank
        self.label_rank = p.rank if p.rank_from_label else None
        self.prefix_rank = None if p.rank_from_label else p.rank
        stream = (p.rank, p.local_rank, p.host)
        self.streams[stream] = (rank, local, host, self.label_rank, self.prefix_rank)
        self.handled += 1
        self.stream_lines[stream] = self.stream_lines.get(stream, 0) + 1
        self.stream_now = stream
        self.previous = (lineno, stream)
        return rank, local, host, stream

    def note_recipe(self, key: object, raw: bytes, text: str, spans: PrefixSpans,
                    hit: tuple[Signature, regex.Match] | None, slurm: bool, torchrun: bool) -> None:
        """Remember how a line of shape `key` was read when every line of that shape is read the same way, whatever
        its digits: its next ones are then replayed from spans (`replay`) instead of read again (16k ranks'
        watchdog and rank-map lines).

        That holds when each step the line went through decides by its shape alone: the prefix rules (digit-blind
        but the timestamp's `19|20`: no `0000-00-00` in the shape), the other patterns a recipe stands in for
        (`recipe_patterns_blind`), no start-up line the scanner reads with patterns of its own (`NOT_REPLAYED`;
        an NCCL `Init` line, whose `0x` is a digit), and the signatures: the digit-blind one that matched, or
        none, decides unless one of a few digit-sensitive ones matches (`SignatureSet.replay_checks`, run again
        on each line replayed); and when it left no state a later line depends on (nothing pending, no block
        opened). Only printable ASCII lines."""
        if (self.line_mode or b"0000-00-00" in raw.translate(_DIGITS_TO_ZERO)
                or not raw.isascii() or text != raw.decode("ascii") or not recipe_patterns_blind()):
            return
        body = text[spans.start:]
        if any(word in body for word in NOT_REPLAYED) or ("Init " in body and _NCCL_INIT_ANY_DIGIT.search(body)):
            return
        if hit is not None and self.sigs.is_sensitive(hit[0]):
            return
        checks = self.sigs.replay_checks(body)
        if checks is None:
            return
        remember(self.sigs.line_recipes, key, LineRecipe.of(body, spans, slurm, torchrun, checks, hit, self.sigs),
                 MAX_RECIPES)

    def replay(self, recipe: LineRecipe, text: str, lineno: int) -> bool:
        """Read a line the way `recipe` says every line of its shape is read (see `note_recipe`), unless one of the
        digit-sensitive signatures it lists matches this line: then False, and nothing was done."""
        if recipe.checks and self.sigs.first_match(text[recipe.prefix.start:], recipe.checks) is not None:
            return False
        p = recipe.prefix.prefix(text)
        rank, local, host, _stream = self._take_prefix(p, recipe.slurm, lineno)
        if recipe.torchrun and self.summary is not None:
            self.summary.torchrun = True
        if recipe.signature is None:
            return True
        body = p.text
        groups = {name: body[start:end] for name, start, end in recipe.groups}
        ns = None if recipe.source is None else (piece(body, recipe.source[0]), number(body, recipe.source[1]))
        named = number(body, recipe.body_rank)
        self._signature_event(self.sigs.signatures[recipe.signature], groups, body, lineno, p.time_text, rank, local,
                              host, ns, named, recipe.time)
        return True

    def note_inert(self, key: object, raw: bytes, text: str, p, body: str) -> None:
        """Remember the shape `key` of a line that said nothing when every line of that shape says nothing,
        whatever its digits, unless one of a few digit-sensitive signatures matches it: its next ones are then
        skipped after only those (16k ranks' NCCL INFO lines).

        That holds when each step the line went through decides by its shape alone: the prefix rules (all
        digit-blind but the timestamp's `19|20`: no `0000-00-00` in it), the start-up patterns (digit-blind; `Init `
        excluded, its `0x` is a digit), and the signatures (`SignatureSet.only_sensitive`); and when it left
        nothing behind: no rank prefix (`ranks_seen`), no srun line, no torchrun mention, nothing pending, no block
        opened. Only printable ASCII lines, whose text after the prefixes starts at the same byte in every one.
        """
        if (p.rank is not None or self.line_mode or "Init " in body or not raw.isascii()
                or b"0000-00-00" in raw.translate(_DIGITS_TO_ZERO)
                or text != raw.decode("ascii") or body_is_slurm(body) or mentions_torchrun(body)):
            return
        sensitive = self.sigs.only_sensitive(body)
        if sensitive is not None:
            remember(self.sigs.inert_lines, key, (len(text) - len(body), sensitive), MAX_INERT)

    def still_inert(self, raw: bytes, offset: int, sensitive: tuple[int, ...]) -> bool:
        """Whether a line of a shape `note_inert` remembered says nothing: none of its digit-sensitive signatures
        matches its text after the prefixes."""
        return not sensitive or self.sigs.first_match(raw[offset:].decode("ascii"), sensitive) is None

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
        if sig.kind == "agent_failed" and "exitcode" in m.re.groupindex and "exitcode" not in groups:
            # a launcher's report hard-wrapped before its exit code (a terminal or a paste): the next line may end it
            self.pending = _Pending("join", stream, lineno, body, time_text, signature=sig.id,
                                    events_at=len(self.events))
        emitted = self._signature_event(sig, groups, body, lineno, time_text, rank, local, host, nccl_source(body),
                                        body_rank(body))
        if emitted and "ChildFailedError" in body:
            self.elastic.setdefault(stream, ElasticBlock()).start()
        return hit

    def _signature_event(self, sig: Signature, groups: dict[str, str], body: str, lineno: int,
                         time_text: str | None, rank: int | None, local: int | None, host: str | None,
                         ns: tuple[str, int] | None, named_rank: int | None, time: TimePlan = EVERY_FORM) -> bool:
        """The event of a line that `sig` matched with these groups (NCCL's `host:pid` head `ns`, the rank a
        `[Rank N]` tag in its body names); False when it only repeats a rank-map fact already told. `time`: where
        its text holds a time (a recipe knows)."""
        ev_host = host or (ns[0] if ns else None) or groups.get("host")
        pid = ns[1] if ns else small_int(groups.get("pid"))
        if rank is None and sig.kind not in ("slurm_task",) and sig.accuses != "host":
            rank = small_int(groups.get("rank"))  # a node's report (NCCL's duplicate GPU) names ranks, not its own
        if rank is None and ns is None:
            rank = named_rank
        if local is None:
            local = small_int(groups.get("local_rank"))
        if sig.kind == "nccl_rank_map":
            key = (ev_host, pid, groups.get("nccl_rank"), groups.get("nranks"))
            if key in self.rank_maps:
                return False
            self.rank_maps.add(key)
        if sig.kind == "interface" and "ip" in groups:
            groups |= interface_fields(body, groups["ifname"], groups["ip"])
        self._emit(lineno, sig.kind, body, rank, ev_host, pid, local, time_text, sig=sig,
                   fields=tuple(sorted(groups.items())), plan=time)
        return True

    def _follow(self, pending: _Pending, body: str, stream: object, lineno: int) -> bool:
        """The line after a wrapped head: True when it was read as that line's rest."""
        if lineno - pending.line > PENDING_REACH:
            return False
        if pending.what == "join":
            joined = f"{pending.text} {body.strip()}"
            hit = self.sigs.match(joined)
            wanted = hit is not None and (hit[0].id == pending.signature if pending.signature
                                          else hit[0].kind == "watchdog_timeout")
            if not wanted or lineno - pending.line > 1 or (pending.signature and "exitcode" not in
                                                           {k for k, v in hit[1].groupdict().items() if v}):
                return False
            # the head's own events, read alone: only those after the mark (a merged log of 16k ranks' wrapped
            # heads made the whole list filtered once per head, quadratic)
            self.events[pending.events_at:] = [e for e in self.events[pending.events_at:] if e.line != pending.line]
            with self._speaking_for(pending.stream) as (rank, local, host):
                self._match_line(joined, pending.line, pending.time_text, rank, local, host, pending.stream)
            self.pending = None
            return True
        return False

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

    def _note_generic(self, stream: object) -> None:
        """The event just appended is a generic NCCL error of `stream`: a `Last error:` of it may explain it."""
        found = self.generic.setdefault(stream, [])
        found.append([len(self.events) - 1, self.handled, self.stream_lines.get(stream, 0), self.events[-1]])
        del found[:-5]

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
            kept = tuple(f for f in e.fields if f[0] != "accuses")  # `_emit` put it last: it stays last
            if hit is None:
                accuses = tuple(f for f in e.fields if f[0] == "accuses")
                self.events[i] = record[3] = replace(e, fields=(*kept, ("last_error", reason[:500]), *accuses))
                continue
            sig, m = hit
            groups = tuple(sorted((k, v) for k, v in m.groupdict().items() if v is not None))
            self.events[i] = record[3] = replace(
                e, cause=sig.cause, role=sig.role, signature=sig.id, priority=sig.priority,
                fields=(*kept, *groups, ("last_error", reason[:500]), ("accuses", sig.accuses)))
        return len(generic)

    def _time(self, time_text: str | None, body: str, plan: TimePlan = EVERY_FORM) -> tuple[float | None, str | None]:
        """The time of a line: its prefix's, else the first one in its text (`plan`: where that can be)."""
        found = parse_time(time_text, self.year) if time_text else None
        found = found or parse_planned(body, plan, self.year)
        return (found[0], found[1]) if found else (None, None)

    def _emit(self, lineno: int, kind: str, body: str, rank: int | None, host: str | None, pid: int | None,
              local: int | None, time_text: str | None, sig=None, fields: tuple = (), time: float | None = None,
              family: str | None = None, stream: object = None, plan: TimePlan = EVERY_FORM) -> None:
        if time is None:
            time, family = self._time(time_text, body, plan)
        if rank is not None and (rank == self.label_rank or (self.source.task_file and self.prefix_rank is None
                                                             and rank == self.source.rank)):
            fields = (*fields, ("srun_task", str(rank)))
        failure = sig is not None and kind not in FACT_KINDS
        if failure:
            fields = (*fields, ("accuses", sig.accuses))  # what engine.with_accuses would add, without a copy
        self.events.append(new_event(  # Event's fields, in order
            self.source.display, lineno, kind, body[:2000], rank, canonical(host), pid, local, time, family,
            sig.cause if failure else None, sig.role if failure else None, sig.id if sig else None,
            sig.priority if sig else 0, canonical_fields(fields)))
        if sig is not None and sig.id in GENERIC_NCCL_SIGNATURES:
            self._note_generic(stream if stream is not None else self.stream_now)

    @contextlib.contextmanager
    def _speaking_for(self, stream: object) -> Iterator[tuple[int | None, int | None, str | None]]:
        """The rank, local rank and host `stream`'s lines speak for, with its srun label the one `_emit` reads
        meanwhile: for an event of another stream than the line at hand's (a traceback another stream's lines left
        idle or the file's end closed, a wrapped head joined)."""
        line_labels = self.label_rank, self.prefix_rank
        rank, local, host, self.label_rank, self.prefix_rank = self.streams.get(
            stream, (self.source.rank, self.source.local_rank, self.source.host, None, None))
        try:
            yield rank, local, host
        finally:
            self.label_rank, self.prefix_rank = line_labels

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


class ReadDeadline(OSError):
    """A file took longer than READ_DEADLINE seconds to read: the rest is left unread (and reported)."""


#: how a log is opened: never blocking on a pseudo-file, never becoming a controlling terminal
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


class Opened(NamedTuple):
    """A file `read_ahead` opened for its scan: its descriptor, and its attributes where a thread read them (on NFS
    mounted `noac` each fstat asks the server again)."""

    fd: int
    attributes: os.stat_result | None = None


class _Reader:
    """A log opened for reading without ever blocking on a pseudo-file (/proc/kmsg, a fifo reached by a race) and
    with a wall-clock deadline, checked at every read. Only regular files are read."""

    def __init__(self, path: str, deadline: float, opened: Opened | None = None) -> None:
        """Open `path`, or read through `opened`, the same file opened already with READ_FLAGS (the reader closes
        it), with its attributes where they were read then."""
        self.fd = os.open(path, READ_FLAGS) if opened is None else opened.fd
        try:
            st = opened.attributes if opened is not None and opened.attributes is not None else os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
        except OSError:
            os.close(self.fd)
            raise
        self.size, self.pos = st.st_size, 0
        self.deadline = time.monotonic() + deadline
        #: the file's last byte (as opened) once a read has covered it: `ends_with_newline` asks no more then
        self.last_byte: int | None = None

    def read(self, n: int) -> bytes:
        """Up to `n` bytes from where the reader is."""
        buf = bytearray(n)
        return bytes(buf[:self.readinto(memoryview(buf))])

    def head(self, n: int) -> bytes:
        """The file's first `n` bytes (at most), read without moving the reader (one pread)."""
        return os.pread(self.fd, n, 0)

    def readinto(self, view: memoryview) -> int:
        """Read into `view`, up to what the file holds plus some slack for a file still growing; how many bytes
        came."""
        if time.monotonic() > self.deadline:
            raise ReadDeadline(errno.ETIMEDOUT, f"still reading after {READ_DEADLINE:.0f} s; the rest is not read")
        want = min(len(view), max(self.size - self.pos, 0) + (64 << 10))
        try:
            got = os.readv(self.fd, [view[:want]])
        except BlockingIOError:
            raise OSError(errno.EAGAIN, "reading it would block (a pseudo-file?)") from None
        if self.pos < self.size <= self.pos + got:
            self.last_byte = view[self.size - 1 - self.pos]
        self.pos += got
        return got

    def seek(self, offset: int) -> None:
        self.pos = os.lseek(self.fd, offset, os.SEEK_SET)

    def ends_with_newline(self) -> bool:
        """Whether the file's last byte (as it was opened) is a line end; an empty file has no cut line."""
        if self.last_byte is not None:
            return self.last_byte == 10
        return self.size == 0 or os.pread(self.fd, 1, self.size - 1) == b"\n"

    def tell(self) -> int:
        return self.pos

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


class _Window:
    """A binary reader over the byte range [start, end) of an open file."""

    def __init__(self, handle, start: int, end: int) -> None:
        handle.seek(start)
        self.handle, self.end = handle, end

    def readinto(self, view: memoryview) -> int:
        left = self.end - self.handle.tell()
        return self.handle.readinto(view[:left]) if left > 0 else 0

    def seek(self, offset: int) -> None:
        self.handle.seek(offset)

    def tell(self) -> int:
        return self.handle.tell()


def scan_file(source: SourceFile, sigs: SignatureSet, year: int | None = None,
              on_bytes: Callable[[int], None] | None = None, start: int = 0,
              end: int | None = None, keep_tail: bool = True, opened: Opened | None = None
              ) -> tuple[list[Event], FileSummary]:
    """Scan one log file (or its lines in [start, end)); never raises on content. `opened`: the file opened already
    (`read_ahead`), closed here.

    The summary keeps the shape of the file's last line always, its last lines only with `keep_tail` (a report
    shows a few files' tails when nothing matched: 16k ranks' tails are not held for that).

    A range ends at `end`, except that a traceback or failure block still open there is read to its end
    (at most OVERRUN_BYTES further); line numbers are relative to `start`, `summary.lines` counts the range.
    """
    summary = FileSummary(file=source.display)
    state = _FileState(source=source, sigs=sigs, year=year, summary=summary)
    anchors = sigs.anchors
    every_line = bool(sigs.always)
    tail: deque[bytes] = deque(maxlen=TAIL_LINES)
    lineno = 0
    timeouts = sum(sigs.timeouts.values())
    try:
        with _Reader(source.path, READ_DEADLINE, opened) as handle:
            tally = None
            if start == 0:
                head = handle.head(8192)
                if is_binary(head):
                    summary.binary = True
                    return [], settled(summary)
                if stream_ends.looks_labelled(head):
                    if end is None and handle.size <= stream_ends.MAX_BYTES:
                        tally = stream_ends.StreamTally()
                    else:
                        summary.streams_untallied = True
            reader = handle if end is None else _Window(handle, start, end)
            first = start == 0
            for block, size, truncated in iter_blocks(reader):
                summary.truncated_lines += truncated
                summary.bytes += size
                head = head_starts(block, min(size, HEAD_BYTES)) if first else ()
                lineno = _scan_block(block, size, lineno, state, anchors, every_line, head)
                first = False
                if tally is not None:
                    tally.feed(block, size)
                for piece in last_lines(block, TAIL_LINES, size):
                    tail.append(piece[:400])
                if on_bytes:
                    on_bytes(size)
            in_range = lineno
            if end is None or end >= handle.size:
                summary.ends_with_newline = handle.ends_with_newline()
            if end is not None and state.line_mode:
                for block, size, _t in iter_blocks(_Window(handle, end, end + OVERRUN_BYTES)):
                    lineno = _scan_block(block, size, lineno, state, anchors, every_line, stop_when_idle=True)
                    if not state.line_mode:
                        break
                summary.read_past_end = lineno - in_range
            lineno = in_range
    except OSError as error:
        summary.error = error.strerror or str(error)
        summary.match_timeouts = sum(sigs.timeouts.values()) - timeouts
        return state.events, settled(summary)
    summary.match_timeouts = sum(sigs.timeouts.values()) - timeouts
    state.finish()
    summary.lines = lineno
    if keep_tail:
        summary.tail = [clean(t.decode("utf-8", errors="replace")) for t in tail if t.strip()]
        summary.last_line = last_line_shape(summary.tail)
    else:
        summary.last_line = last_line_shape(decoded_from_end(tail))
    if tally is not None:
        summary.streams = tally.ends(last_line_shape)
    return told_once(state.events), settled(summary)


#: what an empty summary holds: shared, not one set and one list per file (32k files: 9 MB of empty containers)
NO_RANKS: frozenset[int] = frozenset()
NO_STREAMS: dict[int, tuple[int, str | None]] = {}


def head_starts(block: bytes | bytearray, end: int) -> list[int]:
    """Offsets of the lines of `block[:end]` that hold a head anchor (submitit's JobEnvironment line: a handful
    of anchors, each looked for on its own, not an automaton pass of its own over every file's head)."""
    starts: set[int] = set()
    for anchor in HEAD_ANCHOR_BYTES:
        for at in occurrences(block, anchor, end):
            starts.add(block.rfind(b"\n", 0, at) + 1)
    return sorted(starts)


#: a head anchor is looked for through its first byte (memchr: 0.7 us over a 64 KB head, where `bytes.find` of the
#: whole anchor takes 20 us, 3% of a 16k-rank job's 75 KB .out file) and checked where that byte is; past this many
#: of those bytes that do not start it, the rest is searched for the whole anchor
FIRST_BYTE_TRIES = 64


def occurrences(block: bytes | bytearray, anchor: bytes, end: int) -> Iterator[int]:
    """Where `anchor` starts in `block[:end]`, in order, as repeated `bytes.find` of it finds them (no overlaps)."""
    first = anchor[:1]
    at, tries = block.find(first, 0, end), 0
    while at >= 0 and tries < FIRST_BYTE_TRIES:
        if block.startswith(anchor, at, end):
            yield at
            at = block.find(first, at + len(anchor), end)
        else:
            tries += 1
            at = block.find(first, at + 1, end)
    at = block.find(anchor, at, end) if at >= 0 else -1
    while at >= 0:
        yield at
        at = block.find(anchor, at + len(anchor), end)


def settled(summary: FileSummary) -> FileSummary:
    """The summary as a scan returns it: its empty rank set and tail are the shared empty ones."""
    if not summary.ranks_seen:
        summary.ranks_seen = NO_RANKS
    if not summary.tail:
        summary.tail = ()
    if not summary.streams:
        summary.streams = NO_STREAMS
    return summary


def decoded_from_end(tail: Sequence[bytes]) -> list[str]:
    """The last lines `last_line_shape` reads of `tail` (raw, blank ones aside), decoded from the end only as far as
    it reads them: up to the last line that is not ddpslurm's or submitit's own, and the very last line. Most of a
    16k-rank job's files keep no tail: their six last lines are not all decoded for one shape."""
    out: list[str] = []
    for raw in reversed(tail):
        if not raw.strip():
            continue
        line = clean(raw.decode("utf-8", errors="replace"))
        out.append(line)
        if not line.startswith(OWN_LINES):
            break
    out.reverse()
    return out


#: the heads of ddpslurm's and submitit's own lines: a log's last line is read before them (`last_line_shape`)
OWN_LINES = ("ddpslurm:", "submitit ")


def last_line_shape(tail: Sequence[str]) -> str | None:
    """The file's last line with its numbers masked (ddpslurm's and submitit's own lines aside when others exist):
    what most ranks' logs end on is compared with it."""
    lines = [ln for ln in tail if not ln.startswith(OWN_LINES)] or tail
    return canonical(_DIGITS.sub("N", lines[-1])) if lines else None


_DIGITS = re.compile(r"\d+")


def last_lines(block: bytes | bytearray, count: int, end: int | None = None) -> list[bytes]:
    """The last `count` lines of a block of complete lines `block[:end]` (of its last 4 * MAX_LINE bytes), split
    from the end: a 4 MB block is not cut into all its lines for six of them."""
    end = len(block) if end is None else end
    floor = max(0, end - 4 * MAX_LINE)
    start = end
    for _ in range(count + 2):  # only the bytes after the last count + 2 line ends are copied (not 64 KB a file)
        start = block.rfind(b"\n", floor, start)
        if start < 0:
            start = floor - 1
            break
    pieces = bytes(block[start + 1:end]).rsplit(b"\n", count + 1)
    if pieces[-1] == b"":
        pieces.pop()  # after the block's last newline
    return pieces[-count:] if count else []


def told_once(events: list[Event]) -> list[Event]:
    """A file's events (or a file's ranges' merged) with each fact they repeat told once."""
    return without_told_facts(without_repeats(events)) if len(events) > 1 else events


def without_repeats(events: list[Event]) -> list[Event]:
    """A file's events less the victim facts it repeats: a later victim line of a rank that says nothing an
    earlier one of the same kind did not (torch logs a watchdog timeout four times per rank, in three wordings:
    16k ranks, 64k events). The first is kept; facts of no known rank are all kept (a merged log may hold several
    ranks' identical lines)."""
    seen: set[tuple] = set()
    told: dict[tuple, list[Event]] = {}
    out: list[Event] = []
    for e in events:
        if e.role == "victim" and e.rank is not None:
            key = (e.signature, e.rank, e.host, e.pid, e.fields)
            if key in seen:
                continue
            earlier = told.setdefault((e.kind, e.cause, e.rank, e.host, e.pid, e.local_rank), [])
            if any(says_no_more(e, f) for f in earlier[-TOLD_REACH:]):
                continue
            seen.add(key)
            earlier.append(e)
        out.append(e)
    return out


#: fields that tell how a line was read, not what it says
READING_FIELDS = ("srun_task",)


def says_no_more(later: Event, earlier: Event) -> bool:
    """Whether victim event `later` says nothing `earlier` (same kind, cause and rank) did not: none of its fields
    is new, and no time of its own. Its srun task id (the rank from the file's name) is no news when its own text
    names that rank (`[Rank N]`), or when `earlier` was read the same way."""
    if later.time is not None and later.time != earlier.time:
        return False
    fields = set(earlier.fields)
    if later.get("srun_task") is not None and earlier.get("srun_task") is None and \
            later.get("rank") != str(later.rank):
        return False
    return all(pair in fields for pair in later.fields if pair[0] not in READING_FIELDS)


#: facts of a process that the engine reads for their values alone (resolve's maps, the timeline's host, pid and
#: signs of life; the interface a process picked), and the kinds of earlier facts that tell all a fact of that kind
#: does: an `Init` line is a rank-map line and more (a pid for the timeline, a sign the job initialized)
TOLD_BY = {"nccl_init": ("nccl_init",), "nccl_rank_map": ("nccl_rank_map", "nccl_init"), "interface": ("interface",)}
#: of these kinds, the fields the engine reads (producers.interface_picks: the interface and address picked); the
#: others say how the line put it (NCCL names its bootstrap and its transport's out-of-band interface: one pick)
TOLD_FIELDS = {"interface": ("ifname", "ip", "srun_task")}
#: the facts of one process a later one is compared with (a process may init hundreds of communicators)
TOLD_REACH = 8


def without_told_facts(events: list[Event]) -> list[Event]:
    """A file's events less the facts that only repeat an earlier one of the same process (`TOLD_BY`): both without
    a time (the order of untimed lines is their place in the file), the later one's fields (those the engine reads,
    `TOLD_FIELDS`) among the earlier one's, and no failure in the file on the lines between them (a sign of life
    after a failure is news). NCCL tells a rank twice per communicator (`Init START`, `Init COMPLETE`), and its
    `comm` and tree lines say that rank again: 16k ranks, 48k events; its bootstrap and transport lines name the
    same interface: 16k more."""
    failures = sorted(e.line for e in events if e.role is not None)
    told: dict[tuple, list[tuple[int, str, frozenset]]] = {}
    out: list[Event] = []
    for e in events:
        tellers = TOLD_BY.get(e.kind)
        if tellers is not None and e.time is None:
            earlier = told.setdefault((e.rank, e.host, e.pid, e.local_rank), [])
            fields = frozenset(e.fields)
            read = TOLD_FIELDS.get(e.kind)
            told_fields = fields if read is None else frozenset(p for p in e.fields if p[0] in read)
            if any(kind in tellers and told_fields <= seen and not _between(failures, line, e.line)
                   for line, kind, seen in earlier[-TOLD_REACH:]):
                continue
            earlier.append((e.line, e.kind, fields))
        out.append(e)
    return out


def _between(lines: list[int], a: int, b: int) -> bool:
    """Whether a line of the sorted `lines` lies from line a to line b (in either order)."""
    lo, hi = min(a, b), max(a, b)
    i = bisect.bisect_left(lines, lo)
    return i < len(lines) and lines[i] <= hi


def _scan_block(block: bytes | bytearray, n: int, lineno: int, state: _FileState, anchors: Sequence[bytes],
                every_line: bool, extra: Sequence[int] = (), stop_when_idle: bool = False) -> int:
    """Process one block of complete lines, `block[:n]`; returns the line count after it."""
    cur = 0
    starts = None if every_line else candidate_starts(block, anchors, n)
    if extra and starts is not None:
        starts = sorted(set(starts) | set(extra))
    count = len(starts) if starts is not None else 0
    idx = 0
    channels = state.channel_lines
    line_mode = every_line or state.line_mode  # changes only when a line is handled: asked again after each
    while cur < n:
        if not line_mode:
            while idx < count and starts[idx] < cur:
                idx += 1
            if channels:  # told channel lines skipped in a row (their newlines are counted with the next line read)
                while idx < count and _told_channel_line(block, starts[idx], n, channels):
                    idx += 1
            if idx >= count:
                lineno += newlines(block, cur, n)
                break
            nxt = starts[idx]
            lineno += newlines(block, cur, nxt)
            cur = nxt
        end = block.find(b"\n", cur, n)
        if end < 0:
            end = n
        lineno += 1
        if end - cur > MAX_LINE and state.summary is not None:
            state.summary.truncated_lines += 1  # read up to MAX_LINE, like a line cut at a block's edge
        state.handle(bytes(block[cur:min(end, cur + MAX_LINE)]), lineno)
        cur = end + 1
        line_mode = every_line or state.line_mode
        if stop_when_idle and not state.line_mode:
            break
    return lineno


#: what follows a channel line's head: `_told_channel_line` finds it through the head last seen (a file's channel
#: lines come in runs of one head: 41 of a 16k-rank job's 50 candidate lines a rank)
_CHANNEL_WORDS = b" NCCL INFO Channel "
_CHANNEL_REST = re.compile(_CHANNEL_LINE.pattern[len(_CHANNEL_WORDS):])
#: (head, head + _CHANNEL_WORDS) of the last channel line `_told_channel_line` read whose words start with no
#: earlier occurrence of them in the head (so that a search of the line finds them there first)
_last_channel_head: tuple[bytes, bytes] = (b"", _CHANNEL_WORDS)


def _told_channel_line(block: bytes | bytearray, start: int, n: int, channels: set[tuple[bytes, bytes]]) -> bool:
    """Whether the line at `start` is a channel line `_FileState.repeated_channel_line` would skip (one already
    read with its head and NCCL rank): asked on the block, before the line is cut out and handled (NCCL prints
    one per channel and peer, most of an INFO log's candidate lines). Overlong lines are left to `handle`.

    A line that starts with the head last seen and the channel words is read from after them (what a search of
    the line would find first there: the words do not occur earlier in that head); any other, searched whole."""
    global _last_channel_head
    end = block.find(b"\n", start, n)
    end = n if end < 0 else end
    if end - start > MAX_LINE:
        return False
    head, lead = _last_channel_head
    if block.startswith(lead, start, end):
        m = _CHANNEL_REST.match(block, start + len(lead), end)
        if m is not None:
            return channel_key(head, m) in channels
    m = _CHANNEL_LINE.search(block, start, end)
    if m is None:
        return False
    head = bytes(block[start:m.start()])
    lead = head + _CHANNEL_WORDS
    if lead.find(_CHANNEL_WORDS) == len(head):
        _last_channel_head = (head, lead)
    return channel_key(head, m) in channels


_WORKER_SIGS: SignatureSet | None = None
#: a worker's jobs in task order (`scan_files`, through `_init_worker`): a task names a range of them
_WORKER_JOBS: list[ScanJob] = []


def _init_worker(sigs: SignatureSet, numpy_counts: bool, jobs: list[ScanJob]) -> None:
    """Pool initializer: the compiled signatures and the scan's jobs in task order reach each worker once (inherited
    on fork, each pool's own, a worker the pool starts again included; a spawned worker is sent them), and how the
    parent decided line ends are counted (line_count.worth_importing). A worker makes no reference cycles to speak
    of: its cycle collector stays off, as the parent's is while it analyzes."""
    global _WORKER_SIGS, _WORKER_JOBS
    _WORKER_SIGS = sigs
    _WORKER_JOBS = jobs
    line_count.follow_parent(numpy_counts)
    gc.disable()


#: a scan task: the file, the year for year-less times, the byte range, whether its last lines are kept
ScanJob = tuple[SourceFile, int | None, int, int | None, bool]
#: the first files (in input order) whose last lines a summary keeps, for a report with nothing else to show
TAIL_FILES = 16


def _scan_job(sigs: SignatureSet, progress: Callable | None, args: ScanJob, opened: Opened | None
              ) -> tuple[list[Event], FileSummary]:
    """One scan job (through `opened` where `read_ahead` opened its file), its progress told where there is one to
    tell (a worker's is told by the pool's parent)."""
    source, year, start, end, keep_tail = args
    result = scan_file(source, sigs, year, progress, start=start, end=end, keep_tail=keep_tail, opened=opened)
    if progress:
        progress(0, 1)
    return result


def _scan_batch(batch: list[ScanJob]) -> list[tuple[list[Event], FileSummary]]:
    """Many small files in one worker task: the per-task cost (pickling, scheduling) is paid once per batch."""
    assert _WORKER_SIGS is not None
    return scan_task(batch, functools.partial(_scan_job, _WORKER_SIGS, None))


def _scan_span(span: tuple[int, int]) -> list[tuple[list[Event], FileSummary]]:
    """`_scan_batch` of the jobs `_WORKER_JOBS[start:stop]`: a task is sent as two numbers, not as its files (32k
    SourceFiles pickled by the parent and unpickled by a worker: 0.2 CPU s of a 16k-rank job)."""
    start, stop = span
    return _scan_batch(_WORKER_JOBS[start:stop])


def scan_task(batch: Sequence[ScanJob], scan: Callable[[ScanJob, Opened | None], tuple[list[Event], FileSummary]]
              ) -> list[tuple[list[Event], FileSummary]]:
    """`scan` of each job of a task, `read_ahead` of the next READ_AHEAD_FILES jobs asked as each run of as many
    starts (so at most twice as many files are open); the files opened for jobs a failure left unscanned are
    closed. Where opening a file is a network file system's round trip (`opens_slow`), METADATA_THREADS threads
    open the next ones side by side for the rest of the task."""
    pending: deque[Opened | None] = deque()
    asked = 0
    results: list[tuple[list[Event], FileSummary]] = []
    pool: ThreadPoolExecutor | None = None
    try:
        for i, args in enumerate(batch):
            if i % READ_AHEAD_FILES == 0:  # a run starts: the runs up to the one after it are asked for
                while asked < min(len(batch), i + 2 * READ_AHEAD_FILES):
                    more = batch[asked:asked + READ_AHEAD_FILES]
                    if pool is None and opens_slow():
                        pool = ThreadPoolExecutor(METADATA_THREADS, thread_name_prefix="ddpslurm-open")
                    pending.extend(read_ahead(more, pool))
                    asked += len(more)
            results.append(scan(args, pending.popleft()))
    finally:
        for opened in pending:
            if opened is not None:
                os.close(opened.fd)
        if pool is not None:
            pool.shutdown()
    return results


_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
#: the most bytes of one file (or range) asked for ahead: past it the kernel's own read-ahead keeps a sequential read
#: fed, and a huge range is not pulled into memory at once
READ_AHEAD_BYTES = 8 << 20
#: files asked for ahead at a time (a task holds up to BATCH_FILES): up to twice as many are open at once
READ_AHEAD_FILES = 64


#: this process's opens timed so far (`read_ahead` without threads): how many, and their seconds
_OPENS = [0, 0.0]


def opens_slow() -> bool:
    """Whether the first READ_AHEAD_FILES files this process opened for the scan at hand took a round trip each
    (`scan_files` starts the count again; a worker times its own)."""
    return round_trips(*_OPENS, timed=READ_AHEAD_FILES)


def read_ahead(batch: Sequence[ScanJob], pool: ThreadPoolExecutor | None = None) -> list[Opened | None]:
    """Open a task's files and ask the kernel to start reading their byte ranges now (posix_fadvise WILLNEED), so that
    those not in memory yet (a job's logs read for the first time, on a shared file system) are read while the first
    ones are scanned, instead of each read waiting in turn: a 16k-rank job's 32k files, cold, 34.5 -> 26.5 s.

    Returns each job's open file, for its scan to read through and close (no file is opened twice: an open is a
    round trip to the metadata server on Lustre or NFS); None where it is not opened here (no advice to give on this
    platform, nothing to read, or it cannot be opened now: the scan opens it and reports why). Threads (`pool`) read
    each file's attributes too, for the scan to use instead of a round trip of its own, one file after the other."""
    if _WILLNEED is None:
        return [None] * len(batch)
    if pool is not None:
        return list(pool.map(functools.partial(_open_ahead, attributes=True), batch))
    started = time.perf_counter()
    opened = [_open_ahead(job) for job in batch]
    if _OPENS[0] < READ_AHEAD_FILES:
        _OPENS[0] += len(batch)
        _OPENS[1] += time.perf_counter() - started
    return opened


def _open_ahead(job: ScanJob, attributes: bool = False) -> Opened | None:
    """`read_ahead` of one job: its file opened and its range asked for (and its attributes read), or None."""
    source, _year, start, end, _tail = job
    length = min((source.size if end is None else end) - start, READ_AHEAD_BYTES)
    if length <= 0:
        return None
    try:
        fd = os.open(source.path, READ_FLAGS)
    except OSError:
        return None
    read: os.stat_result | None = None
    with contextlib.suppress(OSError):  # not a regular file (a fifo: ESPIPE), or no advice taken there
        if attributes:
            read = os.fstat(fd)
        os.posix_fadvise(fd, start, length, _WILLNEED)
    return Opened(fd, read)


#: a worker task holds files up to this many bytes, or this many files (a 16k-rank job: 32k files of ~40 KB)
BATCH_BYTES = 8 << 20
BATCH_FILES = 256


def batches(jobs: list[tuple[int, ScanJob]]) -> list[list[tuple]]:
    """Consecutive jobs grouped into tasks of at most BATCH_BYTES and BATCH_FILES (a big range is a task alone)."""
    out: list[list[tuple]] = []
    size = 0
    for job in jobs:
        source, _, start, end, _tail = job[1]
        nbytes = (end if end is not None else source.size) - start
        if not out or size + nbytes > BATCH_BYTES or len(out[-1]) >= BATCH_FILES:
            out.append([])
            size = 0
        out[-1].append(job)
        size += nbytes
    return out


def prefilter_sample(sources: Sequence[SourceFile], size: int = TUNE_SAMPLE_BYTES) -> bytes:
    """The first bytes of the largest files, `size` in all and a quarter of it at most from one file: the text the
    prefilter's anchor orders are timed on. Files that cannot be read now, and binary ones, give nothing."""
    pieces: list[bytes] = []
    left = size
    for source in sorted(sources, key=lambda s: -s.size):
        if left <= 0:
            break
        try:
            with _Reader(source.path, READ_DEADLINE) as handle:
                piece = handle.read(min(left, size // 4))
        except OSError:
            continue
        if piece and not is_binary(piece[:8192]):
            pieces.append(piece)
            left -= len(piece)
    return b"".join(pieces)


def split_points(path: str, size: int, parts: int) -> list[int]:
    """Byte offsets cutting a file into `parts` ranges at line starts: [0, b1, ..., size]."""
    cuts = [0]
    with open(path, "rb") as handle:
        for i in range(1, parts):
            target = size * i // parts
            handle.seek(target)
            nl = handle.read(MAX_LINE).find(b"\n")
            cut = target + nl + 1 if nl >= 0 else target
            if cuts[-1] < cut < size:
                cuts.append(cut)
    return [*cuts, size]


def merge_parts(parts: list[tuple[list[Event], FileSummary]]) -> tuple[list[Event], FileSummary]:
    """One file's ranges back together: line numbers shifted, and the lines a range read past its end (to finish a
    traceback or block open there) taken from that range, which read them in context, not from the next one, which
    read them from the middle of that block (a failure block's entries read as lines of their own)."""
    if len(parts) == 1:
        return parts[0]
    events: list[Event] = []
    seen: set[tuple[int, str]] = set()
    merged = FileSummary(file=parts[0][1].file)
    offset = covered = 0  # covered: the last line (of the whole file) an earlier range has read
    for part_events, summary in parts:
        for e in part_events:
            e = _shifted(e, offset) if offset else e
            if e.line > covered and (e.line, e.kind) not in seen:
                seen.add((e.line, e.kind))
                events.append(e)
        covered = max(covered, offset + summary.lines + summary.read_past_end)
        offset += summary.lines
        merged.bytes += summary.bytes
        merged.truncated_lines += summary.truncated_lines
        merged.match_timeouts += summary.match_timeouts
        merged.ranks_seen |= summary.ranks_seen
        merged.binary = merged.binary or summary.binary
        merged.streams_untallied = merged.streams_untallied or summary.streams_untallied
        merged.rescanned = merged.rescanned or summary.rescanned
        merged.torchrun = merged.torchrun or summary.torchrun
        merged.error = merged.error or summary.error
        merged.tail = summary.tail or merged.tail
        merged.last_line = summary.last_line or merged.last_line
        merged.ends_with_newline = summary.ends_with_newline
    merged.lines = offset
    return told_once(events), merged


#: fields that hold a line number of the file (a traceback's first line)
LINE_FIELDS = ("traceback_line",)


def _shifted(e: Event, offset: int) -> Event:
    """A range's event with its line numbers counted from the file's start instead of the range's."""
    fields = e.fields
    if any(name in LINE_FIELDS for name, _ in fields):
        fields = tuple((name, str(int(value) + offset)) if name in LINE_FIELDS and value.isdigit() else (name, value)
                       for name, value in fields)
    return moved(e, e.line + offset, fields)


def scan_files(sources: Sequence[SourceFile], sigs: SignatureSet, *, years: Sequence[int | None] | None = None,
               workers: int | None = None, progress: Callable[[int], None] | None = None
               ) -> list[tuple[list[Event], FileSummary]]:
    """Scan every file, in parallel processes when the input is large; results in the order of `sources`."""
    years = list(years) if years is not None else [None] * len(sources)
    total = sum(s.size for s in sources)
    _OPENS[:] = [0, 0.0]  # how slow opening is, timed afresh for these files (by the workers, forked after this)
    count = workers if workers is not None else min(os.cpu_count() or 1, 8)
    if count <= 1 or total < PARALLEL_MIN_BYTES:
        results = []
        serial = [(i, (s, y, 0, None, i < TAIL_FILES)) for i, (s, y) in enumerate(zip(sources, years, strict=False))]
        for task in batches(serial):
            results += scan_task([args for _, args in task], functools.partial(_scan_job, sigs, progress))
        return results
    import multiprocessing

    if total >= TUNE_MIN_BYTES:
        tune(sigs.anchors, prefilter_sample(sources))  # before the fork: the workers inherit the automaton
    # big files are cut into ranges at line starts so that one huge log also uses every core
    jobs: list[tuple[int, ScanJob]] = []
    for i, source in enumerate(sources):
        parts = min(MAX_RANGES, source.size // SPLIT_MIN_BYTES) if source.size >= 2 * SPLIT_MIN_BYTES else 1
        cuts = split_points(source.path, source.size, parts) if parts > 1 else [0, None]
        for start, end in itertools.pairwise(cuts):
            jobs.append((i, (source, years[i], start, end if parts > 1 else None, i < TAIL_FILES)))
    jobs.sort(key=lambda job: -((job[1][3] or job[1][0].size) - job[1][2]))
    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    out: list = [None] * len(sources)
    pieces: dict[int, list[tuple[int, tuple[list[Event], FileSummary]]]] = defaultdict(list)  # files cut in ranges
    tasks = batches(jobs)
    workers = min(count, len(tasks))
    long_bytes = sum(s.size for s in sources if s.size >= line_count.NUMPY_MIN_BYTES)
    numpy_counts = line_count.worth_importing(long_bytes, workers)
    in_order = [args for task in tasks for _, args in task]  # inherited by forked workers, sent to spawned ones
    spans = list(itertools.pairwise(itertools.accumulate((len(t) for t in tasks), initial=0)))
    received = 0
    try:
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(sigs, numpy_counts, in_order)) as pool:
            for task_results in pool.map(_scan_span, spans):
                _collect(tasks[received], task_results, out, pieces, progress)
                received += 1
    except BrokenProcessPool:  # a worker ended abruptly (the kernel's OOM killer, a signal): the rest is read here
        for task in tasks[received:]:
            task_results = scan_task([args for _, args in task], functools.partial(_scan_job, sigs, None))
            for _events, summary in task_results:
                summary.rescanned = True
            _collect(task, task_results, out, pieces, progress)
    for i, parts in pieces.items():
        out[i] = merge_parts([r for _, r in sorted(parts, key=lambda p: p[0])])
    return out


def _collect(task: list[tuple[int, ScanJob]], task_results: list[tuple[list[Event], FileSummary]], out: list,
             pieces: dict[int, list], progress: Callable | None) -> None:
    """A task's results into `out` by file (a file cut in ranges: its pieces, merged afterwards)."""
    for (i, args), result in zip(task, task_results, strict=True):
        result[1].file = args[0].display  # the discovery's string, not one more copy a file
        if args[3] is None:
            out[i] = result
        else:
            pieces[i].append((args[2], result))
    if progress:
        progress(sum((a[3] or a[0].size) - a[2] for _, a in task), sum(1 for _, a in task if a[2] == 0))
