"""Compare multi-pattern engines for the analyzer's prefilter: find the lines holding any anchor.

    python benchmarks/prefilter_engines.py [--folder .bench/big_job] [--mb 256] [--runs 3]

Reads up to --mb of the folder's log files into 4 MB blocks of whole lines (as the scanner does), then for each
engine available here times finding the start offsets of every line that holds one of the shipped signature
set's anchors, and checks that every engine finds the same lines. Prints, per engine: CPU seconds per GB
(median of --runs, `time.process_time`, one core) and the candidate line count. Engines: the pure-Python
rare-byte finder (ddpslurm.analyze.read.prefilter.AnchorFinder, the fallback), ahocorasick_rs (Rust aho-corasick, SIMD
Teddy prefilter) with every anchor in one automaton and as the analyzer builds it (AutomatonFinder: automata of at
most 64 anchors, Teddy's limit), hyperscan (Intel's engine, bundled in its wheel), pyahocorasick (C, on a latin-1
str), and one `re` alternation of the anchors.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from ddpslurm.analyze.read.blocks import iter_blocks
from ddpslurm.analyze.read.prefilter import AnchorFinder, AutomatonFinder
from ddpslurm.analyze.rules.loading import load_signatures


def load_blocks(folder: Path, limit: int) -> list[bytes]:
    blocks: list[bytes] = []
    total = 0
    for path in sorted(folder.iterdir()):
        if not path.name.endswith((".out", ".err", ".log")):
            continue
        with path.open("rb") as handle:
            for block, end, _truncated in iter_blocks(handle):
                blocks.append(bytes(block[:end]))  # a copy: the scanner's buffer is reused for the next block
                total += end
        if total >= limit:
            break
    return blocks


def line_starts(block: bytes, ends: list[int]) -> list[int]:
    """Start offsets of the lines holding the match ends `ends`, each line once, in order."""
    rfind = block.rfind
    out: list[int] = []
    last_end = -1
    for end in ends:
        if end <= last_end:
            continue
        out.append(rfind(b"\n", 0, end) + 1)
        nl = block.find(b"\n", end)
        last_end = nl if nl >= 0 else len(block)
    return out


def engine_anchor_finder(anchors: tuple[bytes, ...]) -> Callable[[bytes], list[int]]:
    finder = AnchorFinder(anchors)
    return finder.starts


def engine_ahocorasick_rs(anchors: tuple[bytes, ...]) -> Callable[[bytes], list[int]] | None:
    try:
        import ahocorasick_rs
    except ImportError:
        return None
    automaton = ahocorasick_rs.BytesAhoCorasick(list(anchors), matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_FIRST)

    def starts(block: bytes) -> list[int]:
        return line_starts(block, [end for _, _, end in automaton.find_matches_as_indexes(block)])
    return starts


def engine_automaton_finder(anchors: tuple[bytes, ...]) -> Callable[[bytes], list[int]] | None:
    """The analyzer's engine: ahocorasick_rs, in automata of at most 64 anchors (its SIMD prefilter's limit)."""
    try:
        return AutomatonFinder(anchors).starts
    except AssertionError:  # the wheel is missing
        return None


def engine_hyperscan(anchors: tuple[bytes, ...]) -> Callable[[bytes], list[int]] | None:
    try:
        import hyperscan
    except ImportError:
        return None
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=list(anchors), ids=list(range(len(anchors))), flags=0, literal=True)
    scratch = hyperscan.Scratch(db)

    def starts(block: bytes) -> list[int]:
        ends: list[int] = []
        db.scan(block, match_event_handler=lambda _id, _start, end, _flags, _ctx: ends.append(end),
                scratch=scratch)
        ends.sort()
        return line_starts(block, ends)
    return starts


def engine_pyahocorasick(anchors: tuple[bytes, ...]) -> Callable[[bytes], list[int]] | None:
    try:
        import ahocorasick
    except ImportError:
        return None
    automaton = ahocorasick.Automaton()
    for anchor in anchors:
        automaton.add_word(anchor.decode("latin-1"), len(anchor))
    automaton.make_automaton()

    def starts(block: bytes) -> list[int]:
        return line_starts(block, [end + 1 for end, _ in automaton.iter(block.decode("latin-1"))])
    return starts


def engine_re(anchors: tuple[bytes, ...]) -> Callable[[bytes], list[int]]:
    pattern = re.compile(b"|".join(re.escape(a) for a in sorted(anchors, key=len, reverse=True)))

    def starts(block: bytes) -> list[int]:
        return line_starts(block, [m.end() for m in pattern.finditer(block)])
    return starts


ENGINES = {"AnchorFinder (pure Python, rare bytes)": engine_anchor_finder,
           "ahocorasick_rs (BytesAhoCorasick)": engine_ahocorasick_rs,
           "AutomatonFinder (ahocorasick_rs, <=64 each)": engine_automaton_finder,
           "hyperscan (literal db, block mode)": engine_hyperscan,
           "pyahocorasick (latin-1 str)": engine_pyahocorasick,
           "re alternation": engine_re}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path(".bench/big_job"))
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma-separated words: engines whose name holds one are skipped")
    args = parser.parse_args()
    anchors = load_signatures().anchors
    blocks = load_blocks(args.folder, args.mb << 20)
    size = sum(map(len, blocks))
    print(f"{len(anchors)} anchors, {size / 1e6:.0f} MB in {len(blocks)} blocks from {args.folder}")
    print(f"{'engine':<42} {'build ms':>9} {'CPU s/GB (median)':>18} {'runs':>22} {'lines':>8}  same")
    reference: list[list[int]] | None = None
    skip = [w for w in args.skip.split(",") if w]
    for name, make in ENGINES.items():
        if any(w in name for w in skip):
            continue
        t0 = time.process_time()
        engine = make(anchors)
        build = time.process_time() - t0
        if engine is None:
            print(f"{name:<42} not installed")
            continue
        times = []
        for _ in range(args.runs):
            t0 = time.process_time()
            found = [engine(b) for b in blocks]
            times.append(time.process_time() - t0)
        reference = reference or found
        per_gb = [t / (size / 1e9) for t in times]
        lines = sum(map(len, found))
        print(f"{name:<42} {build * 1e3:>9.1f} {statistics.median(per_gb):>18.3f} "
              f"{' '.join(f'{t:.3f}' for t in per_gb):>22} {lines:>8}  {'yes' if found == reference else 'NO'}")


if __name__ == "__main__":
    main()
