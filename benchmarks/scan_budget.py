"""Where the scanner's CPU goes per file: what reading, prefiltering, the rest of a file's fixed cost, reading its
candidate lines and building their events each cost, in one process.

    python benchmarks/scan_budget.py [--folder .bench/scale/r16384_submitit_oom_c11000_gb0.5] [--skip 400]
                                     [--files 2000] [--rounds 3] [--parts]

Scans --files of the folder's files (after --skip, scanned first to warm the signature set's memos as a worker's
are) serially, --rounds times, and prints per file kind (its suffix) the minimum CPU microseconds a file of:
opening and reading it in blocks; that plus the prefilter; `scan_file` with every candidate line passed over
(`FileState.handle` a no-op: the floor a file costs before any line is read); `scan_file` as it is; and `scan_file`
with its events built as bare 5-slot objects and no told-once pass (what building events costs). The last three
switch the scanner's own functions for the run: a measuring tool, not a product path. With --parts, it then prints
what a file's fixed-cost parts cost a call (the binary test of its head, the prefilter, its last lines, its tail's
marks: `timeit`, the best of 7) on the compiled path and on the pure one (the compiled functions switched off for
the run), averaged over up to 50 of the files of each kind.
"""

from __future__ import annotations

import argparse
import gc
import time
import timeit
from collections import defaultdict, deque
from collections.abc import Callable
from pathlib import Path

from ddpslurm.analyze.model import FileSummary
from ddpslurm.analyze.parse import continued_lines, file_scan, file_summary, line_events, scan
from ddpslurm.analyze.parse.file_state import FileState
from ddpslurm.analyze.read import files as read_files
from ddpslurm.analyze.read import prefilter
from ddpslurm.analyze.read.blocks import iter_blocks
from ddpslurm.analyze.read.discover import discover_all
from ddpslurm.analyze.read.files import READ_DEADLINE, Reader, prefilter_sample
from ddpslurm.analyze.read.prefilter import candidate_starts, tune
from ddpslurm.analyze.rules.loading import load_signatures

#: the figures, in the order `measure` gives them
COLUMNS = ("read", "+prefilter", "floor (no line read)", "scan_file", "scan_file, bare events")


class BareEvent:
    """What the scanner reads back from the events it built (a kind, a process, fields), and nothing else."""

    __slots__ = ("fields", "host", "kind", "pid", "rank")

    def __init__(self, kind, host, pid, rank, fields) -> None:
        self.kind, self.host, self.pid, self.rank, self.fields = kind, host, pid, rank, fields

    def get(self, name: str, default: str | None = None) -> str | None:
        return next((value for key, value in self.fields if key == name), default)


def bare_emit(state, lineno, kind, body, rank, host, pid, local, time_text, sig=None, fields=(), **_ignored) -> None:
    state.events.append(BareEvent(kind, host, pid, rank, fields))


def cpu_us(run: Callable[[], None], count: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best / count * 1e6


def read_only(sources, sigs, prefilter: bool) -> None:
    for source in sources:
        with Reader(source.path, READ_DEADLINE) as handle:
            for block, size, _truncated in iter_blocks(handle):
                if prefilter:
                    candidate_starts(block, sigs.anchors, size)


def measure(sources, sigs, rounds: int) -> dict[str, float]:
    """The five figures for these files, in microseconds of CPU a file."""
    def scan_all() -> None:
        for source in sources:
            scan.scan_file(source, sigs, 2026)

    n = len(sources)
    out = [cpu_us(lambda: read_only(sources, sigs, False), n, rounds),
           cpu_us(lambda: read_only(sources, sigs, True), n, rounds)]
    handle, emit, told_once, evolve = FileState.handle, FileState._emit, file_scan.told_once, line_events.evolve
    try:
        FileState.handle = lambda state, raw, lineno, shape=None: None
        out.append(cpu_us(scan_all, n, rounds))
        FileState.handle = handle
        out.append(cpu_us(scan_all, n, rounds))
        FileState._emit, file_scan.told_once = bare_emit, lambda events: events
        line_events.evolve = continued_lines.evolve = lambda e, **_: e
        out.append(cpu_us(scan_all, n, rounds))
    finally:
        FileState.handle, FileState._emit, file_scan.told_once = handle, emit, told_once
        line_events.evolve = continued_lines.evolve = evolve
    return dict(zip(COLUMNS, out, strict=True))


#: the fixed-cost parts `parts` times, each given a file's bytes and the signature set
PARTS: dict[str, Callable] = {
    "is_binary": lambda block, sigs: read_files.is_binary(block[:8192]),
    "candidate_starts": lambda block, sigs: candidate_starts(block, sigs.anchors, len(block)),
    "block_tail": lambda block, sigs: file_summary.block_tail(block, len(block)),
    "note_tail": lambda block, sigs: file_summary.note_tail(
        FileSummary(file="x"), deque(file_summary.block_tail(block, len(block)), file_summary.TAIL_LINES), False),
}


def part_us(part: Callable, block: bytes, sigs, number: int = 200) -> float:
    """The best of 7 `timeit` runs of one part on one file's bytes, in microseconds a call (note_tail's figure
    holds its block_tail's)."""
    return min(timeit.repeat(lambda: part(block, sigs), number=number, repeat=7)) / number * 1e6


def parts(files, sigs) -> dict[str, tuple[float, float]]:
    """Each part's microseconds a call, (compiled, pure), averaged over the files (their first 4 MB, one block)."""
    blocks = []
    for source in files[:50]:
        with open(source.path, "rb") as handle:
            blocks.append(handle.read(4 << 20))
    out = {}
    for name, part in PARTS.items():
        compiled = sum(part_us(part, b, sigs) for b in blocks) / len(blocks)
        bulk = prefilter.BULK, file_summary.BULK, read_files.BULK
        prefilter.BULK = file_summary.BULK = read_files.BULK = None
        try:
            pure = sum(part_us(part, b, sigs) for b in blocks) / len(blocks)
        finally:
            prefilter.BULK, file_summary.BULK, read_files.BULK = bulk
        out[name] = (compiled, pure)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path(".bench/scale/r16384_submitit_oom_c11000_gb0.5"))
    parser.add_argument("--skip", type=int, default=400)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", action="store_true", help="also time a file's fixed-cost parts, both paths")
    args = parser.parse_args()
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder: make one with benchmarks/make_big_job.py or analyze_scale.py")
    sigs = load_signatures()
    sources = discover_all([str(args.folder)]).sources
    tune(sigs.anchors, prefilter_sample(sources))
    gc.disable()
    for source in sources[:args.skip]:
        scan.scan_file(source, sigs, 2026)
    by_kind: dict[str, list] = defaultdict(list)
    for source in sources[args.skip:args.skip + args.files]:
        by_kind[Path(source.path).suffix or "(none)"].append(source)
    print(f"{args.folder}: CPU us a file, min of {args.rounds} rounds, one process")
    print("| files | count | KB a file | " + " | ".join(COLUMNS) + " |")
    print("|---" * (3 + len(COLUMNS)) + "|")
    for kind, files in sorted(by_kind.items()):
        figures = measure(files, sigs, args.rounds)
        size = sum(s.size for s in files) / len(files) / 1024
        print(f"| {kind} | {len(files)} | {size:.1f} | " + " | ".join(f"{v:.0f}" for v in figures.values()) + " |")
    if args.parts:
        print("\nus a call on one file, compiled / pure (best of 7, averaged over up to 50 files of each kind)")
        print("| files | " + " | ".join(PARTS) + " |")
        print("|---" * (1 + len(PARTS)) + "|")
        for kind, files in sorted(by_kind.items()):
            figures = parts(files, sigs)
            print(f"| {kind} | " + " | ".join(f"{c:.1f} / {p:.1f}" for c, p in figures.values()) + " |")


if __name__ == "__main__":
    main()
