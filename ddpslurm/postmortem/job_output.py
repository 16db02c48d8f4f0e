"""A finished job's own output files, as Slurm's job record names them, read within a size budget.

Slurm gives EpilogSlurmctld the job's StdOut/StdErr as the user wrote them (`SLURM_JOB_STDOUT=/x/slurm-%j.out`,
checked on Slurm 22.05), so the patterns of sbatch(1) "filename pattern" are expanded here. Only those two
paths are ever opened: regular files only (a fifo would block, a device is not a log), no symlink followed, and
when this runs as root the reading is done by a child process that has become the job's user, so the hook
reads nothing the job's owner could not.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import signal
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpslurm.scheduler.hostlist import expand_hostlist

#: Bytes read of one output file at most: its head and, for a larger file, its tail (the end of a failed job).
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
HEAD_FRACTION = 8  # 1/8 of the budget from the head (NCCL init, ranks, hosts), the rest from the tail
_PATTERN = re.compile(r"%(\d*)([%AajJNnstuxb])")


@dataclass(frozen=True)
class JobFacts:
    """What the hook knows of a finished job (from EpilogSlurmctld's environment or `scontrol show job`)."""

    job_id: str
    failed: bool
    exit_text: str
    stdout: str
    stderr: str
    work_dir: str
    uid: int | None
    gid: int | None
    user: str
    name: str
    nodelist: str
    comment: str
    array_job_id: str = ""
    array_task_id: str = ""


def _int(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def facts_from_env(environ: Mapping[str, str]) -> JobFacts | None:
    """JobFacts from the variables slurmctld gives EpilogSlurmctld (pure); None without SLURM_JOB_ID.

    Failed: SLURM_JOB_EXIT_CODE2 (`3:0`, exit:signal) or the wait status SLURM_JOB_EXIT_CODE is not 0, or the
    derived exit code (the highest of the steps') is not."""
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    code2 = environ.get("SLURM_JOB_EXIT_CODE2", "")
    status = _int(environ.get("SLURM_JOB_EXIT_CODE"))
    derived = environ.get("SLURM_JOB_DERIVED_EC", "0").strip() or "0"
    failed = bool(code2 and code2 != "0:0") or bool(status) or derived not in ("0", "0:0")
    return JobFacts(job_id=job_id, failed=failed, exit_text=code2 or str(status or 0),
                    stdout=environ.get("SLURM_JOB_STDOUT", ""), stderr=environ.get("SLURM_JOB_STDERR", ""),
                    work_dir=environ.get("SLURM_JOB_WORK_DIR", ""), uid=_int(environ.get("SLURM_JOB_UID")),
                    gid=_int(environ.get("SLURM_JOB_GID")), user=environ.get("SLURM_JOB_USER", ""),
                    name=environ.get("SLURM_JOB_NAME", ""), nodelist=environ.get("SLURM_JOB_NODELIST", ""),
                    comment=environ.get("SLURM_JOB_COMMENT", ""),
                    array_job_id=environ.get("SLURM_ARRAY_JOB_ID", ""),
                    array_task_id=environ.get("SLURM_ARRAY_TASK_ID", ""))


def _id_of(text: str) -> int | None:
    match = re.search(r"\((\d+)\)", text)
    return int(match.group(1)) if match else None


def facts_from_scontrol(job_id: str, record: Mapping[str, str]) -> JobFacts:
    """JobFacts from a `scontrol show job` record, for `strigger --fini` (pure). Its StdOut is already expanded;
    its Comment may be cut where a word looks like `key=` (the caller reads it again from squeue)."""
    state = record.get("JobState", "")
    code = record.get("ExitCode", "0:0")
    return JobFacts(job_id=job_id, failed=state not in ("COMPLETED", "") or code != "0:0", exit_text=code,
                    stdout=record.get("StdOut", ""), stderr=record.get("StdErr", ""),
                    work_dir=record.get("WorkDir", ""), uid=_id_of(record.get("UserId", "")),
                    gid=_id_of(record.get("GroupId", "")), user=record.get("UserId", "").split("(")[0],
                    name=record.get("JobName", ""), nodelist=record.get("NodeList", ""),
                    comment=record.get("Comment", "") if record.get("Comment") != "(null)" else "",
                    array_job_id=record.get("ArrayJobId", ""), array_task_id=record.get("ArrayTaskId", ""))


def expand_pattern(pattern: str, facts: JobFacts) -> str:
    """A StdOut/StdErr filename pattern of sbatch(1) expanded for the batch step (pure): %j %J %A %a %u %x %N
    %n %s %t %b %%, a number after % pads with zeros (`%4j`); a pattern with a backslash is not expanded."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    first = ""
    if facts.nodelist and facts.nodelist not in ("(null)", "None assigned"):
        try:
            first = expand_hostlist(facts.nodelist)[0]
        except Exception:  # an odd nodelist: %N stays empty
            first = ""
    array_job = facts.array_job_id or facts.job_id
    task = facts.array_task_id if facts.array_task_id not in ("", "N/A", "4294967294") else ""
    values = {"%": "%", "A": array_job, "a": task or "4294967294", "j": facts.job_id, "J": facts.job_id,
              "u": facts.user, "x": facts.name, "N": first.split(".")[0], "n": "0", "s": "batch", "t": "0",
              "b": str(int(task) % 10) if task.isdigit() else "0"}

    def one(match: re.Match[str]) -> str:
        width, key = match.groups()
        value = values[key]
        return value.zfill(min(int(width), 10)) if width and value.isdigit() else value

    return _PATTERN.sub(one, pattern)


def output_paths(facts: JobFacts) -> list[Path]:
    """The job's StdOut and StdErr (once each, expanded, relative ones against its WorkDir); /dev/* left out."""
    found: list[Path] = []
    for pattern in (facts.stdout, facts.stderr):
        if not pattern or pattern in ("(null)", "/dev/null"):
            continue
        path = Path(expand_pattern(pattern, facts))
        if not path.is_absolute():
            path = Path(facts.work_dir or "/") / path
        if str(path).startswith("/dev/") or path in found:
            continue
        found.append(path)
    return found


def copy_bounded(source: Path, target: Path, max_bytes: int) -> dict[str, Any]:
    """Copy `source` (a regular file, not through a symlink) into `target`: the whole file when it fits in
    `max_bytes`, else its head and its tail cut at line ends. Returns what was done; raises OSError."""
    with open(target, "wb") as out:
        return read_bounded(source, out, max_bytes)


def read_bounded(source: Path, out: Any, max_bytes: int) -> dict[str, Any]:
    """`copy_bounded` into the binary stream `out`."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        size = st.st_size
        if size <= max_bytes:
            _copy(fd, out, 0, size)
            return {"size": size, "read": size, "whole": True}
        head = max_bytes // HEAD_FRACTION
        block = os.pread(fd, head, 0)
        out.write(block[: block.rfind(b"\n") + 1] if b"\n" in block else block)
        out.write(f"\n[ddpslurm epilog: {size - max_bytes} bytes of the middle not read]\n".encode())
        start = size - (max_bytes - head)
        probe = os.pread(fd, 1 << 16, start)  # the tail starts after its first line end
        start += probe.find(b"\n") + 1 if b"\n" in probe else 0
        _copy(fd, out, start, size - start)
        return {"size": size, "read": max_bytes, "whole": False}
    finally:
        os.close(fd)


def _copy(fd: int, out: Any, offset: int, length: int) -> None:
    while length > 0:
        block = os.pread(fd, min(length, 1 << 20), offset)
        if not block:
            return
        out.write(block)
        offset += len(block)
        length -= len(block)


def copy_outputs(paths: list[Path], into: Path, max_bytes: int) -> list[dict[str, Any]]:
    """`copy_bounded` of each path into `into`/<n>_<name>; one result each: path, copy or error."""
    results: list[dict[str, Any]] = []
    for n, path in enumerate(paths):
        target = into / f"{n}_{path.name}"
        try:
            results.append({"path": str(path), "copy": str(target), **copy_bounded(path, target, max_bytes)})
        except OSError as error:
            reason = error.strerror or str(error)
            if error.errno == errno.ELOOP:
                reason = "a symlink (not followed)"
            results.append({"path": str(path), "error": reason})
    return results


def copy_as_user(paths: list[Path], into: Path, max_bytes: int, uid: int | None, gid: int | None,
                 timeout_s: float, user: str = "") -> list[dict[str, Any]]:
    """`copy_outputs`, the reading done by a child that has become `uid`/`gid` when this process is root (so the
    kernel checks the job owner's permissions), else by this process. The child sends what it read through a
    pipe and this process writes the copies into `into`, which the job's user never gets to touch; the child
    is killed after `timeout_s`."""
    if os.geteuid() != 0 or uid is None or uid == 0:
        return copy_outputs(paths, into, max_bytes)
    spool = into / ".from-reader"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the job's user, send each file as a header line and its bytes, exit
        code = 0
        try:
            os.close(read_end)
            group = gid if gid is not None else uid
            os.setgroups(os.getgrouplist(user, group) if user else [])
            os.setgid(group)
            os.setuid(uid)
            with os.fdopen(write_end, "wb") as pipe:
                for path in paths:
                    data = io.BytesIO()
                    try:
                        info: dict[str, Any] = read_bounded(path, data, max_bytes)
                    except OSError as error:
                        info = {"errno": error.errno, "error": error.strerror or str(error)}
                    pipe.write(json.dumps({**info, "length": data.tell()}).encode() + b"\n")
                    pipe.write(data.getbuffer())
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write_end)
    complete = _receive(read_end, spool, deadline=time.monotonic() + timeout_s,
                        limit=len(paths) * (max_bytes + (1 << 17)))
    if not complete:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    if not complete:
        return [{"path": str(p), "error": f"reading took longer than {timeout_s:g}s"} for p in paths]
    try:
        return _unspool(spool, paths, into)
    finally:
        spool.unlink(missing_ok=True)


def _receive(fd: int, spool: Path, deadline: float, limit: int) -> bool:
    """The pipe's bytes into `spool` until EOF (True), the deadline or `limit` bytes (False)."""
    import select

    got = 0
    with os.fdopen(fd, "rb", buffering=0) as pipe, open(spool, "wb") as out:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or got > limit or not select.select([pipe], [], [], left)[0]:
                return False
            block = pipe.read(1 << 20)
            if not block:
                return True
            out.write(block)
            got += len(block)


def _unspool(spool: Path, paths: list[Path], into: Path) -> list[dict[str, Any]]:
    """The reader's stream (a JSON header line and `length` bytes per path) split into the copies."""
    results: list[dict[str, Any]] = []
    with open(spool, "rb") as stream:
        for n, path in enumerate(paths):
            try:
                info = json.loads(stream.readline())
            except ValueError:
                results.append({"path": str(path), "error": "the reader (as the job's user) failed"})
                continue
            length = int(info.pop("length", 0))
            if "error" in info:
                reason = "a symlink (not followed)" if info.get("errno") == errno.ELOOP else info["error"]
                results.append({"path": str(path), "error": reason})
                stream.seek(length, os.SEEK_CUR)
                continue
            target = into / f"{n}_{path.name}"
            with open(target, "wb") as out:
                _copy_stream(stream, out, length)
            results.append({"path": str(path), "copy": str(target), **info})
    return results


def _copy_stream(stream: Any, out: Any, length: int) -> None:
    while length > 0:
        block = stream.read(min(length, 1 << 20))
        if not block:
            return
        out.write(block)
        length -= len(block)
