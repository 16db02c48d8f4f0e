"""The library entry points: `analyze_paths` (files and folders) and `find_job_folder` (a job id)."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ddpslurm.analyze.diagnose.engine import judge
from ddpslurm.analyze.model import Diagnosis, Event, FileSummary, SourceFile
from ddpslurm.analyze.parse import stream_ends
from ddpslurm.analyze.parse.records import all_record_events
from ddpslurm.analyze.parse.scan import scan_files
from ddpslurm.analyze.parse.tag_hosts import settle_hosts
from ddpslurm.analyze.parse.years import assumed_year, settle_years
from ddpslurm.analyze.read.bulk import pure_path_note
from ddpslurm.analyze.read.discover import (
    apply_run,
    apply_skipped,
    check_not_empty,
    check_readable,
    discover_all,
    empty_logs_note,
    is_record,
    scan_skips,
    select_run,
)
from ddpslurm.analyze.read.streams import Streams, read_streams
from ddpslurm.analyze.report.render import fill, render
from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.analyze.rules.signatures import SignatureSet
from ddpslurm.errors import AnalyzeInputError, JobNotFoundError
from ddpslurm.jobfolder import DEFAULT_ROOT, job_folder


def diagnose(events: list[Event], sources: Sequence[SourceFile], summaries: Sequence[FileSummary],
             sigs: SignatureSet, facts: dict[str, Any] | None = None) -> Diagnosis:
    """The diagnosis of one job from all its events: the diagnose stage's verdict, rendered (`events` is updated in
    place, see `engine.judge`)."""
    verdict, timeline = judge(events, sources, summaries, sigs, facts)
    return render(verdict, timeline, summaries, sigs)


def analyze_paths(paths: Sequence[str | Path], *, workers: int | None = None, progress: bool = False,
                  signature_dirs: Sequence[str | Path] = (), attempt: str | int | None = None,
                  signatures: SignatureSet | None = None, restart: str | int | None = None) -> Diagnosis:
    """Read the logs under `paths` and say why the job failed (see DESIGN.md, Analyze). A path `-` is standard
    input, and a fifo or pipe (/dev/fd/N) is read as it comes (`read.streams`). `attempt`, `restart`: which run of
    a requeued or restarted job (`read.discover.select_run`; default: the last attempt's last restart)."""
    if not paths:
        raise AnalyzeInputError("no path given", "give a job folder, log files, or a job id")
    with without_cycle_collection(), read_streams(paths) as streams:  # `-`, pipes: read into temporary copies
        return _analyze_paths(streams, workers=workers, progress=progress, signature_dirs=signature_dirs,
                              attempt=attempt, signatures=signatures, restart=restart)


@contextlib.contextmanager
def without_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused while a job is analyzed (and in the scan workers forked meanwhile).

    The analysis makes no reference cycles to speak of (a 4k-rank job leaves 39 objects for the collector), but
    the collector walks every live object again and again as hundreds of thousands of events arrive: a third of
    a 16k-rank job's time. Reference counting still frees everything else; the collector resumes afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _analyze_paths(streams: Streams, *, workers: int | None, progress: bool,
                   signature_dirs: Sequence[str | Path], attempt: str | int | None,
                   signatures: SignatureSet | None, restart: str | int | None = None) -> Diagnosis:
    sigs = signatures or load_signatures(signature_dirs)
    discovery = discover_all(streams.paths, streams.shown)
    discovery.skipped[:0] = streams.skipped
    paths = streams.names()
    sources, run = select_run(discovery.sources, attempt, restart)
    records = [s for s in sources if is_record(s)]
    logs = [s for s in sources if not is_record(s)]
    if not sources:
        raise AnalyzeInputError(f"no log files found under {', '.join(map(str, paths))}",
                                "give a job folder, a torchrun --log-dir, slurm-*.out files or a pasted log")
    events, facts, record_notes = all_record_events(records, sigs)
    year, written = assumed_year(events, logs)
    with _progress(progress, sum(s.size for s in logs), len(logs)) as advance:
        results = scan_files(logs, sigs, years=[year] * len(logs), workers=workers, progress=advance)
    summaries: list[FileSummary] = []
    for file_events, summary in results:
        events.extend(last_attempt_only(file_events) if attempt in (None, "last") else file_events)
        summaries.append(summary)
    del results  # the per-file lists: the events live on in `events` alone
    attempts = [s.attempt for s in sources if s.attempt is not None]
    attempts += [int(e.get("attempt", "0")) for e in events if e.kind == "attempt_start"]
    if attempts:
        facts["attempt"] = max(attempts)
    check_readable(discovery.explicit, summaries, len(records))
    check_not_empty(summaries, len(records))
    if logs and all(s.binary for s in summaries) and not records:
        raise AnalyzeInputError(f"{', '.join(map(str, paths))}: only binary files, no text logs",
                                "give the job's .out/.err/.log files (pickles and checkpoints are skipped)")
    diagnosis = diagnose(settle_hosts(settle_years(events, year, written)), sources, summaries, sigs, facts)
    diagnosis.notes.extend(record_notes)
    apply_run(diagnosis, run, asked=restart is not None)
    pure = pure_path_note(len(logs), sum(s.size for s in logs))
    if pure:
        diagnosis.notes.append(pure)
    empty = empty_logs_note(discovery.explicit, summaries)
    if empty:
        diagnosis.notes.append(empty)
    apply_skipped(diagnosis, discovery.skipped + scan_skips(summaries))
    diagnosis.notes.extend(scan_notes(summaries))
    return diagnosis


def scan_notes(summaries: Sequence[FileSummary]) -> list[str]:
    """What the diagnosis says of how the scan went: a worker that died, lines cut, streams not compared."""
    notes = []
    rescanned = sum(1 for s in summaries if s.rescanned)
    if rescanned:
        notes.append(f"a scan worker process ended abruptly (killed: out of memory?); the main process read "
                     f"the {rescanned} file(s) whose results had not come back")
    truncated = sum(s.truncated_lines for s in summaries)
    if truncated:
        notes.append(f"truncated {truncated} overlong line(s)")
    untallied = [s.file for s in summaries if s.streams_untallied]
    if untallied:
        notes.append(
            f"where each rank's lines end was not compared in {', '.join(untallied[:3])}"
            f"{f' and {len(untallied) - 3} more' if len(untallied) > 3 else ''} (srun --label logs over "
            f"{stream_ends.MAX_BYTES >> 20} MB): a rank that went silent there is found by its peers' lines alone")
    return notes


def last_attempt_only(file_events: list[Event]) -> list[Event]:
    """A log that several attempts appended to (requeue, --open-mode=append): keep the last attempt's part."""
    markers = [e for e in file_events if e.kind == "attempt_start"]
    if len({e.get("attempt") for e in markers}) < 2:
        return file_events
    last = max(markers, key=lambda e: (int(e.get("attempt", "0")), e.line))
    return [e for e in file_events if e.line >= last.line]


class _progress:
    """A rich progress bar on stderr (files and bytes) for long runs, when asked for and stderr is a terminal;
    else a no-op (never with --json: the command asks only for the text report)."""

    def __init__(self, enabled: bool, total: int, files: int = 0) -> None:
        self.enabled = enabled and (total > (32 << 20) or files > 2000) and os.isatty(2)
        self.total, self.files, self.done_files = total, files, 0
        self.bar: Any = None

    def __enter__(self) -> Callable[..., None] | None:
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress("scanning logs", BarColumn(), TextColumn("{task.fields[files]} files"), DownloadColumn(),
                            TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("scan", total=self.total, files=f"0/{self.files:,}")

        def advance(nbytes: int, files: int = 0) -> None:
            self.done_files += files
            self.bar.update(task, advance=nbytes, files=f"{self.done_files:,}/{self.files:,}")
        return advance

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def find_job_folder(job_id: str, folders: Sequence[str | Path] = ()) -> Path:
    """`<folder>/job_<id>` for the given folders, then the default jobs root; a clear error when absent."""
    candidates = [job_folder(f, job_id) for f in folders] + [job_folder(DEFAULT_ROOT, job_id)]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise JobNotFoundError(f"no job folder for job {job_id} (looked in {', '.join(str(c) for c in candidates)})",
                           "pass the job folder path, or --folder ROOT where ddpslurm put the job")


def job_accounting(job_id: str) -> dict[str, Any] | None:
    """sacct's view of the job through ddpslurm.scheduler, when that module and sacct are available."""
    try:
        from ddpslurm import scheduler
    except ImportError:
        return None
    fn = getattr(scheduler, "job_accounting", None)
    if fn is None:
        try:
            from ddpslurm.scheduler import accounting as mod  # type: ignore[attr-defined]

            fn = getattr(mod, "job_accounting", None)
        except ImportError:
            fn = None
    if fn is None:
        return None
    try:
        result = fn(job_id)
    except Exception:  # sacct missing or failing must not stop the log analysis
        return None
    if result is None:
        return None
    if hasattr(result, "to_dict"):
        return result.to_dict()
    return result if isinstance(result, dict) else {"accounting": str(result)}


def add_accounting(diagnosis: Diagnosis, job_id: str) -> None:
    """sacct's view of `job_id` added to `diagnosis` (apply_accounting); nothing when sacct cannot say."""
    accounting = job_accounting(job_id)
    if accounting:
        apply_accounting(diagnosis, accounting)


#: sacct's final state (ddpslurm.scheduler's JobState values) -> the cause it implies on its own
ACCOUNTING_CAUSES = {"timeout": "slurm_time_limit", "preempted": "preempted", "node_fail": "node_failure",
                     "out_of_memory": "host_oom", "cancelled": "slurm_cancelled"}


def apply_accounting(diagnosis: Diagnosis, accounting: dict[str, Any], signatures: SignatureSet | None = None) -> None:
    """Add sacct's view; when the logs said nothing (`unknown`), sacct's final state names the cause."""
    state = str(accounting.get("state", ""))
    nodes = accounting.get("nodes") or []
    diagnosis.accounting = accounting
    diagnosis.notes.append(
        f"sacct: state {accounting.get('slurm_state') or state or '?'}, exit code {accounting.get('exit_code')}, "
        f"signal {accounting.get('signal')}, requeues {accounting.get('requeue_count', 0)}, "
        f"nodes {','.join(map(str, nodes)) or '?'}")
    cause = ACCOUNTING_CAUSES.get(state)
    if diagnosis.cause != "unknown" or cause is None:
        return
    info = (signatures or load_signatures()).causes.get(cause)
    diagnosis.cause = cause
    diagnosis.first_failing_rank = None
    if info is not None:
        diagnosis.summary = fill(info.summary, {"host": diagnosis.first_failing_host}) + \
            " (from sacct: the logs show no error.)"
        diagnosis.advice = list(info.advice)
        diagnosis.retry = info.retry
