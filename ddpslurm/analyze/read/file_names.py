"""Who wrote a file, from its path: rank, local rank, host, attempt and kind (log or record) (pure functions).

In: a path relative to the folder given to analyze. Out: a `PathInfo`. The names ddpslurm writes come from
`ddpslurm.jobfolder`; the others are those of submitit (`%j_%t_log.out`), torchrun's `--log-dir`
(`<run>_<random>/attempt_N/<local rank>/stdout.log`, `error.json`) and a person's `rank3.log`, under folders
named after hosts. An in-place restart's files (`attempt_N/<host>/restart_K/`, `ddpslurm.launch.restarts`) carry
their restart number K; the usual names of a host folder carry none (its latest restart: `discover.restart_of`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from ddpslurm.jobfolder import (
    ATTEMPT_NAME,
    DOCTOR_DIR,
    EXIT_SUFFIX,
    FR_TRACE_SUFFIX,
    JOB_PREFIX,
    JOB_RECORD_FILE,
    RESTART_NAME,
    STACKS_SUFFIX,
    START_SUFFIX,
    SUBMITIT_TASK_FILE,
    doctor_record_node,
)

#: a host name as logs and folders spell it (a letter, then at least one digit somewhere), or an IPv4 address
HOST = r"(?:[A-Za-z][A-Za-z0-9_-]*\d[A-Za-z0-9_.-]*|\d{1,3}(?:\.\d{1,3}){3})"


@dataclass(frozen=True)
class PathInfo:
    """What a file's path tells about its writer."""

    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    attempt: int | None = None
    kind: str = "log"
    task_file: bool = False  # submitit's %j_%t_log: the srun task id is the rank only with one task per rank
    restart: int | None = None  # K of `attempt_N/<host>/restart_K/` (an earlier in-place restart's files)


#: ddpslurm's `rank_R.log` and its records; a person's `rank3.log`, `rank-3.txt` name the global rank too
_DDP_RANK = re.compile(rf"^rank[_-]?(?P<rank>\d+)"
                       rf"(?P<rec>{re.escape(START_SUFFIX)}|{re.escape(EXIT_SUFFIX)}|\.log|\.out|\.err|\.txt)?$")
#: the per-rank files ddpslurm writes into a host folder (`rank_3.log`, `rank_3.exit.json`, `rank_3.stacks.txt`)
_OWN_RANK_FILE = re.compile(rf"^rank_(?P<rank>\d{{1,7}})(?P<rec>{re.escape(START_SUFFIX)}|{re.escape(EXIT_SUFFIX)}|"
                            rf"\.log|{re.escape(STACKS_SUFFIX)}|{re.escape(FR_TRACE_SUFFIX)})$")
_HOSTDIR = re.compile(rf"^(?:node[-_]?rank[-_]?\d+[-_])?(?P<host>{HOST})$")
_ELASTIC_RUN = re.compile(r"^[\w.-]+_[a-z0-9]{8}$")  # torchrun --log-dir: <run_id>_<random>
#: the folder torchrun's agent makes right above `attempt_N` (`tempfile.mkdtemp(prefix=f"{run_id}_")`): its random
#: part is 8 of tempfile's characters, `_` among them (one such folder in five has one: `none_i9e0dj_h`)
_ELASTIC_RUN_ABOVE_ATTEMPT = re.compile(r"^[\w.-]+_[a-z0-9_]{8}$")
_RANKDIR = re.compile(r"^(?:rank[_-]?)?(?P<n>\d{1,5})$")


def path_info(relative: PurePath | tuple[str, ...]) -> PathInfo:
    """Rank/host/attempt from a path relative to the folder given to analyze.

    `%j_%t_log.out` -> task id = global rank; `attempt_N/<host>/rank_R.log` (ddpslurm; `attempt_N/rank_R.log` in
    job folders of older ddpslurm), `attempt_N/<host>/restart_K/...` (restart K's files); torchrun's
    `[host/]attempt_N/<local_rank>/{stdout,stderr}.log|error.json` -> local rank (host from a parent folder).
    """
    parts = relative if isinstance(relative, tuple) else relative.parts  # a tuple: the parts themselves
    name = parts[-1] if parts else ""
    attempt = None
    for i, part in enumerate(parts[:-1]):
        m = ATTEMPT_NAME.match(part)
        if m:
            attempt = int(m["n"])
            above = i - 1 if i and _ELASTIC_RUN_ABOVE_ATTEMPT.match(parts[i - 1]) else i  # the agent's, not a host
            host = _host_from(parts[:above])
            rest = parts[i + 1:-1]
            restart = RESTART_NAME.match(rest[1]) if len(rest) == 2 else None
            own = _OWN_RANK_FILE.match(name)
            if own and (len(rest) == 1 or restart):  # ddpslurm: attempt_N/<host>/[restart_K/]rank_R.*, the folder
                # is the host whatever its name
                kind = {START_SUFFIX: "start_record", EXIT_SUFFIX: "exit_record"}.get(own["rec"] or "", "log")
                return PathInfo(rank=int(own["rank"]), host=rest[0], attempt=attempt, kind=kind,
                                restart=int(restart["k"]) if restart else None)
            if restart:  # restart K's copy of its node file, its flight-recorder dumps
                return PathInfo(host=rest[0], attempt=attempt, restart=int(restart["k"]))
            if rest and _RANKDIR.match(rest[0]):
                kind = "elastic_error" if name == "error.json" else "log"
                return PathInfo(local_rank=int(_RANKDIR.match(rest[0])["n"]), host=host, attempt=attempt, kind=kind)
            break
    m = SUBMITIT_TASK_FILE.match(name)
    if m:
        return PathInfo(rank=int(m["task"]), attempt=attempt, host=_host_from(parts[:-1]), task_file=True)
    m = _DDP_RANK.match(name)
    if m:
        rec = m["rec"] or ""
        kind = {START_SUFFIX: "start_record", EXIT_SUFFIX: "exit_record"}.get(rec, "log")
        return PathInfo(rank=int(m["rank"]), attempt=attempt, kind=kind)
    if name == JOB_RECORD_FILE:
        return PathInfo(kind="job_record")
    doctor_node = doctor_record_node(name) if parts[-2:-1] == (DOCTOR_DIR,) else None
    if doctor_node is not None:
        return PathInfo(kind="doctor_record", host=doctor_node)  # ddpslurm doctor's per-node record
    if name == "error.json":
        return PathInfo(attempt=attempt, kind="elastic_error", host=_host_from(parts[:-1]))
    return PathInfo(attempt=attempt, host=_host_from(parts[:-1]))


def _host_from(parents: tuple[str, ...]) -> str | None:
    """The nearest parent folder that looks like a host name (`node02`, `gpu-a100-3`)."""
    for part in reversed(parents):
        if ATTEMPT_NAME.match(part) or _RANKDIR.match(part) or part.startswith((JOB_PREFIX, "torchelastic_")) \
                or _ELASTIC_RUN.match(part) or RESTART_NAME.match(part):
            continue
        m = _HOSTDIR.match(part)
        if m and not re.fullmatch(r"(?:logs?|out|outputs?|run\d*)", part):
            return m["host"]
    return None


#: a rank tag torch puts inside a glog/C++ message body: `[Rank 3]`, `[PG 0 Rank 3]`, `[PG 0 (default_pg) Rank 3]`,
#: `[PG ID 0 PG GUID 0(default_pg) Rank 3]` (ProcessGroupNCCL, torch 1.8 to 2.x); NCCL 2.2x+ `[Rank 3] ... Init START`
