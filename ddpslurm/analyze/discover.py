"""Find the files to read under the paths given to analyze (pure of parsing; touches the filesystem only).

Folders are walked without following symlinked folders (no loops), to a bounded depth; files reached
through several names are read once. Binary files (pickles, checkpoints, core dumps) are skipped by name
here and by content in the scanner; nothing is ever unpickled.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePath

from ddpslurm.analyze.attribution import path_info
from ddpslurm.analyze.events import SourceFile
from ddpslurm.errors import AnalyzeInputError, UsageError

MAX_DEPTH = 8
MAX_FILES = 20_000
SKIP_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".npy", ".npz", ".so", ".gz",
                 ".zip", ".tar", ".png", ".jpg", ".core", ".h5", ".sqlite", ".db")
SKIP_NAMES = ("label.json",)
_RECORD_KINDS = ("start_record", "exit_record", "job_record", "elastic_error")


def _wanted(name: str) -> bool:
    lower = name.lower()
    return not lower.endswith(SKIP_SUFFIXES) and name not in SKIP_NAMES and not name.startswith(".")


def discover(paths: Sequence[str | Path]) -> list[SourceFile]:
    """The files to analyze, in a stable order (given order, then sorted walk order)."""
    out: list[SourceFile] = []
    seen: set[tuple[int, int]] = set()
    base = _common_parent(paths)
    for given in paths:
        path = Path(given)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise AnalyzeInputError(f"{given}: no such file or folder",
                                    "give a job folder, a log file, or a job id") from None
        except OSError as error:
            raise AnalyzeInputError(f"{given}: cannot be read ({error.strerror or error})",
                                    "check the path and its permissions") from None
        if stat.S_ISDIR(st.st_mode):
            out.extend(_walk(path, seen))
        elif stat.S_ISREG(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                out.append(_source(path, _relative(path, base), st.st_size))
        else:
            raise AnalyzeInputError(f"{given}: not a regular file or folder (a fifo, socket or device)",
                                    "give a log file or a folder of logs")
    return out


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


def _walk(root: Path, seen: set[tuple[int, int]]) -> list[SourceFile]:
    found: list[SourceFile] = []
    stack: list[tuple[Path, int]] = [(root, 0)]
    visited_dirs: set[tuple[int, int]] = set()
    while stack:
        folder, depth = stack.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in visited_dirs:
                continue
            visited_dirs.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        subdirs: list[Path] = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < MAX_DEPTH and _wanted(entry.name):
                        subdirs.append(Path(entry.path))
                    continue
                if not _wanted(entry.name) or not entry.is_file(follow_symlinks=True):
                    continue
                est = entry.stat(follow_symlinks=True)
            except OSError:
                continue
            key = (est.st_dev, est.st_ino)
            if key in seen:
                continue
            seen.add(key)
            found.append(_source(Path(entry.path), PurePath(os.path.relpath(entry.path, root)), est.st_size))
            if len(found) >= MAX_FILES:
                return found
        stack.extend((d, depth + 1) for d in reversed(subdirs))
    return found


def _source(path: Path, relative: PurePath, size: int) -> SourceFile:
    info = path_info(relative)
    kind = info.kind
    if path.suffix == ".json" and kind == "log":
        kind = "json"
    return SourceFile(path=str(path), display=str(path), rank=info.rank, host=info.host, local_rank=info.local_rank,
                      attempt=info.attempt, kind=kind, size=size, task_file=info.task_file)


def select_attempt(sources: list[SourceFile], attempt: str | int | None) -> list[SourceFile]:
    """Keep one attempt's files (default: the last attempt) plus the files that belong to no attempt."""
    attempts = sorted({s.attempt for s in sources if s.attempt is not None})
    if not attempts or attempt == "all":
        return sources
    wanted = attempts[-1] if attempt in (None, "last") else int(attempt)
    if wanted not in attempts:
        raise UsageError(f"attempt {wanted} is not in the logs (attempts found: "
                                f"{', '.join(map(str, attempts))})", "pass one of them to --attempt, or `all`")
    return [s for s in sources if s.attempt is None or s.attempt == wanted]


def is_record(source: SourceFile) -> bool:
    """JSON records read whole (small), not scanned line by line."""
    return source.kind in _RECORD_KINDS
