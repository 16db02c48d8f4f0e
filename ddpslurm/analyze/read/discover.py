"""Find the files to read under the paths given to analyze (pure of parsing; touches the filesystem only).

Every file is read: there is no cap on the number of files. Folders are walked without following symlinked
folders (no loops); files reached through several names are read once. What is not read is reported, never
dropped silently (`Skipped`): a symlink whose target leaves the analyzed folder (it would quote any file of the
machine as evidence), something that is not a regular file (fifo, socket, device), a folder nested deeper than
`MAX_DEPTH`, an entry that cannot be examined. Binary files by name (pickles, checkpoints, core dumps) are
skipped here, counted per folder and suffix, and by content in the scanner; nothing is ever unpickled.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from ddpslurm.analyze.model import FileSummary, SourceFile
from ddpslurm.analyze.read.file_names import path_info
from ddpslurm.errors import AnalyzeInputError, UsageError
from ddpslurm.jobfolder import (
    ATTEMPT_NAME,
    ATTEMPT_PREFIX,
    BELOW_MIN_FILE,
    DIAGNOSIS_JSON,
    DIAGNOSIS_MD,
    FR_TRACE_SUFFIX,
    GAVE_UP_FILE,
    HANG_FILE,
    HEARTBEAT_SUFFIX,
    NODE_FILE_NAME,
    RESTART_PREFIX,
    RESTARTS_FILE,
    STACKS_SUFFIX,
    rank_file_pattern,
)

#: a metadata request (a stat, an open) slower than this is a network file system's round trip to its metadata server
#: (NFS, Lustre, GPFS; a local disk's answers from the kernel, far sooner): then METADATA_THREADS threads ask side by
#: side
SLOW_METADATA_SECONDS = 50e-6
METADATA_THREADS = 16


def round_trips(count: int, seconds: float, timed: int) -> bool:
    """Whether metadata requests (`count` of them, `seconds` in all) took a network file system's round trip each,
    once `timed` of them were timed (the walk's stats, a scan's opens)."""
    return count >= timed and seconds / count > SLOW_METADATA_SECONDS


#: the first files of a walk whose stats are timed one by one, to tell a local disk from a network file system
TIMED_STATS = 64
#: entries stat-ed side by side at a time where stats are slow (each walked in order after)
STAT_AHEAD = 256
#: folders listed ahead by the threads where stats are slow, from the top of the walk's stack
LIST_AHEAD = 64
#: the most folder listings held before the walk takes them (~1 KB each for a folder of a few files)
LISTED_AHEAD = 8192
#: far beyond any job layout (torchrun's log-dir is 4 deep); only a pathological tree reaches it, and it is reported
MAX_DEPTH = 64
SKIP_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".npy", ".npz", ".so", ".gz",
                 ".zip", ".tar", ".png", ".jpg", ".core", ".h5", ".sqlite", ".db")
SKIP_NAMES = ("label.json",)
#: ddpslurm's own post-mortem in a job folder (ddpslurm.postmortem): the analyzer's output, never its input
OWN_OUTPUT_NAMES = (DIAGNOSIS_JSON, DIAGNOSIS_MD)
_RECORD_KINDS = ("start_record", "exit_record", "job_record", "elastic_error", "doctor_record", "stack_dump",
                 "hang_record", "fr_trace", "node_record")
#: the hang monitor's files (ddpslurm.launch.heartbeat): stack dumps parsed by analyze/stacks.py, flight recorder
#: dumps by analyze/flight_recorder.py; its bookkeeping; a node's file (ddpslurm.launch.node_live), which holds its
#: ranks' start and exit records (analyze/parse/records.py reads them as the ranks' own record files)
_HANG_FILES = ((rank_file_pattern(STACKS_SUFFIX, 7), "stack_dump"),
               (rank_file_pattern(FR_TRACE_SUFFIX, 7), "fr_trace"),
               (rank_file_pattern(HEARTBEAT_SUFFIX, 7), "hang_record"),
               (re.compile(re.escape(HANG_FILE)), "hang_record"),
               (NODE_FILE_NAME, "node_record"),
               (re.compile(re.escape(RESTARTS_FILE)), "hang_record"),  # a node's in-place restarts (bookkeeping)
               (re.compile(re.escape(GAVE_UP_FILE)), "hang_record"),  # an agent's rendezvous gave up (its log says it)
               (re.compile(re.escape(BELOW_MIN_FILE)), "hang_record"))  # the batch step's requeue below MIN

if TYPE_CHECKING:
    from ddpslurm.analyze.model import Diagnosis


@dataclass(frozen=True)
class Skipped:
    """A path that was not read, and why. `expected` skips (pickles by name) leave the confidence as it is."""

    path: str
    reason: str
    expected: bool = False

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass
class Discovery:
    """The files to scan, in a stable order, and what was left out."""

    sources: list[SourceFile] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    explicit: set[str] = field(default_factory=set)  # files named on the command line (not found in a folder)


def _skip_rule(name: str) -> tuple[str, str] | None:
    """(glob, reason) when a file is left out by its name alone, else None."""
    if name.startswith("."):
        return ".*", "hidden"
    if name in SKIP_NAMES:
        return name, "a case label, not a log"
    if name in OWN_OUTPUT_NAMES:
        return name, "ddpslurm's own diagnosis, not a log"
    lower = name.lower()
    if not lower.endswith(SKIP_SUFFIXES):  # one call for all of them: 32k files of a 16k-rank job pass here
        return None
    suffix = next(s for s in SKIP_SUFFIXES if lower.endswith(s))
    return f"*{suffix}", "binary by its name"


def discover(paths: Sequence[str | Path]) -> list[SourceFile]:
    """The files to analyze, in a stable order (given order, then sorted walk order)."""
    return discover_all(paths).sources


def discover_all(paths: Sequence[str | Path], shown: Mapping[str, str] | None = None) -> Discovery:
    """The files to analyze and the skipped paths. A path given that cannot be read is an AnalyzeInputError.
    `shown`: the copies of streams (`read.streams`) among `paths`, each with the name its lines are shown under."""
    found = Discovery()
    seen: set[tuple[int, int]] = set()
    shown = shown or {}
    base = _common_parent([p for p in paths if str(p) not in shown])
    for given in paths:
        path = Path(given)
        st = _stat_given(given)
        if stat.S_ISDIR(st.st_mode):
            _walk(path, seen, found)
        elif stat.S_ISREG(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                name = shown.get(str(path))
                relative = PurePath(path.name) if name is not None else _relative(path, base)
                found.sources.append(_source(str(path), path.name, relative, st.st_size, name))
                found.explicit.add(name or str(path))
        else:
            raise AnalyzeInputError(f"{given}: not a regular file, folder or pipe (a socket or device)",
                                    "give a log file or a folder of logs, or `-` to read standard input")
    return found


def _stat_given(given: str | Path) -> os.stat_result:
    try:
        st = os.stat(given)
    except FileNotFoundError:
        raise AnalyzeInputError(f"{given}: no such file or folder",
                                "give a job folder, a log file, or a job id") from None
    except OSError as error:
        raise AnalyzeInputError(f"{given}: cannot be read ({error.strerror or error})",
                                "check the path and its permissions") from None
    if not os.access(given, os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)):
        raise AnalyzeInputError(f"{given}: cannot be read (permission denied)", "check the path and its permissions")
    return st


def _common_parent(paths: Sequence[str | Path]) -> str | None:
    """The folder that holds all the given files (their names below it tell ranks and attempts)."""
    parents = [os.path.dirname(os.path.abspath(p)) for p in paths if not os.path.isdir(p)]
    if not parents:
        return None
    try:
        return os.path.commonpath(parents)
    except ValueError:
        return None


def _relative(path: Path, base: str | None) -> PurePath:
    if base is None:
        return PurePath(path.name)
    rel = os.path.relpath(os.path.abspath(path), base)
    return PurePath(rel if not rel.startswith("..") else path.name)


def _inside(target: str, root: str) -> bool:
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


class _Walk:
    """One folder tree: its real root (symlink targets must stay under it) and the by-name skips, counted."""

    def __init__(self, root: Path, seen: set[tuple[int, int]], found: Discovery) -> None:
        self.real_root = os.path.realpath(root)
        self.seen, self.found = seen, found
        self.by_name: Counter[tuple[str, str]] = Counter()
        self.stats = [0, 0.0]  #: the walk's first TIMED_STATS stats: how many, and their seconds
        self.pool: ThreadPoolExecutor | None = None

    def stats_slow(self) -> bool:
        """Whether the walk's first TIMED_STATS stats took a network file system's round trip each."""
        return round_trips(*self.stats, timed=TIMED_STATS)

    def stat_ahead(self, entries: list[os.DirEntry]) -> int:
        """Where stats are slow, the stats of the next STAT_AHEAD `entries` (the list's end: it is popped) asked
        side by side, each entry keeping its own; how many were asked (0: none, the next entry is examined alone and
        its stat timed, the first TIMED_STATS of the walk)."""
        if self.pool is None and self.stats_slow():
            self.pool = ThreadPoolExecutor(METADATA_THREADS, thread_name_prefix="ddpslurm-stat")
        if self.pool is None:
            return 0
        ahead = entries[-STAT_AHEAD:]
        list(self.pool.map(_stat_ahead, ahead))
        return len(ahead)

    def skip(self, path: str, reason: str) -> None:
        self.found.skipped.append(Skipped(path, reason))

    def entry(self, entry: os.DirEntry, depth: int, subdirs: list[Path], relative_folder: str) -> None:
        """Classify one directory entry: a subfolder to walk, a file to read, or a reported skip
        (`relative_folder`: the entry's folder relative to the root, ending with a separator, or empty)."""
        rule = _skip_rule(entry.name)
        is_link = entry.is_symlink()
        if is_link:
            target = os.path.realpath(entry.path)
            if not _inside(target, self.real_root):
                self.skip(entry.path, "symlink leaving the analyzed folder (not followed)")
                return
        if entry.is_dir(follow_symlinks=False):
            if rule:
                self.by_name[(entry.path, "hidden folder" if rule[1] == "hidden" else rule[1])] += 1
            elif depth >= MAX_DEPTH:
                self.skip(entry.path, f"folder nested deeper than {MAX_DEPTH} levels")
            else:
                subdirs.append(Path(entry.path))
            return
        if is_link and os.path.isdir(entry.path):
            return  # a symlinked folder inside the tree: its files are read through their real path
        if rule:
            self.by_name[(os.path.join(os.path.dirname(entry.path), rule[0]), rule[1])] += 1
            return
        started = time.perf_counter()
        est = entry.stat(follow_symlinks=True)
        if self.stats[0] < TIMED_STATS:
            self.stats[0] += 1
            self.stats[1] += time.perf_counter() - started
        if not stat.S_ISREG(est.st_mode):
            self.skip(entry.path, "not a regular file (fifo, socket or device)")
            return
        key = (est.st_dev, est.st_ino)
        if key not in self.seen:
            self.seen.add(key)
            rel = (*relative_folder.split(os.sep)[:-1], entry.name)  # PurePath's parts, without building one
            self.found.sources.append(_source(entry.path, entry.name, rel, est.st_size))

    def finish(self) -> None:
        for (path, reason), count in sorted(self.by_name.items()):
            self.found.skipped.append(Skipped(path, f"{reason}, {count} file(s)" if count > 1 else reason, True))


def _walk(root: Path, seen: set[tuple[int, int]], found: Discovery) -> None:
    walk = _Walk(root, seen, found)
    try:
        _walk_folders(root, walk)
    finally:  # listings asked for but not begun are dropped (a walk that failed, a loop of bind mounts)
        if walk.pool is not None:
            walk.pool.shutdown(cancel_futures=True)
    walk.finish()


def _walk_folders(root: Path, walk: _Walk) -> None:
    """The tree's folders in sorted order, each entry examined in sorted order. Where stats are slow, the walk's
    threads list folders ahead of it (`_ListAhead`): a torchrun --log-dir of 16k workers is 20k folders of two files,
    a few round trips each."""
    stack: list[tuple[Path, int, str]] = [(root, 0, "")]
    visited: set[tuple[int, int]] = set()
    ahead: _ListAhead | None = None
    while stack:
        if ahead is None and walk.pool is not None:
            ahead = _ListAhead(walk.pool)
        for next_folder, next_depth, _relative in reversed(stack[-LIST_AHEAD:]) if ahead is not None else ():
            ahead.ask(next_folder, next_depth)
        folder, depth, relative = stack.pop()
        try:
            st, entries, stated = ahead.take(folder) if ahead is not None else _listing(folder)
            if (st.st_dev, st.st_ino) in visited:
                continue
            visited.add((st.st_dev, st.st_ino))
        except OSError as error:
            walk.skip(str(folder), f"folder cannot be listed ({error.strerror or error})")
            continue
        subdirs: list[Path] = []
        entries.reverse()
        while entries:  # each entry (and the stat it caches: ~0.7 KB) freed once read: 131k files, 90 MB at once
            for _ in range(len(entries) if stated else walk.stat_ahead(entries) or 1):
                entry = entries.pop()
                try:
                    walk.entry(entry, depth, subdirs, relative)
                except OSError as error:
                    walk.skip(entry.path, f"cannot be examined ({error.strerror or error})")
        # the path of a subfolder relative to the root is its parent's plus its name (no relpath per file)
        stack.extend((d, depth + 1, f"{relative}{d.name}{os.sep}") for d in reversed(subdirs))


Listing = tuple[os.stat_result, list[os.DirEntry], bool]


class _ListAhead:
    """Folders listed by the walk's threads before the walk reaches them: the next LIST_AHEAD of its stack, and the
    subfolders of each folder listed (the walk will need each of them: it walks the same tree, by the same rules), at
    most LISTED_AHEAD listings held until the walk takes them."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.lock = threading.Lock()
        self.listings: dict[Path, Future[Listing]] = {}

    def ask(self, folder: Path, depth: int) -> None:
        """`folder` (at `depth`) listed by a thread, unless it is asked already or too many listings wait."""
        with self.lock:
            if folder in self.listings or len(self.listings) >= LISTED_AHEAD:
                return
            with contextlib.suppress(RuntimeError):  # the walk ended (its pool shut down): nothing more to list
                self.listings[folder] = self.pool.submit(self._list, folder, depth)

    def take(self, folder: Path) -> Listing:
        """`folder`'s listing: the one a thread made (raising what it raised), or made now."""
        with self.lock:
            listed = self.listings.pop(folder, None)
        return listed.result() if listed is not None else _listing(folder)

    def _list(self, folder: Path, depth: int) -> Listing:
        listed = _listing(folder, METADATA_THREADS)
        if depth < MAX_DEPTH:  # the walk goes into this folder's subfolders (deeper ones it reports)
            for entry in listed[1]:
                if _walked_folder(entry):
                    self.ask(Path(entry.path), depth + 1)
        return listed


def _walked_folder(entry: os.DirEntry) -> bool:
    """A subfolder the walk goes into (`_Walk.entry`): not a symlink, not skipped by its name."""
    try:
        return not entry.is_symlink() and _skip_rule(entry.name) is None and entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _listing(folder: Path, stat_small: int = 0) -> Listing:
    """A folder's identity, its entries in name order, and whether their stats were asked too: they are where it
    holds at most `stat_small` entries (a big folder's are asked side by side by `_Walk.stat_ahead`)."""
    st = os.stat(folder)
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    if len(entries) > stat_small:
        return st, entries, False
    for entry in entries:
        _stat_ahead(entry)
    return st, entries, True


def _stat_ahead(entry: os.DirEntry) -> None:
    """The stat `_Walk.entry` will ask of a file entry, asked now (the entry keeps it); a symlink is left for the
    walk to check first, a failure for the walk to meet and report."""
    try:
        if not entry.is_symlink() and _skip_rule(entry.name) is None and not entry.is_dir(follow_symlinks=False):
            entry.stat(follow_symlinks=True)
    except OSError:
        pass


def _source(path: str, name: str, relative: PurePath | tuple[str, ...], size: int,
            display: str | None = None) -> SourceFile:
    info = path_info(relative)
    kind = info.kind
    hang_kind = next((k for pattern, k in _HANG_FILES if pattern.fullmatch(name)), None)
    if hang_kind and kind == "log":
        kind = hang_kind
    elif name.endswith(".json") and name != ".json" and kind == "log":
        kind = "json"
    path = sys.intern(path)  # the one string of this file's name its events and summary share (events.loaded_event)
    return SourceFile(path=path, display=display or path, rank=info.rank, host=info.host, local_rank=info.local_rank,
                      attempt=info.attempt, kind=kind, size=size, task_file=info.task_file, restart=info.restart)


def select_attempt(sources: list[SourceFile], attempt: str | int | None) -> list[SourceFile]:
    """Keep one attempt's files (default: the last attempt) plus the files that belong to no attempt; of an attempt
    that restarted in place, its last restart's (`select_run`)."""
    return select_run(sources, attempt)[0]


@dataclass(frozen=True)
class RunChoice:
    """Which attempt and in-place restart the files kept by `select_run` are of. `attempt`: its number, `all`, or
    None (no attempt folders); `restart`: the restart's number (0: the attempt's first start), `all`, or None (with
    `--attempt all`, or no attempt folders); `restarts`: the restarts the attempt's folders hold; `final`: the last of
    them, the run that ended the attempt."""

    attempt: int | str | None
    restart: int | str | None
    restarts: tuple[int, ...] = ()
    final: int | None = None

    def to_dict(self) -> dict[str, object]:
        """The `run` field of `analyze --json`."""
        return {"attempt": self.attempt, "restart": self.restart, "restarts": list(self.restarts),
                "final_restart": self.final}


def select_run(sources: list[SourceFile], attempt: str | int | None,
               restart: str | int | None = None) -> tuple[list[SourceFile], RunChoice]:
    """Keep one attempt's files (default: the last attempt) and of it one in-place restart's (default: the last, the
    run that ended the attempt), plus the files that belong to no attempt, or to no host of it (the attempt's own
    bookkeeping); and which run that is. `attempt` `all`: every file, of every attempt and restart, read together.
    `restart` `all`: every restart of the attempt, read together. Pure of the filesystem (names only)."""
    if restart not in (None, "last", "all"):
        if not str(restart).isdigit():
            raise UsageError(f"--restart {restart!r} is not a number",
                             "use --restart K, --restart last or --restart all")
        restart = int(restart)
    attempts = sorted({s.attempt for s in sources if s.attempt is not None})
    if attempt == "all":
        if restart not in (None, "last"):
            raise UsageError(f"--restart {restart} with --attempt all: a restart is one attempt's",
                             "give --attempt N with --restart, or leave --restart out")
        return sources, RunChoice("all" if attempts else None, "all" if latest_restarts(sources) else None)
    if not attempts:
        if restart not in (None, "last", "all", 0):
            raise UsageError(f"restart {restart} is not in the logs (no attempt folders, no in-place restarts)",
                             "leave --restart out")
        return sources, RunChoice(None, None)
    wanted = attempts[-1] if attempt in (None, "last") else int(attempt)
    if wanted not in attempts:
        raise UsageError(f"attempt {wanted} is not in the logs (attempts found: "
                         f"{', '.join(map(str, attempts))})", "pass one of them to --attempt, or `all`")
    kept = [s for s in sources if s.attempt is None or s.attempt == wanted]
    latest = latest_restarts(kept)
    if not latest:  # never restarted in place (every job but those of --max-restarts): one run, every file of it
        if restart not in (None, "last", "all", 0):
            raise UsageError(f"restart {restart} is not in attempt {wanted} (restarts found: 0; 0 is the first "
                             "start)", "pass one of them to --restart, or `last` or `all`")
        return kept, RunChoice(wanted, "all" if restart == "all" else 0, (0,), 0)
    numbers = [restart_of(s, latest) for s in kept]
    found = tuple(sorted({n for n in numbers if n is not None} | {0}))
    if restart == "all":
        return kept, RunChoice(wanted, "all", found, found[-1])
    chosen = found[-1] if restart in (None, "last") else int(restart)  # type: ignore[arg-type]
    if chosen not in found:
        raise UsageError(f"restart {chosen} is not in attempt {wanted} (restarts found: "
                         f"{', '.join(map(str, found))}; 0 is the first start)",
                         "pass one of them to --restart, or `last` or `all`")
    return ([s for s, n in zip(kept, numbers, strict=True) if n is None or n == chosen],
            RunChoice(wanted, chosen, found, found[-1]))


def latest_restarts(sources: Sequence[SourceFile]) -> dict[tuple[int, str], int]:
    """The latest in-place restart of each (attempt, host folder) that has earlier ones: one after its last
    `restart_K/` (the agent sets restart K's files aside as restart K+1 starts)."""
    latest: dict[tuple[int, str], int] = {}
    for s in sources:
        if s.restart is not None and s.attempt is not None and s.host is not None:
            key = (s.attempt, s.host)
            latest[key] = max(latest.get(key, 0), s.restart + 1)
    return latest


def restart_of(source: SourceFile, latest: Mapping[tuple[int, str], int]) -> int | None:
    """The in-place restart a file of an attempt folder is of: K for `<host>/restart_K/`; for a host's usual names
    (its folder's files, its `node_<host>.json`) the host's latest restart (`latest`; 0 where it never restarted):
    a node lost in restart K keeps K's files under the usual names while the others go on. None for the files of
    no attempt, or of no host (the attempt's own, of every restart)."""
    if source.attempt is None:
        return None
    if source.restart is not None:
        return source.restart
    parent, name = os.path.split(source.path)
    above, folder = os.path.split(parent)
    if ATTEMPT_NAME.fullmatch(folder):
        node = NODE_FILE_NAME.fullmatch(name)
        host = node["host"] if node else None
    else:
        host = folder if ATTEMPT_NAME.fullmatch(os.path.basename(above)) else None
    return None if host is None else latest.get((source.attempt, host), 0)


def run_note(choice: RunChoice) -> str | None:
    """What the diagnosis says of the run it is of, where the attempt restarted in place (None elsewhere). Pure."""
    where = f"{ATTEMPT_PREFIX}{choice.attempt}/<host>/{RESTART_PREFIX}<K>/"
    if choice.attempt == "all":
        return ("--attempt all: every attempt's files are read together, and every in-place restart's (a rank "
                "number names another process in each run); --attempt N diagnoses one attempt, and its last restart"
                if choice.restart == "all" else None)
    if choice.final is None or len(choice.restarts) < 2:
        return None
    first = choice.restarts[0]
    if choice.restart == "all":
        return (f"attempt {choice.attempt} restarted in place {choice.final} time(s): all its runs (restarts "
                f"{first} to {choice.final}) are read together, and a rank number names another process in each; "
                f"--restart K diagnoses one ({first}: the first start)")
    if choice.restart == choice.final:
        return (f"attempt {choice.attempt} restarted in place {choice.final} time(s): this is restart {choice.final}, "
                f"the run that ended it; the earlier runs' files are in {where}: `--restart K` diagnoses one "
                f"({first}: the first start), `--restart all` all together")
    return (f"this is restart {choice.restart} of attempt {choice.attempt} ({first}: the first start), not the run "
            f"that ended it: that is restart {choice.final}, which leaving --restart out diagnoses")


def apply_run(diagnosis: Diagnosis, choice: RunChoice, asked: bool = False) -> None:
    """Say which run the diagnosis is of (a note, and `--json`'s `run`) where the attempt restarted in place, or a
    restart was `asked` for."""
    note = run_note(choice)
    if note:
        diagnosis.notes.append(note)
    if note or asked:
        diagnosis.run = choice.to_dict()


def is_record(source: SourceFile) -> bool:
    """JSON records read whole (small), not scanned line by line."""
    return source.kind in _RECORD_KINDS


def scan_skips(summaries: Sequence[FileSummary]) -> list[Skipped]:
    """What the scanner left unread: binary content, read errors (whole file or the rest of it), lines on which a
    signature's regex timed out (that signature skipped on those lines)."""
    out: list[Skipped] = []
    for s in summaries:
        if s.binary:
            out.append(Skipped(s.file, "binary content (not a text log)"))
        if s.error:
            where = f"after {s.bytes:,} bytes" if s.bytes else "nothing read"
            out.append(Skipped(s.file, f"read error ({s.error}; {where})"))
        if s.match_timeouts:
            out.append(Skipped(s.file, f"{s.match_timeouts} line(s) where a signature's regex ran past its timeout "
                                       "(that signature skipped on those lines)"))
    return out


def check_readable(explicit: set[str], summaries: Sequence[FileSummary], records: int) -> None:
    """A log named on the command line that cannot be read, or a job of which no log could be read, is an error
    of the input (exit 1), not a diagnosis."""
    for s in summaries:
        if s.error and not s.bytes and s.file in explicit:
            raise AnalyzeInputError(f"{s.file}: cannot be read ({s.error})", "check the file and its permissions")
    if summaries and not records and all(s.error and not s.bytes for s in summaries):
        raise AnalyzeInputError(f"none of the {len(summaries)} log file(s) could be read (first: {summaries[0].file}: "
                                f"{summaries[0].error})", "check the files and their permissions")


def check_not_empty(summaries: Sequence[FileSummary], records: int) -> None:
    """Logs that are all empty, with no record beside them, are nothing to diagnose: an error of the input (exit 1)
    that says so, not a diagnosis of nothing."""
    if summaries and not records and all(not s.bytes and not s.error and not s.binary for s in summaries):
        shown = (f"{summaries[0].file} is empty" if len(summaries) == 1
                 else f"all {len(summaries)} logs are empty (first {summaries[0].file})")
        raise AnalyzeInputError(f"{shown}: nothing to analyze",
                                "a job that failed before its tasks wrote anything, or output sent elsewhere: check "
                                "its --output/--error paths and `sacct -j <job>`")


def empty_logs_note(explicit: set[str], summaries: Sequence[FileSummary]) -> str | None:
    """What the diagnosis says of empty logs: every log empty (the tasks wrote nothing), or the empty files named on
    the command line. A job folder's empty files beside others are ordinary (most ranks' stderr) and not listed."""
    empty = [s.file for s in summaries if not s.bytes and not s.error and not s.binary]
    if not empty:
        return None
    if len(empty) == len(summaries):
        shown = f"{empty[0]} is empty" if len(empty) == 1 else f"all {len(empty)} logs are empty (first {empty[0]})"
        return (f"{shown}: nothing to read (a job that failed before its tasks wrote anything, or output sent "
                f"elsewhere: check its --output/--error paths and `sacct -j <job>`)")
    named = [f for f in empty if f in explicit]
    if not named:
        return None
    return f"empty, nothing to read: {', '.join(named[:5])}{f' and {len(named) - 5} more' if len(named) > 5 else ''}"


_LOWER = {"high": "medium", "medium": "low", "low": "low"}


def apply_skipped(diagnosis: Diagnosis, skipped: Sequence[Skipped]) -> None:
    """Name what was not read in the diagnosis (its `skipped` list and a note); anything skipped that was not
    expected (pickles by name are) lowers the confidence one step: the answer may have been in it."""
    if not skipped:
        return
    diagnosis.skipped = [s.to_dict() for s in skipped]
    shown = "; ".join(f"{s.path} ({s.reason})" for s in skipped[:5])
    more = f"; and {len(skipped) - 5} more (see --json)" if len(skipped) > 5 else ""
    diagnosis.notes.append(f"skipped {len(skipped)} path(s): {shown}{more}")
    if any(not s.expected for s in skipped):
        diagnosis.confidence = _LOWER.get(diagnosis.confidence, diagnosis.confidence)
