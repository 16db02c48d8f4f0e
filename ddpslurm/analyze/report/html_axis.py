"""The HTML timeline's time axis (pure): unix seconds -> x pixels, with breaks over long idle spans, and tick labels
in human units (`+250 ms`, `+1.5 s`, `+2 min 30 s`, `+1 h 05 min`).

A job's times come in bursts: a GPU Xid ten minutes before the ranks fail, the ranks' errors within a second, Slurm's
cancel a minute later. A gap that holds most of the span (BREAK_SHARE of what is left once the wider gaps are cut,
more than BREAK_OF_ALL of the whole, and MIN_BREAK_S) is cut out and drawn as a break of its own width, labelled
with its length; each burst gets a share of the width in proportion to its span, and at least MIN_PART pixels.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

#: a gap is cut out where it is more than this share of the span still drawn, this share of the whole span, and
#: this many seconds (a shorter one reads well in proportion: a straggler 20 s ahead of the timeouts it caused)
BREAK_SHARE, BREAK_OF_ALL, MIN_BREAK_S = 0.75, 0.05, 30.0
#: at most this many breaks
MAX_BREAKS = 3
#: pixels a break takes, and the least a burst of times gets
BREAK_W, MIN_PART = 34, 56
#: the tick steps, seconds: 1-2-5 from a millisecond, then the clock's own units
STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
         3600, 7200, 10800, 21600, 43200, 86400, 172800, 432000, 864000)
#: the least room a tick label needs, pixels, and the width of one of its characters (11 px monospace)
TICK_ROOM, CHAR_W = 92, 6.7


def _decimals(step: float) -> int:
    """The decimals of seconds that a tick step below a second needs (0.25 -> 2)."""
    return 0 if step >= 1 else min(3, len(f"{step:.3f}".rstrip("0").partition(".")[2]))


def human(seconds: float, step: float = 1.0) -> str:
    """A duration as a person says it, as precise as `step` asks: `250 ms`, `1.5 s`, `2 min 30 s`, `1 h 05 min`."""
    seconds, places = abs(seconds), _decimals(step)
    if seconds < 1 and step < 1:
        return f"{seconds * 1000:.0f} ms"
    if round(seconds, places) < 60:
        return f"{seconds:.{places}f} s"
    if round(seconds, places) < 3600:
        minutes, rest = divmod(round(seconds, places), 60)
        if step >= 60 or rest == 0:
            return f"{minutes:.0f} min"
        return f"{minutes:.0f} min {rest:0{places + 3 if places else 2}.{places}f} s"
    if seconds < 86400:
        hours, rest = divmod(round(seconds), 3600)
        minutes, secs = divmod(rest, 60)
        text = f"{hours} h" + (f" {minutes:02d} min" if minutes or (secs and step < 60) else "")
        return text + (f" {secs:02d} s" if secs and step < 60 else "")
    days, rest = divmod(round(seconds), 86400)
    return f"{days} d" + (f" {rest // 3600} h" if rest // 3600 else "")


def pick_step(span: float, room: float) -> float:
    """The smallest step of STEPS that leaves each tick label TICK_ROOM pixels in `room` pixels for `span` s."""
    ticks = max(1.0, room / TICK_ROOM)
    return next((s for s in STEPS if span / s <= ticks), STEPS[-1])


def bursts(times: Iterable[float]) -> list[tuple[float, float]]:
    """The spans the axis draws: the times' whole span, cut at its widest gaps while each holds more than BREAK_SHARE
    of what is still drawn (at most MAX_BREAKS cuts)."""
    ordered = sorted(set(times))
    if not ordered:
        return []
    gaps = sorted(((ordered[i + 1] - ordered[i], i) for i in range(len(ordered) - 1)), reverse=True)
    whole = drawn = ordered[-1] - ordered[0]
    cuts: list[int] = []
    for gap, at in gaps[:MAX_BREAKS]:
        if drawn <= 0 or gap <= max(BREAK_SHARE * drawn, BREAK_OF_ALL * whole, MIN_BREAK_S):
            break
        cuts.append(at)
        drawn -= gap
    edges = [0, *sorted(c + 1 for c in cuts), len(ordered)]
    return [(ordered[a], ordered[b - 1]) for a, b in itertools.pairwise(edges)]


@dataclass(frozen=True)
class Part:
    """One burst of the axis: its times and the pixels they take."""

    start: float
    end: float
    x0: float
    x1: float

    def x(self, seconds: float) -> float:
        if self.end <= self.start:
            return round((self.x0 + self.x1) / 2, 1)
        return round(self.x0 + (seconds - self.start) / (self.end - self.start) * (self.x1 - self.x0), 1)


class Axis:
    """Unix seconds -> x pixels over [x0, x1], broken over long idle spans."""

    def __init__(self, times: Iterable[float], x0: float, x1: float) -> None:
        spans = bursts(times) or [(0.0, 0.0)]
        self.origin = spans[0][0]
        room = x1 - x0 - BREAK_W * (len(spans) - 1)
        lengths = [end - start for start, end in spans]
        total = sum(lengths)
        free = max(0.0, room - MIN_PART * len(spans))
        widths = [MIN_PART + (free * length / total if total > 0 else free / len(spans)) for length in lengths]
        self.parts: list[Part] = []
        at = x0
        for (start, end), width in zip(spans, widths, strict=True):
            pad = min(8.0, width / 4)  # a burst's first and last times sit inside its part, not on the break
            self.parts.append(Part(start, end, at + pad, at + width - pad))
            at += width + BREAK_W
        self._starts = [p.start for p in self.parts]
        self.right = x1 + 12  # where a tick label may reach

    def part(self, seconds: float) -> Part:
        return self.parts[max(0, bisect.bisect_right(self._starts, seconds) - 1)]

    def x(self, seconds: float) -> float:
        part = self.part(seconds)
        return part.x(min(max(seconds, part.start), part.end))

    def offset(self, seconds: float) -> str:
        """`+1.250 s` after the axis' origin, in human units."""
        return f"+{human(seconds - self.origin, 0.001)}"

    def breaks(self) -> list[tuple[float, float]]:
        """(x of the break's middle, idle seconds) of each break."""
        return [(round((a.x1 + b.x0) / 2, 1), b.start - a.end) for a, b in itertools.pairwise(self.parts)]

    def ticks(self) -> list[tuple[float, str]]:
        """(x, label) of each tick: a part's start labelled with its offset, then steps that fit its width."""
        out = []
        for part in self.parts:
            step = pick_step(part.end - part.start, part.x1 - part.x0)
            first = part.start - self.origin
            out.append((part.x(part.start), f"+{human(first, step)}" if first else "+0"))
            tick = (first // step + 1) * step
            while tick + self.origin <= part.end + 1e-9:
                x, label = part.x(tick + self.origin), f"+{human(tick, step)}"
                if x - out[-1][0] >= (len(label) + len(out[-1][1])) / 2 * CHAR_W + 10 and \
                        x + len(label) / 2 * CHAR_W <= self.right:
                    out.append((x, label))
                tick += step
        return out
