"""The job folder's contract: every name ddpslurm writes into a job folder or reads from one.

Writers (`submit`, the worker, the batch step, the hang monitor, `doctor`) and readers (`analyze`, `status`,
`triage`, `--retries`) take the names from here, never spell them themselves::

    <root>/                          the jobs root (--folder; DEFAULT_ROOT), private (check_folder)
      .submission_file_<hex>.sh      submitit's batch script (sacct's SubmitLine names it)
      job_<jobid>/
        ddpslurm.json                the job record (submit)
        retries.json                 the retry chain (submit --retries)
        checkpoints/                 for the script (DDPSLURM_JOB_FOLDER/checkpoints)
        %j_submission.sh             submitit: %j_submitted.pkl, %j_%t_log.out, %j_%t_log.err, %j_%t_result.pkl
        doctor/node_<host>.json      one pre-flight record per node (doctor, submit --preflight)
        attempt_<N>/                 N = SLURM_RESTART_COUNT; made once by the batch step, before srun
          node_<host>.json           one per node: its ranks' progress, signals, start and exit records
                                     (`ranks.<R>.start`, `ranks.<R>.exit`; launch/node_live.py)
          <host>/                    one per node, made by the batch step with the attempt folder
            rank_<R>.log             the rank's stdout and stderr: the one copy of its output
            rank_<R>.stacks.txt      on a hang only (--hang-timeout); rank_<R>.fr_trace.json beside it
            rank_<R>.start.json      rank_<R>.exit.json: only where the node's agent did not confirm the
                                     rank's records in time (the rank then writes its own)
          hang.json                  the hang monitor's request to end the attempt
          requeue.json               the batch step's requeue outcome

Older job folders hold a start and an exit record per rank in the host folders, or every rank file straight in
`attempt_<N>/` with a `rank_<R>.heartbeat.json` and `rank_<R>.signal.json` per rank: the readers take every
layout (`read_rank_records`, `rank_record_paths`).

Names and patterns are pure; `read_rank_records` is the readers' one way to a rank's records; `write_json` and
`check_folder` are the two writers' helpers (they touch disk).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpslurm.errors import SubmitError

#: the jobs root when --folder is not given
DEFAULT_ROOT = "ddpslurm_jobs"
JOB_PREFIX = "job_"
ATTEMPT_PREFIX = "attempt_"
RANK_PREFIX = "rank_"
#: what stands for the job id: submitit's placeholder (the folder it is given), and the one shown to a person
SUBMITIT_JOB_ID = "%j"
SHOWN_JOB_ID = "<jobid>"

# --- job folder -------------------------------------------------------------------------------------------
JOB_RECORD_FILE = "ddpslurm.json"
CHAIN_FILE = "retries.json"
#: a failed job's post-mortem, written at its end (ddpslurm.postmortem): the analyzer's output, never its input
DIAGNOSIS_JSON = "diagnosis.json"
DIAGNOSIS_MD = "diagnosis.md"
CHECKPOINTS_DIR = "checkpoints"
DOCTOR_DIR = "doctor"
DOCTOR_RECORD_PREFIX = "node_"
DOCTOR_RECORD_SUFFIX = ".json"
DOCTOR_RECORD_GLOB = f"{DOCTOR_RECORD_PREFIX}*{DOCTOR_RECORD_SUFFIX}"

# --- attempt folder ---------------------------------------------------------------------------------------
LOG_SUFFIX = ".log"
START_SUFFIX = ".start.json"
EXIT_SUFFIX = ".exit.json"
SIGNAL_SUFFIX = ".signal.json"
HEARTBEAT_SUFFIX = ".heartbeat.json"
STACKS_SUFFIX = ".stacks.txt"
FR_TRACE_SUFFIX = ".fr_trace.json"
#: one node's liveness and records file in the attempt folder: `node_<host>.json`
NODE_FILE_PREFIX = "node_"
NODE_FILE_SUFFIX = ".json"
#: `<host>/restart_<K>/`: an in-place restart's earlier rank files; `<host>/restarts.json`: its restarts
RESTART_PREFIX = "restart_"
RESTARTS_FILE = "restarts.json"
#: `attempt_<N>/below_min.json`: the batch step's decision when a node range fell below its MIN
BELOW_MIN_FILE = "below_min.json"
#: `attempt_<N>/<host>/rendezvous_gave_up.json`: an agent's record of torch's rendezvous giving up (launch.below_min)
GAVE_UP_FILE = "rendezvous_gave_up.json"
#: the hang monitor's request to end the attempt
HANG_FILE = "hang.json"
REQUEUE_FILE = "requeue.json"

# --- submitit's files -------------------------------------------------------------------------------------
SUBMITIT_STDOUT = "%j_%t_log.out"
SUBMITIT_STDERR = "%j_%t_log.err"
SUBMITIT_RESULT = "%j_%t_result.pkl"
SUBMITIT_SUBMITTED = "%j_submitted.pkl"
SUBMITIT_SUBMISSION = "%j_submission.sh"

# --- readers: patterns over names (fullmatch a name; `\d` as the readers always took it) ---------------------
#: `job_<jobid>` (an array task's id too: `job_123_4`); group 1 is the job id
JOB_FOLDER_NAME = re.compile(rf"^{JOB_PREFIX}(\d+(?:_\d+)?)$")
#: `attempt_<N>`; group `n`
ATTEMPT_NAME = re.compile(rf"^{ATTEMPT_PREFIX}(?P<n>\d+)$")
#: `restart_<K>` (in a host folder); group `k`
RESTART_NAME = re.compile(rf"^{RESTART_PREFIX}(?P<k>\d+)$")
#: a node file's name (`node_<host>.json`); group `host`
NODE_FILE_NAME = re.compile(rf"^{NODE_FILE_PREFIX}(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*){re.escape(NODE_FILE_SUFFIX)}$")
#: submitit's per-task files in the job folder; groups `job`, `task`
SUBMITIT_TASK_FILE = re.compile(
    r"^(?P<job>\d+(?:_\d+)?)_(?P<task>\d+)_(?:log\.(?:out|err)|result\.pkl|submitted\.pkl)$")
#: submitit's `%j_submission.sh` in the job folder; group 1 is the job id
SUBMITIT_SUBMISSION_NAME = re.compile(r"^(\d+(?:_\d+)?)_submission\.sh$")
#: submitit's batch script in the jobs root (`sbatch <root>/.submission_file_<hex>.sh`)
SUBMITIT_BATCH_FILE = re.compile(r"\.submission_file_[0-9a-f]+\.sh")


def job_folder_name(job_id: str) -> str:
    """`job_<jobid>`."""
    return f"{JOB_PREFIX}{job_id}"


def job_folder(root: str | os.PathLike[str], job_id: str) -> Path:
    """`<root>/job_<jobid>`."""
    return Path(root) / job_folder_name(job_id)


def attempt_folder(job_dir: Path, attempt: int) -> Path:
    """`<job>/attempt_<N>`."""
    return job_dir / f"{ATTEMPT_PREFIX}{attempt}"


def folder_host(host: str) -> str:
    """`host` as a folder and file name: characters other than letters, digits, `.`, `_`, `-` become `_`, and a
    leading `.` or `-` too (never hidden, never an option); `unknown` for an empty name. Pure."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host.strip())[:200]
    if safe[:1] in (".", "-"):
        safe = "_" + safe[1:]
    return safe or "unknown"


def host_folder(attempt_dir: Path, host: str) -> Path:
    """`<attempt>/<host>/`: the per-rank files of the ranks on that node."""
    return attempt_dir / folder_host(host)


def node_file_path(attempt_dir: Path, host: str) -> Path:
    """`<attempt>/node_<host>.json`."""
    return attempt_dir / f"{NODE_FILE_PREFIX}{folder_host(host)}{NODE_FILE_SUFFIX}"


def rank_file(folder: Path, rank: int, suffix: str) -> Path:
    """`<folder>/rank_<R><suffix>`, e.g. `rank_3.exit.json` for EXIT_SUFFIX (`folder`: a host folder, or an
    attempt folder of the older layout)."""
    return folder / f"{RANK_PREFIX}{rank}{suffix}"


def rank_paths(attempt_dir: Path, rank: int, host: str | None = None) -> dict[str, Path]:
    """The log, start, exit and (older layout) signal record paths of one rank in one attempt: in the rank's host
    folder when `host` is given, else straight in the attempt folder (the layout before per-host folders)."""
    folder = host_folder(attempt_dir, host) if host is not None else attempt_dir
    return {"log": rank_file(folder, rank, LOG_SUFFIX), "start": rank_file(folder, rank, START_SUFFIX),
            "exit": rank_file(folder, rank, EXIT_SUFFIX), "signal": rank_file(folder, rank, SIGNAL_SUFFIX)}


def rank_record_paths(attempt_dir: Path, suffix: str) -> dict[int, Path]:
    """Every rank's file of one kind in an attempt, by rank, in either layout (`<attempt>/<host>/rank_R<suffix>`,
    or the older `<attempt>/rank_R<suffix>`); reads listings only. A rank found in both: the host folder's."""
    pattern = rank_file_pattern(suffix)
    found: dict[int, Path] = {}
    try:
        entries = sorted(os.scandir(attempt_dir), key=lambda e: e.name)
    except OSError:
        return found
    folders = []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match:
            found.setdefault(int(match["rank"]), Path(entry.path))
        elif not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
            folders.append(entry.path)
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            match = pattern.fullmatch(name)
            if match:
                found[int(match["rank"])] = Path(folder, name)
    return found


#: the kinds of rank record a node file holds (`ranks.<R>.<kind>`, each a whole record with that `kind`)
RECORD_KINDS = ("start", "exit")
#: the suffix of a rank's own file of each record kind
RECORD_SUFFIXES = {"start": START_SUFFIX, "exit": EXIT_SUFFIX}
#: a node file or a rank record bigger than this is not one (a node of 10k local ranks' records is ~30 MB)
MAX_RECORDS_BYTES = 64 << 20


def node_file_records(node: Any, kind: str) -> dict[int, dict[str, Any]]:
    """The whole `kind` records ("start", "exit") a node file's content holds, by rank; a state whose entry is not
    a record of that kind (older node files kept a summary of the end, `{status, exit_code}`, beside the rank's
    own file) is none. Pure."""
    ranks = node.get("ranks") if isinstance(node, dict) else None
    found: dict[int, dict[str, Any]] = {}
    for key, state in (ranks or {}).items() if isinstance(ranks, dict) else ():
        record = state.get(kind) if isinstance(state, dict) else None
        if isinstance(record, dict) and record.get("kind") == kind and str(key).isdigit():
            found[int(key)] = record
    return found


def read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object a job-folder file holds (read up to MAX_RECORDS_BYTES); None when absent, unreadable, too
    big or not an object."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(MAX_RECORDS_BYTES + 1) or b"null")
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def node_file_paths(attempt_dir: Path) -> list[Path]:
    """The node files of an attempt (one listing), sorted by name."""
    try:
        names = sorted(os.listdir(attempt_dir))
    except OSError:
        return []
    return [attempt_dir / name for name in names if NODE_FILE_NAME.fullmatch(name)]


def read_rank_records(attempt_dir: Path, kind: str) -> dict[int, dict[str, Any]]:
    """Every rank's `kind` record ("start", "exit") of one attempt, by rank, in every layout: the node files' first
    (the agents'), then, for the ranks they do not name, the ranks' own files (a rank whose agent did not confirm
    in time, or an older job folder: `rank_record_paths`). Reads the attempt folder's listing, the node files and
    one listing per host folder: O(nodes) requests, plus one read per rank file found."""
    found: dict[int, dict[str, Any]] = {}
    for path in node_file_paths(attempt_dir):
        found.update(node_file_records(read_object(path), kind))
    for rank, path in rank_record_paths(attempt_dir, RECORD_SUFFIXES[kind]).items():
        if rank not in found:
            record = read_object(path)
            if record is not None:
                found[rank] = record
    return found


def heartbeat_path(attempt_dir: Path, rank: int) -> Path:
    return rank_file(attempt_dir, rank, HEARTBEAT_SUFFIX)


def stacks_path(attempt_dir: Path, rank: int) -> Path:
    return rank_file(attempt_dir, rank, STACKS_SUFFIX)


def fr_trace_path(attempt_dir: Path, rank: int) -> Path:
    return rank_file(attempt_dir, rank, FR_TRACE_SUFFIX)


def hang_path(attempt_dir: Path) -> Path:
    return attempt_dir / HANG_FILE


def requeue_path(attempt_dir: Path) -> Path:
    return attempt_dir / REQUEUE_FILE


def job_record_path(job_dir: Path) -> Path:
    return job_dir / JOB_RECORD_FILE


def chain_path(job_dir: str | os.PathLike[str]) -> Path:
    return Path(job_dir) / CHAIN_FILE


def checkpoints_folder(job_dir: Path) -> Path:
    return job_dir / CHECKPOINTS_DIR


def doctor_folder(job_dir: Path) -> Path:
    return job_dir / DOCTOR_DIR


def doctor_record_path(job_dir: Path, node: str) -> Path:
    """`<job>/doctor/node_<host>.json`."""
    return doctor_folder(job_dir) / f"{DOCTOR_RECORD_PREFIX}{node}{DOCTOR_RECORD_SUFFIX}"


def doctor_record_node(name: str) -> str | None:
    """The host of a `node_<host>.json` file name, or None for another name."""
    if name.startswith(DOCTOR_RECORD_PREFIX) and name.endswith(DOCTOR_RECORD_SUFFIX):
        return name[len(DOCTOR_RECORD_PREFIX):-len(DOCTOR_RECORD_SUFFIX)]
    return None


def rank_glob(suffix: str) -> str:
    """The glob of one kind of rank file in an attempt folder: `rank_*.exit.json` for EXIT_SUFFIX."""
    return f"{RANK_PREFIX}*{suffix}"


def rank_file_pattern(suffix: str, max_digits: int | None = None) -> re.Pattern[str]:
    """The pattern of one kind of rank file name (fullmatch it); group `rank` (also group 1) is the rank.

    `max_digits` bounds the rank's digits (`\\d{1,7}`); None: any number of them (`\\d+`).
    """
    digits = r"\d+" if max_digits is None else rf"\d{{1,{max_digits}}}"
    return re.compile(rf"{RANK_PREFIX}(?P<rank>{digits}){re.escape(suffix)}")


# --- the writers' helpers (I/O) ---------------------------------------------------------------------------


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    """Write `obj` as JSON atomically, so a reader never sees half a record (the folder is made only when it is
    missing: no metadata request for a folder that exists)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        handle = open(tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(tmp, "w", encoding="utf-8")  # noqa: SIM115
    with handle:
        json.dump(obj, handle, indent=1, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, path)


def check_folder(folder: Path) -> None:
    """Create the jobs folder private (0700) if needed, refuse one that others may write, prove it writable.

    submitit unpickles what this folder holds on the compute node: whoever can write it before the job
    starts runs code as the job. Raises a one-line SubmitError.
    """
    import tempfile  # here: `import ddpslurm` (a training script's) stays cheap

    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_private(folder)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".ddpslurm-write-test-"):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        raise SubmitError(f"job folder {str(folder)!r} is not writable ({reason})",
                          "Pass --folder with a writable directory that all nodes can see") from None


def check_private(folder: Path) -> None:
    """Raise a SubmitError when `folder` is not owned by this user or is writable by group or others."""
    info = folder.stat()
    shown = ascii(str(folder))
    if info.st_uid != os.getuid():
        raise SubmitError(f"job folder {shown} belongs to another user (uid {info.st_uid})",
                          "Pass --folder with a folder of your own: submitit runs what the folder holds")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SubmitError(f"job folder {shown} is writable by other users (mode {stat.S_IMODE(info.st_mode):04o}); "
                          "whoever writes there before the job starts could run code as your job",
                          f"Run `chmod go-w {shlex.quote(str(folder))}`, or pass --folder with a folder only you "
                          "can write")
