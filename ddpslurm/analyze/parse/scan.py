"""The parse stage's entry: log files in, each file's events and summary out, in the order of the files.
`scan_file` reads one file (file_scan.py): in binary blocks of whole lines, a cheap anchor prefilter picking the
lines worth reading, each of those read by the per-file state (file_state.py and the layers it is built of), a line
whose shape was read before replayed or skipped (line_recipes.py). `scan_files` reads many: one after the other in
tasks with their files read ahead when the input is small, else in worker processes (scan_tasks.py), a big file cut
into ranges at line starts so that one huge log also uses every core (file_ranges.py), and the prefilter's anchor
order timed first on a sample of a large input.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Sequence

from ddpslurm.analyze.model import Event, FileSummary, SourceFile
from ddpslurm.analyze.parse.file_ranges import split_points
from ddpslurm.analyze.parse.file_scan import scan_file
from ddpslurm.analyze.parse.scan_tasks import batches, scan_in_workers, scan_job, scan_task
from ddpslurm.analyze.read.files import prefilter_sample
from ddpslurm.analyze.read.prefilter import tune
from ddpslurm.analyze.read.read_ahead import ScanJob, time_opens_afresh
from ddpslurm.analyze.rules.signatures import SignatureSet

__all__ = ["scan_file", "scan_files"]

PARALLEL_MIN_BYTES = 8 << 20
#: inputs from this size on have the prefilter's anchor order timed on a sample of them first (prefilter.tune:
#: building and timing its candidate orders is a fixed cost, which only inputs about this large repay)
TUNE_MIN_BYTES = 64 << 20
SPLIT_MIN_BYTES = 32 << 20
#: the most ranges one file is cut into: ranges of SPLIT_MIN_BYTES up to this many, so that the workers share a file
#: whose costly lines sit in one part (a merged log's NCCL start-up of every rank at its head) and not only its bytes
MAX_RANGES = 64
#: the first files (in input order) whose last lines a summary keeps, for a report with nothing else to show
TAIL_FILES = 16


def scan_files(sources: Sequence[SourceFile], sigs: SignatureSet, *, years: Sequence[int | None] | None = None,
               workers: int | None = None, progress: Callable[[int], None] | None = None
               ) -> list[tuple[list[Event], FileSummary]]:
    """Scan every file, in parallel processes when the input is large; results in the order of `sources`."""
    years = list(years) if years is not None else [None] * len(sources)
    total = sum(s.size for s in sources)
    time_opens_afresh()  # how slow opening is, timed afresh for these files (by the workers, forked after this)
    count = workers if workers is not None else min(os.cpu_count() or 1, 8)
    if count <= 1 or total < PARALLEL_MIN_BYTES:
        results = []
        serial = [(i, (s, y, 0, None, i < TAIL_FILES)) for i, (s, y) in enumerate(zip(sources, years, strict=False))]
        for task in batches(serial):
            results += scan_task([args for _, args in task], functools.partial(scan_job, sigs, progress))
        return results
    if total >= TUNE_MIN_BYTES:
        tune(sigs.anchors, prefilter_sample(sources))  # before the fork: the workers inherit the automaton
    return scan_in_workers(sources, range_jobs(sources, years), sigs, count, progress)


def range_jobs(sources: Sequence[SourceFile], years: Sequence[int | None]) -> list[tuple[int, ScanJob]]:
    """The scan jobs of `sources`, each with its file's index: a file of 2 * SPLIT_MIN_BYTES or more is cut into
    ranges at line starts (at most MAX_RANGES), so that one huge log also uses every core."""
    jobs: list[tuple[int, ScanJob]] = []
    for i, source in enumerate(sources):
        parts = min(MAX_RANGES, source.size // SPLIT_MIN_BYTES) if source.size >= 2 * SPLIT_MIN_BYTES else 1
        cuts = split_points(source.path, source.size, parts) if parts > 1 else [0, None]
        for start, end in itertools.pairwise(cuts):
            jobs.append((i, (source, years[i], start, end if parts > 1 else None, i < TAIL_FILES)))
    return jobs
