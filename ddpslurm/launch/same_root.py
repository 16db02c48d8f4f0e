"""The same-root budget of `submit --retries`: a failure's fingerprint, how far training got, when to stop.

A fingerprint is the cause and the entity it lives on, never a rank or a time: the node for a cause that
lives on a node (the analyzer's `node_level` causes, or one it names nodes to exclude for), else the script
and, for an exception, its type. The chain stops resubmitting once `budget` attempts ended with one
fingerprint and no progress between them: SAME_ROOT_BUDGET for causes the analyzer says a resubmission may
fix (`retry` "requeue"), DETERMINISTIC_BUDGET for the others (configuration, the script's own exceptions:
analyze's `retry` "stop", from its cause table `analyzer/causes.toml`).

Progress is read from the job folder: the ranks' progress in the node files (`attempt_N/node_<host>.json`, with
`--hang-timeout`: the step a script reports through `ddpslurm.heartbeat()` and the collectives issued; older job
folders: `rank_R.heartbeat.json`) and
the step numbers in the names under `<job>/checkpoints/` (`step_1200.pt`, `iter_0001200`, `checkpoint-1200`,
`epoch=3-step=1200.ckpt`, `global_step1200`). An attempt progressed when one of them went past the furthest
point of every earlier job of the chain. Reading is bounded; a folder without these records shows no
progress. Deciding is pure; `progress_of`, `exception_type` and `script_of` read files.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.scheduler.hostlist import compress_hostlist

SAME_ROOT_BUDGET = 3  #: attempts ending with one fingerprint, without progress, after which the chain stops
DETERMINISTIC_BUDGET = 1  #: the same for a cause a resubmission cannot fix
MAX_RECORD_BYTES = 1 << 16  #: a heartbeat or exit record is ~100 bytes: anything larger is not one
MAX_NODE_BYTES = 8 << 20  #: a node file holds its ranks' states: ~200 bytes each
MAX_ENTRIES = 20_000  #: files looked at per job folder (heartbeats, exit records, checkpoint names)
CHECKPOINT_STEP = re.compile(r"(?:global_step|step|iteration|iter|checkpoint|ckpt)[_=-]?([0-9]{1,12})(?![0-9])",
                             re.IGNORECASE)


@dataclass(frozen=True)
class Progress:
    """How far training got in one job (None: nothing recorded)."""

    step: int | None = None
    collectives: int | None = None
    checkpoint_step: int | None = None

    def measures(self) -> tuple[int | None, int | None, int | None]:
        return self.step, self.collectives, self.checkpoint_step

    def beyond(self, other: Progress) -> bool:
        """True when any measure went past `other`'s (a measure `other` lacks counts from nothing)."""
        return any(mine is not None and mine > (theirs if theirs is not None else -1)
                   for mine, theirs in zip(self.measures(), other.measures(), strict=True))

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)


def furthest(points: Iterable[Progress]) -> Progress:
    """The furthest point of several jobs, measure by measure (pure)."""
    columns = zip(*(point.measures() for point in points), strict=True)
    return Progress(*(max((v for v in column if v is not None), default=None) for column in columns))


def _records(job_dir: Path, suffix: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of one kind of rank file, in every attempt folder of the job (at most MAX_ENTRIES)."""
    pattern = jobfolder.rank_glob(suffix)
    paths = (p for attempt in sorted(job_dir.glob(f"{jobfolder.ATTEMPT_PREFIX}*"))
             for where in (pattern, f"*/{pattern}") for p in attempt.glob(where))  # host folders, older layout
    yield from _read_records(paths)


def _node_progress(job_dir: Path) -> Iterator[dict[str, Any]]:
    """The ranks' progress entries of every node file of the job."""
    paths = (p for attempt in sorted(job_dir.glob(f"{jobfolder.ATTEMPT_PREFIX}*"))
             for p in attempt.glob(f"{jobfolder.NODE_FILE_PREFIX}*{jobfolder.NODE_FILE_SUFFIX}"))
    for record in _read_records(paths, MAX_NODE_BYTES):
        for state in (record.get("ranks") or {}).values() if isinstance(record.get("ranks"), dict) else ():
            if isinstance(state, dict) and isinstance(state.get("progress"), dict):
                yield state["progress"]


def _exit_records(job_dir: Path) -> Iterator[dict[str, Any]]:
    """The exit records of every attempt of the job, in every layout (`jobfolder.read_rank_records`: the node files',
    the ranks' own files)."""
    for attempt in sorted(job_dir.glob(f"{jobfolder.ATTEMPT_PREFIX}*")):
        found = jobfolder.read_rank_records(attempt, "exit")
        yield from (found[rank] for rank in sorted(found))


def _read_records(paths: Iterable[Path], max_bytes: int = 0) -> Iterator[dict[str, Any]]:
    for count, path in enumerate(paths):
        if count >= MAX_ENTRIES:
            return
        try:
            if path.stat().st_size > (max_bytes or MAX_RECORD_BYTES):
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            yield data


def _most(values: Iterable[Any]) -> int | None:
    return max((v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0), default=None)


def checkpoint_step(job_dir: Path) -> int | None:
    """The largest step number in the names of the files and folders under `<job>/checkpoints/`."""
    steps: list[int] = []
    walked = 0
    for _, dirs, files in os.walk(jobfolder.checkpoints_folder(job_dir)):
        for name in dirs + files:
            steps += [int(m) for m in CHECKPOINT_STEP.findall(name)]
        walked += len(dirs) + len(files)
        if walked >= MAX_ENTRIES:
            break
    return max(steps, default=None)


def progress_of(job_dir: str | Path) -> Progress:
    """The furthest point the job's records show (every attempt of the job)."""
    folder = Path(job_dir)
    beats = [*_records(folder, jobfolder.HEARTBEAT_SUFFIX), *_node_progress(folder)]
    return Progress(step=_most(b.get("step") for b in beats), collectives=_most(b.get("collectives") for b in beats),
                    checkpoint_step=checkpoint_step(folder))


def exception_type(job_dir: str | Path, rank: int | None = None) -> str | None:
    """The type of the exception the job's exit records show: that of `rank` (the failing rank) when it has
    one, else the most common (the first by name on a tie); None when no rank recorded an exception."""
    kinds: list[tuple[Any, str]] = []
    for record in _exit_records(Path(job_dir)):
        exc = record.get("exception")
        if record.get("status") == "exception" and isinstance(exc, dict) and isinstance(exc.get("type"), str):
            kinds.append((record.get("rank"), exc["type"][:200]))
    own = [kind for who, kind in kinds if rank is not None and who == rank]
    if own:
        return own[-1]
    counted = Counter(kind for _, kind in kinds).most_common()
    return min(kind for kind, n in counted if n == counted[0][1]) if counted else None


def script_of(job_dir: str | Path) -> str | None:
    """The file name of the script the job ran, from its job record (`ddpslurm.json`), or None."""
    try:
        record = json.loads(jobfolder.job_record_path(Path(job_dir)).read_text(encoding="utf-8"))
        script = record["spec"]["script"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Path(script).name if isinstance(script, str) and script else None


def fingerprint(diagnosis: Mapping[str, Any], node_level: bool, script: str | None,
                exception: str | None) -> str | None:
    """`cause|entity`: the node(s) for a cause on a node, else the script (and the exception type); pure."""
    cause = diagnosis.get("cause")
    if not isinstance(cause, str) or not cause:
        return None
    nodes = [str(n) for n in diagnosis.get("exclude_nodes") or ()]
    host = diagnosis.get("first_failing_host")
    if not nodes and node_level and isinstance(host, str) and host:
        nodes = [host]
    if nodes:
        return f"{cause}|node {compress_hostlist(sorted(set(nodes)))}"
    return f"{cause}|script {script or '?'}" + (f" {exception}" if exception else "")


def budget(retry: str | None) -> int:
    """How many attempts may end with one fingerprint, without progress, before the chain stops (pure)."""
    return SAME_ROOT_BUDGET if retry == "requeue" else DETERMINISTIC_BUDGET


def repeats(history: Sequence[tuple[str | None, bool]]) -> int:
    """How many attempts ended with the last attempt's fingerprint since the last one that progressed (that
    one included): `history` is (fingerprint, progressed) per attempt, in order (pure)."""
    if not history or history[-1][0] is None:
        return 0
    last, count = history[-1][0], 0
    for key, progressed in reversed(history):
        count += key == last
        if progressed:
            break
    return count


def same_root_stop(history: Sequence[tuple[str | None, bool]], retry: str | None) -> str | None:
    """Why the chain stops resubmitting the last attempt's fingerprint, or None while its budget lasts (pure)."""
    seen, allowed = repeats(history), budget(retry)
    if not seen or seen < allowed:
        return None
    return (f"same root {history[-1][0]} {seen} time(s) without progress (budget {allowed}): "
            "it would fail the same way again")
