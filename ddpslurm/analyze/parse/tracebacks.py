"""Python tracebacks and torchelastic failure blocks, assembled per rank stream (pure, line-fed).

A traceback opens on `Traceback (most recent call last):` and its event is the final exception line;
chained tracebacks (`During handling of the above exception...`, `The above exception was the direct
cause...`) keep it open, so the last exception of the chain is the one reported. Lines of other streams
(other ranks in an interleaved log, NCCL or glog lines written by C++ threads) do not disturb it. One whose frames
end without an exception line (a process killed mid-print, a cut paste) is reported by its last frame (`Exc.cut`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpslurm.analyze.rules.digit_shape import shape

_START = "Traceback (most recent call last):"
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_FOREIGN = re.compile(r"^(?:[\w.-]+:\d+:\d+ \[\d+\] |[IWEF]\d{4} \d\d:|\[[IWEF] |\[\d{4}-\d\d-\d\d |"
                      r"(?:INFO|WARNING|ERROR|DEBUG):[\w.]+:|srun: |slurmstepd: |ddpslurm(?: batch)?: )")
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
#: a frame line (its indentation may be gone: a timestamp prefix strips the blanks after it)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<func>.*))?')
#: CPython's unraisable hook's header: the traceback on the stream's next line never propagated
_UNRAISABLE = "Exception ignored in"
#: exceptions that only carry another process's traceback: torch.multiprocessing.spawn's ProcessRaisedException
#: (`-- Process N terminated with the following error:` then the child's traceback), submitit's FailedJobError /
#: UncompletedJobError (`Job (task=N) failed during processing with trace:`, a rule, the child's traceback)
_WRAPPER = re.compile(r"^(?:[\w.]+\.)?(?P<type>ProcessRaisedException|FailedJobError|UncompletedJobError)\b")
_WRAPPED_PROCESS = re.compile(r"(?:-- Process (?P<proc>\d+) terminated|\(task=(?P<task>\d+)\))")
#: lines between a wrapper's message and the nested traceback it carries
_WRAPPER_GAP = 8


@dataclass(frozen=True)
class Exc:
    """A finished traceback: the final exception line, where it was raised, and its first line number."""

    text: str
    line: int
    start_line: int
    where: str | None = None
    chained: bool = False
    wrapped_by: str | None = None  # the wrapper exception type that carried this traceback from another process
    process: str | None = None  # that process's index (spawn) or task id (submitit), as the wrapper says
    cut: bool = False  # no exception line came: `text` is its last frame (a process killed mid-print, a cut paste)


#: functions an exception cannot propagate out of: CPython reports it (`Exception ignored in: <function ...>`, then
#: the traceback) and goes on, so the process did not fail of it (a DataLoader iterator's teardown, a finalizer)
UNRAISABLE_FROM = frozenset({"__del__"})


@dataclass
class _Open:
    start_line: int
    #: the assembler's count of lines fed when this stream last went on with it (it waits idle since)
    last_fed: int = 0
    #: its place among the tracebacks opened (tracebacks ending on one line end in that order)
    seq: int = 0
    where: str | None = None
    exc: str | None = None
    exc_line: int = 0
    chained: bool = False
    awaiting_chain: bool = False
    wrapper: str | None = None
    wrapper_gap: int = 0
    process: str | None = None
    #: the chain's last finished exception (text, line, where): what the traceback said if its tail is cut
    earlier: tuple[str, int, str | None] | None = None
    #: its last frame line (`File "...", line N, in f`) and that line's number: what is left if no exception follows
    frame: tuple[str, int] | None = None
    #: the function of the chain's first frame: where the exception was raised from
    outermost: str | None = None
    #: the line before was a frame whose indentation a prefix took (a timestamp's `\s+`): this one is its source line
    source_due: bool = False
    #: opened right after CPython's `Exception ignored in: ...` line: reported by the unraisable hook, not raised
    unraisable: bool = False
    #: what a wrapper wrote before the header (Metaflow's `[177/train/578 (pid 28936)] [uuid] `, YARN's container
    #: id), its digits as 0: its next lines that start alike are read without it
    head: str | None = None

    def note_process(self, text: str) -> None:
        m = _WRAPPED_PROCESS.search(text) if self.process is None else None
        if m:
            self.process = m["proc"] or m["task"]


#: lines of other streams a traceback waits for its own next line, at least (a process may die mid-traceback) ...
MAX_IDLE = 200
#: ... and per stream the log interleaves: N ranks writing at once put N lines between two of one rank's
IDLE_PER_STREAM = 4


@dataclass
class TracebackAssembler:
    """Feed (stream, text, line number); get finished exceptions back.

    A traceback left idle (its stream writes nothing more while others go on) ends after MAX_IDLE lines of the
    others, or IDLE_PER_STREAM lines per stream seen, whichever is more: in a merged log of thousands of ranks
    printing at once, one rank's next line comes thousands of lines later. Open tracebacks are kept in the order
    they last went on, so a line checks only the longest idle ones (a line per open traceback was quadratic)."""

    max_idle: int = MAX_IDLE
    #: open tracebacks by stream, least recently continued first (any: the scanner reads every line)
    open: dict[object, _Open] = field(default_factory=dict)
    #: the streams fed so far
    seen: set[object] = field(default_factory=set)
    fed: int = 0
    opened: int = 0
    #: per stream, the `fed` count at its last `Exception ignored in:` line
    ignored_at: dict[object, int] = field(default_factory=dict)

    def feed(self, stream: object, text: str, lineno: int) -> tuple[bool, list[tuple[object, Exc]]]:
        """Returns (consumed, finished): `consumed` means the line belongs to a traceback; `finished` holds each
        exception that ended with the stream it was read from (another stream's, left idle, may end here)."""
        self.fed += 1
        self.seen.add(stream)
        finished = self._idle_ones(stream) if self.open else []
        if _START in text:
            return self._header(stream, text, lineno, finished), finished
        state = self.open.pop(stream, None)
        if state is None:
            if text.startswith(_UNRAISABLE):
                self.ignored_at[stream] = self.fed
            return False, finished
        state.last_fed = self.fed
        self.open[stream] = state  # now the most recently continued
        if state.head is not None and shape(text[:len(state.head)]) == state.head:
            text = text[len(state.head):]  # a wrapper writes its prefix on every line of the traceback
        stripped = text.strip()
        if not stripped:
            return True, finished
        if any(marker in text for marker in _CHAIN):
            state.awaiting_chain = True
            return True, finished
        if _FOREIGN.match(text):
            return False, finished
        frame = _FRAME.match(text)
        if frame:
            if state.exc is not None:
                finished.extend(self._closed(stream))
                return False, finished
            state.where = f'{frame["file"]}:{frame["line"]}' + (f' in {frame["func"]}' if frame["func"] else "")
            if state.outermost is None:
                state.outermost = frame["func"] or ""
            state.frame = (stripped, lineno)
            state.source_due = not text[:1].isspace()  # its indentation gone: its source line's too
            return True, finished
        source_due, state.source_due = state.source_due, False
        if text[:1].isspace() or text.startswith("^") or text.startswith("~"):
            return True, finished  # source line / caret markers / message continuation
        if source_due and not _EXC_LINE.match(stripped):
            return True, finished  # a frame's source line whose indentation a prefix took
        if state.exc is None and _EXC_LINE.match(stripped):
            state.exc, state.exc_line = stripped, lineno
            self._note_wrapper(state, stripped)
            return True, finished
        if state.wrapper_gap > 0:
            return self._inside_wrapper(state, stripped), finished
        finished.extend(self._closed(stream))
        return False, finished

    def _header(self, stream: object, text: str, lineno: int, finished: list[tuple[object, Exc]]) -> bool:
        """A `Traceback (most recent call last):` line: the next traceback of a chain, else a new one (the open one
        of the stream ends). Whether the line is the header alone (a header mid-line, in a paste that lost its
        newlines or after a wrapper's prefix, leaves the text before it a line of its own)."""
        before = text[:text.index(_START)]
        state = self.open.get(stream)
        if state and state.awaiting_chain:
            if state.exc is not None:
                state.earlier = (state.exc, state.exc_line, state.where)
            state.awaiting_chain, state.exc, state.chained = False, None, True
            state.wrapper_gap = 0
        else:
            finished.extend(self._closed(stream))
            self.opened += 1
            state = self.open[stream] = _Open(start_line=lineno, last_fed=self.fed, seq=self.opened)
            state.unraisable = self.ignored_at.pop(stream, -2) == self.fed - 1
        state.head = shape(before) if before.strip() else None
        return not before.strip()

    @staticmethod
    def _note_wrapper(state: _Open, exc: str) -> None:
        """A wrapper's message: the traceback it carries follows, and its final line is the one to report."""
        m = _WRAPPER.match(exc)
        if m:
            state.wrapper, state.awaiting_chain, state.wrapper_gap = m["type"], True, _WRAPPER_GAP
            state.note_process(exc)

    def _inside_wrapper(self, state: _Open, stripped: str) -> bool:
        """A line between a wrapper's message and its nested traceback (`-- Process 1 terminated ...`, a rule)."""
        state.wrapper_gap -= 1
        state.note_process(stripped)
        if state.wrapper_gap == 0:
            state.awaiting_chain = False
        return True

    def _close(self, stream: object) -> list[Exc]:
        state = self.open.pop(stream, None)
        if state is not None and (state.unraisable or state.outermost in UNRAISABLE_FROM):
            return []  # Python printed it through its unraisable hook (`Exception ignored in:`): it never propagated
        if state is not None and state.exc is None and state.earlier is not None:
            # the chain's next traceback was cut before its final line (a dead process, a paste cut short)
            state.exc, state.exc_line, state.where = state.earlier
        if state is not None and state.exc is None and state.frame is not None:
            # frames and no exception line: the process died while printing it, or the paste was cut; that stream
            # raised all the same (what, its last frame may tell)
            return [Exc(text=state.frame[0], line=state.frame[1], start_line=state.start_line, where=state.where,
                        chained=state.chained, cut=True)]
        if state is None or state.exc is None:
            return []
        nested = state.wrapper is not None and state.chained
        return [Exc(text=state.exc, line=state.exc_line, start_line=state.start_line, where=state.where,
                    chained=state.chained, wrapped_by=state.wrapper if nested else None,
                    process=state.process if nested else None)]

    def _idle_ones(self, stream: object) -> list[tuple[object, Exc]]:
        """Close the tracebacks of other streams that waited longer than allowed; in the order they were opened."""
        limit = self.fed - max(self.max_idle, IDLE_PER_STREAM * len(self.seen))
        idle = []
        for key, state in self.open.items():
            if state.last_fed >= limit:
                if key != stream:
                    break
                continue  # the stream of this line: it goes on (or ends) below
            if key != stream:
                idle.append((state.seq, key))
        out: list[tuple[object, Exc]] = []
        for _seq, key in sorted(idle, key=lambda item: item[0]):
            out.extend(self._closed(key))
        return out

    def _closed(self, stream: object) -> list[tuple[object, Exc]]:
        """`_close`, each exception with its stream."""
        return [(stream, exc) for exc in self._close(stream)]

    def close_all(self) -> list[tuple[object, Exc]]:
        """End of input: finish every open traceback."""
        out: list[tuple[object, Exc]] = []
        for key in sorted(self.open, key=lambda k: self.open[k].seq):
            out.extend(self._closed(key))
        return out


_ENTRY = re.compile(r"^\s*\[(?P<idx>\d+)\]:\s*$")
_KV = re.compile(r"^\s{1,4}(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_RANK = re.compile(r"(?P<rank>-?\d+)(?: \(local_rank: (?P<local>\d+)\))?")
_EXIT = re.compile(r"(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?")
_SIG = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG\w+)\)")


#: how far an entry's exception line is indented in its `traceback :` field: torch writes the child's traceback
#: (its error file's py_callstack) with each newline followed by two spaces (`_format_failure`), so the frames sit at
#: 4 and 6 and the exception line at 2; a message without that indentation (a plain string) starts at 0
EXCEPTION_INDENTS = (0, 2)


#: the signature of a traceback cut before its exception line (`Exc.cut`): the scanner's event, the engine's filter
CUT_TRACEBACK = "python-traceback-cut"


#: where installed packages and the standard library live: a frame there is not the script's own code
_LIBRARY_PATH = re.compile(r"[/\\](?:site-packages|dist-packages)[/\\]|[/\\]lib[/\\]python\d|^<frozen ")


#: a frame in an environment's `bin/` file without `.py`: an installed package's console script (torchrun, deepspeed)
_CONSOLE_SCRIPT = re.compile(r"[/\\]bin[/\\](?P<name>[\w.-]+):\d+(?: in |$)")


def in_library(where: str | None) -> bool:
    """Whether a traceback's last frame (`file:line in func`) is in an installed package, its console script or the
    standard library (torch's collectives, its allocator, torchrun) rather than in the script: an exception raised
    there may be a victim's (a collective that failed) or any library error, one raised in the script is its own."""
    if where is None or _LIBRARY_PATH.search(where):
        return True
    script = _CONSOLE_SCRIPT.search(where)
    return script is not None and not script["name"].endswith(".py")


def _indent(text: str) -> int:
    """How many spaces `text` starts with."""
    return len(text) - len(text.lstrip(" "))


@dataclass
class ElasticBlock:
    """torchelastic's ChildFailedError summary: `Failures:`/`Other Failures:` and `Root Cause` entries."""

    active: bool = False
    section: str = "other"
    entries: list[dict[str, str]] = field(default_factory=list)
    current: dict[str, str] | None = None
    in_traceback: bool = False
    budget: int = 0

    def start(self) -> None:
        """A ChildFailedError was seen: read the block that follows."""
        self.active, self.budget = True, 400

    def feed(self, text: str, lineno: int) -> tuple[bool, list[dict[str, str]]]:
        """Returns (consumed, finished entries); each entry has section, idx, time, host, rank, ..."""
        if not self.active:
            return False, []
        self.budget -= 1
        stripped = text.strip()
        if stripped.startswith("Root Cause"):
            self._flush()
            self.section = "root"
            return True, []
        if stripped.startswith(("Other Failures", "Failures:")):
            self._flush()
            self.section = "other"
            return True, []
        m = _ENTRY.match(text)
        if m:
            self._flush()
            self.current = {"section": self.section, "idx": m["idx"], "line": str(lineno)}
            return True, []
        if self.current is not None:
            kv = _KV.match(text)
            if kv:
                self.in_traceback = kv["key"] == "traceback"
                self._set(kv["key"], kv["value"].strip())
                return True, []
            if self.in_traceback and stripped and not set(stripped) <= set("=-"):
                if _indent(text) in EXCEPTION_INDENTS and _EXC_LINE.match(stripped) and "Traceback" not in stripped:
                    self.current["exception"] = stripped
                return True, []
        if stripped and set(stripped) <= set("=-") and len(stripped) > 10:
            self.in_traceback = False
            if stripped[0] == "=" and self.entries and self.current is None and self.section == "root":
                return True, self.finish()
            self._flush()
            if stripped[0] == "=" and any(e["section"] == "root" for e in self.entries):
                return True, self.finish()
            return True, []
        if self.budget <= 0:
            return False, self.finish()
        return (self.current is not None or not stripped), []

    def _set(self, key: str, value: str) -> None:
        cur = self.current
        assert cur is not None
        if key == "rank":
            m = _RANK.match(value)
            if m:
                cur["rank"] = m["rank"]
                if m["local"]:
                    cur["local_rank"] = m["local"]
        elif key == "exitcode":
            m = _EXIT.match(value)
            if m:
                cur["exitcode"] = m["code"]
                if m["pid"]:
                    cur["pid"] = m["pid"]
        elif key == "traceback":
            cur["traceback"] = value
            m = _SIG.search(value)
            if m:
                cur["signal"] = m["name"]
        else:
            cur[key] = value

    def _flush(self) -> None:
        if self.current is not None:
            self.entries.append(self.current)
            self.current = None

    def finish(self) -> list[dict[str, str]]:
        """End the block; return its entries."""
        self._flush()
        out, self.entries = self.entries, []
        self.active, self.section, self.in_traceback = False, "other", False
        return out
