"""The scanner's prefilter: the lines of a block that hold at least one anchor, in one pass over the bytes.

The engine is a multi-pattern automaton (`ahocorasick_rs`, Rust aho-corasick with a SIMD prefilter), one per 64
anchors at most (past that the SIMD prefilter is off); its cost depends on the anchors' order, which `tune` picks on
a sample of a large input (the figures: benchmarks/README.md). Where its wheel is missing (a platform or Python it
has no build for), `AnchorFinder`, pure Python through each anchor's rarest byte, finds exactly the same lines, much
more slowly.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from ddpslurm.analyze.read.bulk import BULK

#: what the finders search: bytes, or a reused read buffer
Buffer = bytes | bytearray

try:
    import ahocorasick_rs as _ahocorasick
except ImportError:  # no wheel for this platform or Python: the pure-Python finder below
    _ahocorasick = None
#: whether `ahocorasick_rs` is there for the automata; where False every finder is the pure-Python one (tests set it)
AUTOMATON_AVAILABLE = _ahocorasick is not None


class Finder(Protocol):
    def starts(self, block: Buffer, end: int | None = None) -> list[int]: ...


def minimal(anchors: Sequence[bytes]) -> tuple[bytes, ...]:
    """The anchors, once each and in their order, less those that hold another: every line holding one of those
    holds the shorter one, so the same lines are found with less to look for."""
    uniq = [a for a in dict.fromkeys(anchors) if a]
    return tuple(a for a in uniq if not any(b != a and b in a for b in uniq))


#: the most anchors one automaton takes with its SIMD prefilter (the aho-corasick crate's packed Teddy searcher):
#: past it the automaton walks every byte, several times slower for the 72 shipped anchors on the 1 GB job's text
#: (benchmarks/README.md), so more anchors are split among automata of at most this many, one pass each
TEDDY_PATTERNS = 64


def split_anchors(anchors: Sequence[bytes], most: int = TEDDY_PATTERNS) -> list[tuple[bytes, ...]]:
    """The anchors in their order, cut into as few consecutive groups of at most `most` as there can be, of sizes
    that differ by one at most (two groups of 36 scan faster than 64 and 8: measured)."""
    count = -(-len(anchors) // most) if anchors else 1
    size, extra = divmod(len(anchors), count)
    out, start = [], 0
    for i in range(count):
        stop = start + size + (i < extra)
        out.append(tuple(anchors[start:stop]))
        start = stop
    return out


class AutomatonFinder:
    """All anchors in automata of at most TEDDY_PATTERNS each (one, for the shipped anchors until they outgrow it);
    a line is reported once, whatever it holds."""

    def __init__(self, anchors: Sequence[bytes], per_automaton: int = TEDDY_PATTERNS) -> None:
        assert _ahocorasick is not None
        self.anchors = minimal(anchors)
        self.automata = [_ahocorasick.BytesAhoCorasick(list(group), matchkind=_ahocorasick.MATCHKIND_LEFTMOST_FIRST)
                         for group in split_anchors(self.anchors, per_automaton)]

    def match_ends(self, data: Buffer) -> list[int]:
        """Where the anchors' matches in `data` end, ascending (each automaton's matches, merged)."""
        stops: list[int] = []
        for automaton in self.automata:
            stops += [stop for _, _, stop in automaton.find_matches_as_indexes(data)]
        if len(self.automata) > 1:
            stops.sort()
        return stops

    def starts(self, block: Buffer, end: int | None = None) -> list[int]:
        """Sorted offsets of the lines of `block[:end]` (complete lines) that contain at least one anchor: the
        lines of the automata's matches (`line_starts`; in compiled code where it is built, handed the matches as
        the automata report them)."""
        size = len(block) if end is None else end
        with memoryview(block) as view, view[:size] as data:
            if BULK is not None:
                return BULK.line_starts(block, size, [a.find_matches_as_indexes(data) for a in self.automata])
            stops = self.match_ends(data)
        return line_starts(block, size, stops)


def line_starts(block: Buffer, size: int, stops: Sequence[int]) -> list[int]:
    """The offsets of the lines of `block[:size]` holding the matches that end at `stops` (ascending), one a line.

    Matches never span a line end (no anchor holds one), so each anchor line yields a match of its own.
    """
    out: list[int] = []
    line_end = -1
    find, rfind = block.find, block.rfind
    for stop in stops:
        if stop <= line_end:
            continue
        out.append(rfind(b"\n", 0, stop) + 1)
        line_end = find(b"\n", stop - 1, size)
        if line_end < 0:
            line_end = size
    return out


#: bytes ordered from common to rare in log text (ASCII letters, digits, punctuation); an anchor is looked for
#: through its rarest byte when that byte is rare in the data (see AnchorFinder)
_BYTE_ORDER = (b" etaonirslcdmuph.:0_12-/gfyb=,3k45v[]9687w()xINCLEOTRSAPDMFGU'\"BHWKVYXJQZqzj<>#@!*%&;|~^`{}+?$\\")
_RANK = {c: i for i, c in enumerate(_BYTE_ORDER)}
#: a pivot byte seen more often than once per this many bytes of a block is not rare: its anchors fall back to find
PIVOT_SPACING = 2048


class _ByteCounts(dict):
    """How often each byte occurs in `sample`, counted on first ask."""

    def __init__(self, sample: bytes) -> None:
        super().__init__()
        self.sample = sample

    def __missing__(self, byte: int) -> int:
        self[byte] = self.sample.count(bytes((byte,)))
        return self[byte]


class AnchorFinder:
    """Finds the lines of a block that hold at least one anchor, mostly through fast passes over rare bytes.

    `bytes.find` costs about the same for every anchor (most of the scan's time, each of them), while a
    single-byte `find` is a memchr, far cheaper. So each anchor is looked for through its byte rarest in the
    first block scanned (its pivot): every occurrence of the pivot is checked with `startswith` for the anchors
    it pivots. When a pivot turns out common (more than one per PIVOT_SPACING bytes scanned so far), its anchors
    move to their next rarest byte in the block at hand, or to `find` when none is rare. Anchors that contain
    another anchor are dropped (every line holding them holds the shorter one). The lines found are exactly
    the lines holding an anchor, either way.
    """

    def __init__(self, anchors: Sequence[bytes]) -> None:
        self.anchors = minimal(anchors)
        self.slow: list[bytes] = []  # anchors looked for with bytes.find
        self.pivots: dict[int, list[tuple[bytes, int]]] = {}  # pivot byte -> (anchor, offset of the pivot in it)
        self.seen: dict[int, int] = {}  # pivot byte -> occurrences so far
        self.common: set[int] = set()  # bytes found too frequent to pivot on
        self.bytes = 0
        self.ready = False

    def _choose(self, sample: bytes) -> None:
        """Pick each anchor's pivot: its byte rarest in `sample` (the first block), ties by `_BYTE_ORDER`."""
        self.ready = True
        counts = _ByteCounts(sample)
        for anchor in self.anchors:
            self._place(anchor, counts)

    def _place(self, anchor: bytes, counts: _ByteCounts) -> None:
        """Pivot `anchor` on its byte rarest in `sample` among those not yet found common, else find it."""
        offsets = [i for i in range(len(anchor)) if anchor[i] not in self.common]
        if b"\n" in anchor or not offsets:
            self.slow.append(anchor)
            return
        off = min(offsets, key=lambda i: (counts[anchor[i]], -_RANK.get(anchor[i], len(_BYTE_ORDER)), i))
        if counts[anchor[off]] > len(counts.sample) // PIVOT_SPACING + 256:
            self.slow.append(anchor)
            return
        self.pivots.setdefault(anchor[off], []).append((anchor, off))

    def _demote(self, pivot: int, block: bytes) -> list[bytes]:
        """`pivot` is common: its anchors get another pivot (or find); returns them, to be found in `block`."""
        self.common.add(pivot)
        moved = [a for a, _ in self.pivots.pop(pivot)]
        counts = _ByteCounts(block)
        for anchor in moved:
            self._place(anchor, counts)
        return moved

    def starts(self, block: Buffer, end: int | None = None) -> list[int]:
        """Sorted offsets of the lines of `block[:end]` (complete lines) that contain at least one anchor."""
        if end is not None and end != len(block):
            block = bytes(memoryview(block)[:end])
        if not self.ready:
            self._choose(block[:1 << 20])
        starts: set[int] = set()
        add = starts.add
        find, rfind, startswith = block.find, block.rfind, block.startswith
        self.bytes += len(block)
        budget = self.bytes // PIVOT_SPACING + 256
        moved: list[bytes] = []
        for pivot, group in list(self.pivots.items()):
            needle = bytes((pivot,))
            seen = self.seen.get(pivot, 0)
            pos = find(needle)
            while pos >= 0:
                seen += 1
                if seen > budget:
                    moved += self._demote(pivot, block)  # found with find below, over the whole block
                    break
                for anchor, off in group:
                    if pos >= off and startswith(anchor, pos - off):
                        add(rfind(b"\n", 0, pos) + 1)
                        end = find(b"\n", pos)
                        pos = len(block) if end < 0 else end
                        break
                pos = find(needle, pos + 1)
            self.seen[pivot] = seen
        for anchor in dict.fromkeys((*self.slow, *moved)) if moved else self.slow:
            pos = find(anchor)
            while pos >= 0:
                add(rfind(b"\n", 0, pos) + 1)
                end = find(b"\n", pos)
                if end < 0:
                    break
                pos = find(anchor, end)
        return sorted(starts)


#: this process's finders by (anchors, pure), each built on first use (or installed by `tune`)
FINDERS: dict[tuple[tuple[bytes, ...], bool], Finder] = {}


def anchor_finder(anchors: Sequence[bytes], pure: bool = False) -> Finder:
    """The finder of `anchors`, one per process (the pure one learns which pivot bytes are common)."""
    key = (tuple(anchors), pure or not AUTOMATON_AVAILABLE)
    finder = FINDERS.get(key)
    if finder is None:
        usable = [a for a in key[0] if a]
        automaton = not key[1] and all(b"\n" not in a for a in usable)
        finder = FINDERS[key] = AutomatonFinder(usable) if automaton else AnchorFinder(usable)
    return finder


#: anchor orders `tune` times (the given one, then seeded shuffles), and the sample of the input it times them on
TUNE_ORDERS = 8
TUNE_SAMPLE_BYTES = 1 << 20


def tune(anchors: Sequence[bytes], sample: bytes,
         seconds: Callable[[AutomatonFinder, bytes], float] | None = None) -> Finder:
    """Make this process's finder of `anchors` the automaton whose anchor order scans `sample` fastest.

    The automaton's SIMD prefilter (Teddy) puts anchors into buckets by their order, and every position whose
    bytes pass a bucket's masks is checked against the anchors in it: an order whose buckets mix anchors that
    log text often nearly matches costs several times another over the same bytes (over the 1 GB benchmark job,
    benchmarks/README.md). Which order is cheap depends on the text, so a few are
    timed on a sample of it. Every order finds the same lines; the pure-Python finder has no order to tune."""
    key = (tuple(anchors), False)
    if not AUTOMATON_AVAILABLE or not sample or any(b"\n" in a for a in key[0]):
        return anchor_finder(anchors)
    timer = seconds or _scan_seconds
    given = minimal(anchors)
    orders = [given, *(tuple(random.Random(seed).sample(given, len(given))) for seed in range(1, TUNE_ORDERS))]
    finders = [AutomatonFinder(order) for order in orders]
    FINDERS[key] = best = min(finders, key=lambda f: timer(f, sample))
    return best


def _scan_seconds(finder: AutomatonFinder, sample: bytes) -> float:
    """The automaton's quickest of two passes over `sample`."""
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        finder.match_ends(sample)
        best = min(best, time.perf_counter() - start)
    return best


def candidate_starts(block: Buffer, anchors: Sequence[bytes], end: int | None = None) -> list[int]:
    """Sorted offsets of the lines of `block[:end]` that contain at least one anchor."""
    return anchor_finder(anchors).starts(block, end)
