"""A block of lines a log repeats byte for byte (a retry loop printing the same traceback or error line again and
again): a file's reading state and its block of lines in, the block's repeats replayed instead of read out.

A period may start at a head: a traceback header read in line mode (every line read, `FileState.line_mode`), or a
line alike to the last one that made an event, read in either mode (out of line mode, not among the first lines
of a file that its head anchors make read: `file_scan.head_starts`). At each head the reading state
(`FileState`, every layer's) may be taken down normalised (`_snapshot`): its clocks (`_Clocks`: the line number,
the lines read in all and per stream, the traceback assembler's lines fed and tracebacks opened, the events made,
the lines cut) subtracted from each value that counts on one of them, an event a value refers to taken down by
what it says with its line numbers so counted; every other value copied as it is, a field this module does not
know included (fail-safe: one that moves makes the states differ). When the bytes from an earlier head to this
one (a period) come again right after it, and the normalised state is the same at three heads a period apart,
the clocks moved on by the same steps and the events made the same (normalised) both times, then reading the next
period does what the last one did moved on by those steps: the scan reads its clocks only against one another (a
watch's reach, a traceback's idle limit, an event's index, the line above), so its reading of the same bytes from
a state moved on is the reading moved on. The period is then replayed as long as its bytes come again within the
block: its events copied at their new lines, the state's clocks moved on (`_move_on`).

Not replayed: a period that rewrote or dropped an event made before it (`LineEvents.rewritten_low`; its own, a
`went_on` notice's rewrite of the exception just above, are copied as rewritten), ran a match past its timeout,
or left a line waited for, a wrapped head or a failure block open (their values count on the clocks and are not
normalised); a period past `MAX_PERIOD` bytes; a reference to an event no longer in the list. `ENABLED = False`
reads every line (the reference the replay is tested against).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ddpslurm.analyze.model import EVENT_FIELDS, LINE_FIELDS, Event, is_line_number, moved
from ddpslurm.analyze.parse.line_events import NO_REWRITE

#: switched off, every line of a repeated block is read (the reference the replay is tested against)
ENABLED = True
#: where a period may start: the lines holding it are read in line mode, and a retry loop's repeats start with it
HEADER = b"Traceback (most recent call last):"
#: the heads of a block remembered as a period's possible start, and the longest period looked for
HEADS = 8
MAX_PERIOD = 64 << 10
#: heads in a row whose period came again but whose state did not, after which a file's reading stops looking
MAX_MISSES = 64
#: lines alike to the last that made an event, in a row, that started no period: after them such lines are no
#: longer looked at (traceback headers still are)
UNMATCHED = 64
#: the bytes at a period's end compared before the whole period
PROBE_BYTES = 64

#: an event's values but its line and fields, read at once
_EVENT_REST = attrgetter(*(name for name in EVENT_FIELDS if name not in ("line", "fields")))


class _Refused(Exception):
    """A state this module does not take down: no period is replayed from it."""


@dataclass(frozen=True)
class _Clocks:
    """The clocks of a reading state at a line's start (`_clocks`)."""

    line: int
    handled: int
    fed: int
    opened: int
    events: int
    cut: int
    timeouts: int
    streams: dict[object, int]

    def steps_to(self, later: _Clocks) -> tuple | None:
        """How far each clock moved from here to `later` (None: the streams are not the same)."""
        if list(self.streams) != list(later.streams):
            return None
        return (later.line - self.line, later.handled - self.handled, later.fed - self.fed,
                later.opened - self.opened, later.events - self.events, later.cut - self.cut,
                later.timeouts - self.timeouts,
                tuple(later.streams[key] - count for key, count in self.streams.items()))


def _clocks(state: Any, lineno: int) -> _Clocks:
    summary = state.summary
    return _Clocks(lineno, state.handled, state.tracebacks.fed, state.tracebacks.opened, len(state.events),
                   summary.truncated_lines if summary is not None else 0, sum(state.sigs.timeouts.values()),
                   dict(state.stream_lines))


def freeze(value: Any) -> Any:
    """A copy of `value` that compares equal to another's when the values are equal, and that later changes to
    `value` do not reach (containers copied, dataclasses by their fields); `_Refused` for any other object."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, Event)):
        return value
    kind = type(value)
    if kind is tuple:
        return tuple([freeze(v) for v in value])
    if kind is list:
        return ("[]", tuple([freeze(v) for v in value]))
    if kind is set or kind is frozenset:
        return frozenset([freeze(v) for v in value])
    if kind is dict:
        return ("{}", tuple([(freeze(k), freeze(v)) for k, v in value.items()]))
    if kind is bytearray:
        return bytes(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (kind, tuple([freeze(getattr(value, f.name)) for f in dataclasses.fields(value)]))
    raise _Refused(kind.__name__)


def _line_fields(fields: tuple, line: int) -> tuple:
    """An event's fields with each line number among them counted from `line`."""
    if not any(name in LINE_FIELDS for name, _ in fields):
        return fields
    return tuple((name, int(value) - line) if name in LINE_FIELDS and is_line_number(value) else (name, value)
                 for name, value in fields)


def normalised_event(e: Event, line: int) -> tuple:
    """What an event says, its line numbers counted from `line`."""
    return (e.line - line, _EVENT_REST(e), _line_fields(e.fields, line))


def _same(block: bytes | bytearray, at: int, cur: int, size: int) -> bool:
    """Whether the `size` bytes from `cur` repeat those from `at`: their ends compared first (a line that counts,
    a step or a time, most often ends a period that does not repeat), each copy made only then."""
    probe = min(size, PROBE_BYTES)
    end = cur + size
    return block[cur - probe:cur] == block[end - probe:end] and block[at:cur] == block[cur:end]


def _copies(template: list[Event], lines: int, times: int) -> list[Event]:
    """`moved_by` of each of the `template` events, 1, 2, ... `times` periods of `lines` further down, in order
    (where each event's line numbers are among its fields worked out once: thousands of copies of a few events)."""
    made = []
    for e in template:
        at = [(j, name, int(value)) for j, (name, value) in enumerate(e.fields)
              if name in LINE_FIELDS and is_line_number(value)]
        made.append((e, at))
    out: list[Event] = []
    for i in range(1, times + 1):
        step = i * lines
        for e, at in made:
            fields = e.fields
            if at:
                changed = list(fields)
                for j, name, value in at:
                    changed[j] = (name, str(value + step))
                fields = tuple(changed)
            out.append(moved(e, e.line + step, fields))
    return out


def _reference(state: Any, index: int, e: Event, now: _Clocks) -> tuple:
    """An event the state refers to by its index: where it is from the list's end, and what it says."""
    if not (0 <= index < now.events and state.events[index] is e):
        raise _Refused("an event no longer in the list")
    return index - now.events, normalised_event(e, now.line)


def _each(obj: Any, moving: dict[str, Any]) -> tuple:
    """A dataclass's fields taken down: those in `moving` by their function, the others frozen."""
    return tuple([moving[f.name](getattr(obj, f.name)) if f.name in moving else freeze(getattr(obj, f.name))
                  for f in dataclasses.fields(obj)])


def _open_traceback(o: Any, now: _Clocks) -> tuple:
    """An open traceback (`tracebacks._Open`) taken down; its exception line is read only while it has an
    exception (it is set with it, and `earlier` keeps both), so without one it is left out."""
    return _each(o, {
        "start_line": lambda v: v - now.line,
        "last_fed": lambda v: v - now.fed,
        "seq": lambda v: v - now.opened,
        "exc_line": lambda v: v - now.line if o.exc is not None else None,
        "earlier": lambda v: None if v is None else (v[0], v[1] - now.line, v[2]),
        "frame": lambda v: None if v is None else (v[0], v[1] - now.line),
    })


def _assembler(a: Any, now: _Clocks) -> tuple:
    return _each(a, {
        "open": lambda v: tuple([(freeze(s), _open_traceback(o, now)) for s, o in v.items()]),
        "fed": lambda v: None,
        "opened": lambda v: None,
        "ignored_at": lambda v: tuple([(freeze(s), at - now.fed) for s, at in v.items()]),
    })


def _watch(state: Any, stream: object, w: Any, now: _Clocks) -> tuple:
    own = now.streams.get(stream, 0)
    return _each(w, {
        "logged": lambda v: tuple([_reference(state, i, e, now) for i, e in v]),
        "handled_at": lambda v: v - now.handled,
        "own_at": lambda v: v - own,
    })


def _generic(state: Any, stream: object, record: list, now: _Clocks) -> tuple:
    if len(record) != 4:
        raise _Refused("a generic error's record")
    index, handled, own, e = record
    return _reference(state, index, e, now), handled - now.handled, own - now.streams.get(stream, 0)


def _summary(summary: Any) -> Any:
    if summary is None:
        return None
    return tuple([freeze(getattr(summary, f.name)) for f in dataclasses.fields(summary) if f.name != "truncated_lines"])


def _refused_if(value: Any) -> None:
    if value:
        raise _Refused("a value counting on the clocks")


def _snapshot(state: Any, now: _Clocks) -> tuple | None:
    """The reading state normalised (see the module's docstring); None where it is not taken down."""
    moving = {
        "source": lambda v: None,  # the file, unchanged by its reading
        "sigs": lambda v: None,  # the signature set: its memos change no reading; its timeouts are a clock
        "events": lambda v: None,  # a clock; the events read again are those the state refers to, taken down there
        "handled": lambda v: None,
        "rewritten_low": lambda v: None,  # reset at each head: the period's own (`_Head.low`)
        "stream_lines": lambda v: tuple([freeze(s) for s in v]),
        "previous": lambda v: (v[0] - now.line, freeze(v[1])),
        "summary": _summary,
        "watching": lambda v: tuple([(freeze(s), _watch(state, s, w, now)) for s, w in v.items()]),
        "generic": lambda v: tuple([(freeze(s), tuple([_generic(state, s, r, now) for r in records]))
                                    for s, records in v.items()]),
        "tracebacks": lambda v: _assembler(v, now),
        "pending": _refused_if,
        "waiting": _refused_if,
        "elastic": _refused_if,
    }
    try:
        return _each(state, moving)
    except _Refused:
        return None


def _move_on(state: Any, first: _Clocks, last: _Clocks, times: int) -> None:
    """Replay `times` more periods like the one from `first` to `last`: its events copied further down, and the
    state's clocks (and every value the snapshot counts from one) moved on."""
    lines = last.line - first.line
    state.events.extend(_copies(state.events[first.events:last.events], lines, times))
    dl, dh, df, do, de = (times * (getattr(last, n) - getattr(first, n))
                          for n in ("line", "handled", "fed", "opened", "events"))
    ds = {key: times * (count - first.streams[key]) for key, count in last.streams.items()}
    state.handled += dh
    for key, step in ds.items():
        state.stream_lines[key] += step
    state.previous = (state.previous[0] + dl, state.previous[1])
    if state.summary is not None:
        state.summary.truncated_lines += times * (last.cut - first.cut)
    assembler = state.tracebacks
    assembler.fed += df
    assembler.opened += do
    for o in assembler.open.values():
        o.start_line += dl
        o.last_fed += df
        o.seq += do
        if o.exc is not None:
            o.exc_line += dl
        if o.earlier is not None:
            o.earlier = (o.earlier[0], o.earlier[1] + dl, o.earlier[2])
        if o.frame is not None:
            o.frame = (o.frame[0], o.frame[1] + dl)
    for key in assembler.ignored_at:
        assembler.ignored_at[key] += df
    events = state.events
    for stream, w in state.watching.items():
        w.handled_at += dh
        w.own_at += ds.get(stream, 0)
        w.logged = [(i + de, events[i + de]) for i, _e in w.logged]
    for stream, records in state.generic.items():
        for record in records:
            record[0] += de
            record[1] += dh
            record[2] += ds.get(stream, 0)
            record[3] = events[record[0]]


@dataclass
class _Head:
    """A head of the block (a traceback header, a line alike to the last that made an event): where, the clocks
    there, and where the period before it came again, the state normalised and that period's start."""

    at: int
    clocks: _Clocks
    #: the lowest index of an event rewritten since the head before it (NO_REWRITE: none), and over its period
    own_low: int = NO_REWRITE
    low: int = NO_REWRITE
    state: tuple | None = None
    period: int = 0
    before: _Head | None = None


@dataclass
class Repeats:
    """A file's reading's repeated periods: the heads of the block being read, and the misses in a row."""

    heads: list[_Head] = field(default_factory=list)
    misses: int = 0
    #: the last line read that made an event: a line alike to it may start a period, until UNMATCHED heads in a
    #: row found no period (`unmatched`: a line that repeats among lines that do not, a step's or a time's)
    event_line: bytes | None = None
    unmatched: int = 0

    def clear(self) -> None:
        """A new block, or a line read out of line mode: no period spans it."""
        if self.heads:
            self.heads.clear()

    def at_header(self, block: bytes | bytearray, n: int, cur: int, lineno: int, state: Any) -> tuple[int, int] | None:
        """Before the head line at `cur` of `block[:n]` (`lineno` lines read before it) is read: where the
        reading goes on (offset, line count) after the periods replayed from here, or None (read it)."""
        if self.misses >= MAX_MISSES:
            return None
        now = _clocks(state, lineno)
        low, state.rewritten_low = state.rewritten_low, NO_REWRITE
        head = _Head(cur, now, low, low)
        for h in reversed(self.heads):
            size = cur - h.at
            if size > MAX_PERIOD:
                break
            if cur + size <= n and _same(block, h.at, cur, size):
                head.state, head.period, head.before, head.low = _snapshot(state, now), size, h, low
                break
            low = min(low, h.own_low)
        self.heads.append(head)
        del self.heads[:-HEADS]
        self.unmatched = 0 if head.before is not None else self.unmatched + 1
        if head.state is None:
            return None
        times = self._repeats(block, n, head, state)
        if not times:
            self.misses += 1
            return None
        assert head.before is not None
        _move_on(state, head.before.clocks, now, times)
        self.misses = 0
        self.heads.clear()
        return cur + times * head.period, lineno + times * (now.line - head.before.clocks.line)

    @staticmethod
    def _repeats(block: bytes | bytearray, n: int, head: _Head, state: Any) -> int:
        """How many periods may be replayed from `head`: 0 unless the two periods before it read alike."""
        h = head.before
        assert h is not None
        size = head.period
        h0 = h.before
        if h.state != head.state or h0 is None or h.period != size or h0.state != h.state:
            return 0
        if head.low < h.clocks.events or h.low < h0.clocks.events:
            return 0  # a period rewrote an event made before it
        steps = h.clocks.steps_to(head.clocks)
        if steps is None or steps != h0.clocks.steps_to(h.clocks) or steps[6] or steps[0] <= 0:
            return 0
        events = state.events
        made = [normalised_event(e, h.clocks.line) for e in events[h.clocks.events:head.clocks.events]]
        if made != [normalised_event(e, h0.clocks.line) for e in events[h0.clocks.events:h.clocks.events]]:
            return 0
        template = block[h.at:head.at]
        times, at = 0, head.at
        while at + size <= n and block[at:at + size] == template:
            times += 1
            at += size
        return times
