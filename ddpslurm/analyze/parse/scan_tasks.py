"""Scan jobs run in tasks, here or in worker processes: jobs in, each job's events and summary out, in order.
Jobs (a file, or a byte range of a big one) are grouped into tasks of many small files (`batches`: per-task costs
paid once per batch); a task scans its jobs one after the other, the next ones' files opened and read ahead
meanwhile (`scan_task`). Past a size, the tasks are run by a pool of worker processes that inherit (or are sent
once) the compiled signatures and the job list (`scan_in_workers`), longest first; their results are put back in the
order of the files, a file's ranges merged (`merge_parts`), and the tasks of a worker that ended abruptly are
scanned here.
"""

from __future__ import annotations

import functools
import gc
import itertools
import os
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ddpslurm.analyze.model import Event, FileSummary, SourceFile
from ddpslurm.analyze.parse.file_ranges import merge_parts
from ddpslurm.analyze.parse.file_scan import scan_file
from ddpslurm.analyze.parse.shared_values import canonical
from ddpslurm.analyze.read.discover import METADATA_THREADS
from ddpslurm.analyze.read.files import Opened
from ddpslurm.analyze.read.read_ahead import READ_AHEAD_FILES, ScanJob, opens_slow, read_ahead
from ddpslurm.analyze.rules.signatures import SignatureSet

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


def scan_job(sigs: SignatureSet, progress: Callable | None, args: ScanJob, opened: Opened | None
              ) -> tuple[list[Event], FileSummary]:
    """One scan job (through `opened` where `read_ahead` opened its file), its progress told where there is one to
    tell (a worker's is told by the pool's parent)."""
    source, year, start, end, keep_tail = args
    result = scan_file(source, sigs, year, progress, start=start, end=end, keep_tail=keep_tail, opened=opened)
    if progress:
        progress(0, 1)
    return result


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


_WORKER_SIGS: SignatureSet | None = None
#: a worker's jobs in task order (`scan_in_workers`, through `_init_worker`): a task names a range of them
_WORKER_JOBS: list[ScanJob] = []


def _init_worker(sigs: SignatureSet, jobs: list[ScanJob]) -> None:
    """Pool initializer: the compiled signatures and the scan's jobs in task order reach each worker once (inherited
    on fork, each pool's own, a worker the pool starts again included; a spawned worker is sent them). A worker
    makes no reference cycles to speak of: its cycle collector stays off, as the parent's is while it analyzes."""
    global _WORKER_SIGS, _WORKER_JOBS
    _WORKER_SIGS = sigs
    _WORKER_JOBS = jobs
    gc.disable()


def _scan_batch(batch: list[ScanJob]) -> list[tuple[list[Event], FileSummary]]:
    """Many small files in one worker task: the per-task cost (pickling, scheduling) is paid once per batch."""
    assert _WORKER_SIGS is not None
    return scan_task(batch, functools.partial(scan_job, _WORKER_SIGS, None))


def _scan_span(span: tuple[int, int]) -> list[tuple[list[Event], FileSummary]]:
    """`_scan_batch` of the jobs `_WORKER_JOBS[start:stop]`: a task is sent as two numbers, not as its files (a 16k-rank
    job's 32k SourceFiles are not pickled by the parent and unpickled by a worker again)."""
    start, stop = span
    return _scan_batch(_WORKER_JOBS[start:stop])


def scan_in_workers(sources: Sequence[SourceFile], jobs: list[tuple[int, ScanJob]], sigs: SignatureSet, count: int,
                    progress: Callable | None) -> list[tuple[list[Event], FileSummary]]:
    """Scan `jobs` (each with the index of its file in `sources`) in up to `count` worker processes, the longest
    first: the results in the order of `sources`, a file cut in ranges merged back. Where a worker ends abruptly (the
    kernel's OOM killer, a signal), the tasks not received are scanned here, their summaries marked rescanned."""
    import multiprocessing  # worker processes only for a large input: a small one starts without them
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    jobs = sorted(jobs, key=lambda job: -((job[1][3] or job[1][0].size) - job[1][2]))
    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    out: list = [None] * len(sources)
    pieces: dict[int, list[tuple[int, tuple[list[Event], FileSummary]]]] = defaultdict(list)  # files cut in ranges
    tasks = batches(jobs)
    workers = min(count, len(tasks))
    in_order = [args for task in tasks for _, args in task]  # inherited by forked workers, sent to spawned ones
    spans = list(itertools.pairwise(itertools.accumulate((len(t) for t in tasks), initial=0)))
    received = 0
    try:
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(sigs, in_order)) as pool:
            for task_results in pool.map(_scan_span, spans):
                _collect(tasks[received], task_results, out, pieces, progress)
                received += 1
    except BrokenProcessPool:  # a worker ended abruptly (the kernel's OOM killer, a signal): the rest is read here
        for task in tasks[received:]:
            task_results = scan_task([args for _, args in task], functools.partial(scan_job, sigs, None))
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
        summary = result[1]
        summary.file = args[0].display  # the discovery's string, not one more copy a file
        # the marks of alike endings, and alike last lines, held once in this process (a worker's pickle shares them
        # within its batch only: 64k copies of a few endings otherwise, 22 MB at 65k ranks)
        summary.end_marks = canonical(summary.end_marks)
        summary.last_line = canonical(summary.last_line)
        if args[3] is None:
            out[i] = result
        else:
            pieces[i].append((args[2], result))
    if progress:
        progress(sum((a[3] or a[0].size) - a[2] for _, a in task), sum(1 for _, a in task if a[2] == 0))
