"""Liveness and records per node, not per rank: the rank side and the per-node agent.

Every rank writes what the batch step must know live (its progress with `--hang-timeout`, its first and later
preemption signals) and its records (the start record, the exit record) into a node-local folder (`/dev/shm`,
else `$TMPDIR` or `/tmp`: a tmpfs or a local disk, no metadata server) as `rank_<R>.json`. One agent per node, a
process forked by the first rank of the node to take `agent.lock` (flock), gathers those files and writes ONE
small file for the node into the attempt folder on the shared file system, `node_<host>.json`
(`ddpslurm.jobfolder`): at most once per `interval_s` for progress (`node_interval_s`: 5 s, growing with the job
past 5,000 nodes), within a second for news (a start, a signal, an end). The batch step reads one listing of the
attempt folder per poll (`node_files.NodeFiles`); the post-mortem readers take the records from the node files
(`jobfolder.read_rank_records`). So an attempt holds, per rank, only its log; per node, one file. What a node
that dies whole (SIGKILL, power) loses is what its agent had not written yet: at most the last second of news
and the last interval of progress.

Why an agent process, not local rank 0: it outlives the rank that started it (local rank 0 may leave first after a
preemption, while the others still save), it never waits behind a rank's GIL, and a rank that dies does not take
the node's records with it. It ignores the signals Slurm sends every process of a step (as the log tee's copier
does), ends once every rank of the node has ended (or none is alive), removing the node-local folder, and Slurm's
step cleanup ends it otherwise.
A rank that ends waits (up to `FLUSH_WAIT_S`) for the agent to have written its end, so the step never ends before
the node file says how.

Hangs: the hang monitor's stack signal reaches every process of the step, the agent too; from then on the agent
looks for `hang.json` every tick (else only every `HANG_LOOK_S` s) and copies it into the node-local folder,
where each rank's heartbeat thread sees it. The ranks' stack dumps (faulthandler's, from the signal handler) go
into node-local files too; `STACK_COPY_S` after the signal the agent copies those that hold a dump into the host
folder (`<host>/rank_R.stacks.txt`, as the rank's heartbeat thread does for its own): stack files exist on the
shared file system only on a hang, for a rank stuck with its GIL held too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.launch import records

SCHEMA = 1
#: the agent's look at the node-local folder
TICK_S = 0.25
#: node-file writes for progress alone are at least this far apart; more for a bigger job (`node_interval_s`)
MIN_INTERVAL_S = 5.0
#: nodes whose files the metadata server is asked to take each second for progress, at most (the interval grows)
NODE_WRITES_PER_S = 1000
#: news (a signal, an end) is written at most this often per node
NEWS_MIN_S = 1.0
#: how long a rank waits at its end for the agent to have written it
FLUSH_WAIT_S = 2.0
#: how long the agent stays with no rank alive and some rank's end not known (a rank killed before its record)
ORPHAN_S = 10.0
#: the agent looks for `hang.json` this often before a stack signal reached it (after one: every tick)
HANG_LOOK_S = 10.0
#: seconds after the stack signal during which the agent looks for `hang.json` every tick
HANG_WATCH_S = 120.0
#: overrides the interval (seconds)
INTERVAL_ENV = "DDPSLURM_NODE_INTERVAL_S"
LOCK_NAME = "agent.lock"
FLUSHED_NAME = "flushed.json"
HANG_COPY_NAME = jobfolder.HANG_FILE  # the node-local copy has the job folder's name
#: seconds after the stack signal at which the agent copies the ranks' dumps into the host folder
STACK_COPY_S = 2.0
_IGNORED_IN_AGENT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
                     signal.SIGCONT, signal.SIGPIPE)


def node_interval_s(nodes: int, environ: Mapping[str, str] | None = None) -> float:
    """Seconds between two node-file writes for progress: `INTERVAL_ENV` when set (0.05-3600), else
    max(MIN_INTERVAL_S, nodes / NODE_WRITES_PER_S). Pure."""
    text = (environ or {}).get(INTERVAL_ENV, "").strip()
    with contextlib.suppress(ValueError):
        if 0.05 <= float(text) <= 3600:
            return float(text)
    return max(MIN_INTERVAL_S, nodes / NODE_WRITES_PER_S)


def node_name(environ: Mapping[str, str]) -> str:
    """This node's name as Slurm knows it (`SLURMD_NODENAME`, the nodelist's spelling), else the host name."""
    import socket

    return environ.get("SLURMD_NODENAME", "").strip() or socket.gethostname()


def _private(folder: Path) -> bool:
    info = folder.lstat()
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def local_folder(environ: Mapping[str, str], key: str, fallback: Path) -> Path:
    """The node-local folder of this node's ranks in this attempt: `<base>/ddpslurm-<uid>/<key>/`, `base` the first
    of /dev/shm, $TMPDIR, /tmp where `ddpslurm-<uid>` is (or can be made) a folder of this user only; `fallback`
    (on the shared file system) where none is."""
    bases = ["/dev/shm", environ.get("TMPDIR", ""), "/tmp"]
    for base in (b for b in bases if b):
        mine = Path(base) / f"ddpslurm-{os.getuid()}"
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(mine, 0o700)
            if not _private(mine):
                continue
            folder = mine / jobfolder.folder_host(key)
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700)
            if _private(folder):
                return folder
        except OSError:
            continue
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def local_key(job_id: str, step_id: str | None, attempt: int, host: str) -> str:
    """The node-local folder's name: one per job, step, attempt and node (nodes of a test cluster share a /dev/shm)."""
    return f"{job_id}.{step_id or 'x'}.{attempt}.{host}"


# --- the rank side ------------------------------------------------------------------------------------------


class RankLink:
    """What one rank tells its node's agent: `rank_<R>.json` in the node-local folder, rewritten atomically."""

    def __init__(self, folder: Path, rank: int, local_rank: int) -> None:
        self.folder = folder
        self.path = folder / f"rank_{rank}.json"
        self.rank = rank
        self.state: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "pid": os.getpid(), "serial": 0}
        self._lock = threading.Lock()

    def publish(self, **fields: Any) -> None:
        """Merge `fields` into the rank's state and write it (never raises: liveness must not end a rank). Once the
        rank's end is told, only a later end is (the heartbeat thread may still see a last step); a folder the
        agent removed (every end written) is not made again."""
        with self._lock:
            if "exit" in self.state and "exit" not in fields:
                return
            self.state.update(fields)
            self.state["serial"] += 1
            tmp = records.temporary_name(self.path)
            with contextlib.suppress(OSError, TypeError, ValueError):
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as handle:
                        handle.write(json.dumps(self.state))
                    os.replace(tmp, self.path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise

    def hang_request(self) -> dict[str, Any] | None:
        """The hang monitor's request as the agent copied it here, or None (a local stat, no shared file system)."""
        try:
            data = json.loads((self.folder / HANG_COPY_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else {}

    def wait_flushed(self, timeout_s: float = FLUSH_WAIT_S) -> bool:
        """Wait until the agent has written this rank's last state into the node file (or `timeout_s` passed). The
        node-local folder gone means the same: the agent removes it once it has written every rank's end."""
        wanted = self.state["serial"]
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                done = json.loads((self.folder / FLUSHED_NAME).read_text(encoding="utf-8"))
                if int(done.get(str(self.rank), -1)) >= wanted:
                    return True
            if not self.folder.exists():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


# --- the agent ----------------------------------------------------------------------------------------------


def read_states(folder: Path) -> dict[int, dict[str, Any]]:
    """The ranks' states in the node-local folder, by rank (a file caught mid-write is skipped: it is renamed in
    whole, so this means a name of another kind)."""
    states: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return states
    for name in names:
        if not (name.startswith("rank_") and name.endswith(".json")):
            continue
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((folder / name).read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("rank"), int):
                states[data["rank"]] = data
    return states


def node_record(host: str, states: Mapping[int, Mapping[str, Any]], serial: int, interval_s: float,
                now: float) -> dict[str, Any]:
    """What `node_<host>.json` holds: every local rank's last state (`progress`, `signal`, and its whole `start` and
    `exit` records, `records.start_record` / `records.exit_record`). Pure."""
    return {"schema": SCHEMA, "kind": "node", "host": host, "serial": serial, "interval_s": interval_s,
            "unix": now, "time": records.timestamp(now),
            "ranks": {str(rank): dict(states[rank]) for rank in sorted(states)}}


def news_of(state: Mapping[str, Any]) -> tuple[Any, ...]:
    """What in a rank's state is written within a second: its start, its signals and its end (progress waits).
    Pure."""
    sig = state.get("signal") or {}
    return (bool(state.get("start")), json.dumps(sig, sort_keys=True), json.dumps(state.get("exit"), sort_keys=True))


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive(pid: Any) -> bool:
    return isinstance(pid, int) and pid > 0 and pid_exists(pid)


class NodeAgent:
    """One node's gatherer; `tick(now)` does one round and says whether to go on (tests drive it directly)."""

    def __init__(self, local: Path, node_file: Path, host: str, local_ranks: int, interval_s: float,
                 hang_file: Path | None, alive: Callable[[Any], bool] = _alive) -> None:
        self.local, self.node_file, self.host = local, node_file, host
        self.host_dir = jobfolder.host_folder(node_file.parent, host)  # where stack dumps are copied
        self.local_ranks, self.interval_s, self.hang_file = local_ranks, interval_s, hang_file
        self.alive = alive
        self.serial = 0
        self.written: dict[int, tuple[Any, ...]] = {}  # the news of each rank last written
        self.written_serials: dict[int, int] = {}
        self.written_progress: dict[int, Any] = {}
        self.last_write = float("-inf")
        self.last_hang_look = float("-inf")
        self.stack_signal_at: float | None = None
        self.hang_copied = False
        self.stacks_copied: dict[str, int] = {}  # name -> the size copied
        self.last_alive = time.monotonic()

    def tick(self, now: float) -> bool:
        states = read_states(self.local)
        news = {rank: news_of(state) for rank, state in states.items()}
        progress = {rank: state.get("progress") for rank, state in states.items()}
        has_news = any(self.written.get(rank) != value for rank, value in news.items())
        has_progress = any(self.written_progress.get(rank) != value for rank, value in progress.items())
        if (has_news and now - self.last_write >= NEWS_MIN_S) or \
                (has_progress and now - self.last_write >= self.interval_s):
            self.write(states, now)
            self.written, self.written_progress = news, progress
        self.look_for_hang(now)
        if self.stack_signal_at is not None and time.time() - self.stack_signal_at >= STACK_COPY_S:
            self.copy_stacks()
        return self.go_on(states, now)

    def write(self, states: Mapping[int, Mapping[str, Any]], now: float) -> None:
        self.serial += 1
        try:
            records.write_json(self.node_file, node_record(self.host, states, self.serial, self.interval_s, now))
        except OSError as error:
            print(f"ddpslurm node agent ({self.host}): cannot write {self.node_file}: {error}", file=sys.stderr,
                  flush=True)
            return
        self.last_write = now
        self.written_serials = {rank: int(state.get("serial", 0)) for rank, state in states.items()}
        with contextlib.suppress(OSError):
            records.write_text(self.local / FLUSHED_NAME, json.dumps({str(r): s for r, s in
                                                                       self.written_serials.items()}))

    def look_for_hang(self, now: float) -> None:
        if self.hang_file is None or self.hang_copied:
            return
        watching = self.stack_signal_at is not None and now - self.stack_signal_at < HANG_WATCH_S
        if not watching and now - self.last_hang_look < HANG_LOOK_S:
            return
        self.last_hang_look = now
        try:
            text = self.hang_file.read_text(encoding="utf-8")
            json.loads(text)
        except (OSError, ValueError):
            return
        with contextlib.suppress(OSError):
            records.write_text(self.local / HANG_COPY_NAME, text)
            self.hang_copied = True

    def copy_stacks(self) -> int:
        """Copy the node-local stack files that hold a dump (more than their header line) and grew since their last
        copy into the host folder; how many were copied."""
        copied = 0
        try:
            names = [n for n in os.listdir(self.local) if n.startswith(jobfolder.RANK_PREFIX)
                     and n.endswith(jobfolder.STACKS_SUFFIX)]
        except OSError:
            return 0
        for name in names:
            with contextlib.suppress(OSError):
                text = (self.local / name).read_text(encoding="utf-8", errors="replace")
                if text.count("\n") <= 1 or self.stacks_copied.get(name) == len(text):
                    continue
                records.write_text(self.host_dir / name, text)
                self.stacks_copied[name] = len(text)
                copied += 1
        return copied

    def go_on(self, states: Mapping[int, Mapping[str, Any]], now: float) -> bool:
        """False once every local rank has ended and been written, or none has been alive for ORPHAN_S."""
        ended = [rank for rank, state in states.items() if state.get("exit")]
        flushed = all(self.written_serials.get(rank, -1) >= int(states[rank].get("serial", 0)) for rank in ended)
        if len(ended) >= self.local_ranks and flushed:
            return False
        if any(self.alive(state.get("pid")) for rank, state in states.items() if rank not in ended):
            self.last_alive = time.monotonic()
        elif time.monotonic() - self.last_alive >= ORPHAN_S:
            self.write(states, now)  # the last word: a rank killed before its record stays without an end
            return False
        return True

    def run(self) -> None:
        while self.tick(time.time()):
            time.sleep(TICK_S)
        if self.stack_signal_at is not None:
            self.copy_stacks()
        self.cleanup()  # at once: Slurm ends the agent with the step, once the last rank has left

    def cleanup(self) -> None:
        """Remove the node-local folder (its ranks have all ended): /dev/shm is memory."""
        with contextlib.suppress(OSError):
            for name in os.listdir(self.local):
                with contextlib.suppress(OSError):
                    os.unlink(self.local / name)
            os.rmdir(self.local)


def _agent_main(agent: NodeAgent) -> None:
    """The forked agent's life: Slurm's signals ignored (as the tee's copier does), the stack signal noted."""
    from ddpslurm.launch.heartbeat import STACK_SIGNAL

    for sig in _IGNORED_IN_AGENT:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(STACK_SIGNAL, lambda signum, frame: setattr(agent, "stack_signal_at", time.time()))
    agent.run()


def start_agent(local: Path, node_file: Path, host: str, local_ranks: int, interval_s: float,
                hang_file: Path | None) -> int | None:
    """Fork the node's agent unless one runs already (it holds `agent.lock`); the agent's pid, or None.

    Called before the rank starts any thread (a fork then is safe) and before its log tee (the agent keeps the
    task's own stdout and stderr, not the tee's pipes)."""
    try:
        fd = os.open(local / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None  # another rank of this node started it
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    pid = os.fork()
    if pid == 0:  # the agent: holds the lock (the same open file) as long as it lives
        code = 0
        try:
            _agent_main(NodeAgent(local, node_file, host, local_ranks, interval_s, hang_file))
        except BaseException:  # a child that raised must still leave by os._exit
            code = 1
        finally:
            os._exit(code)
    os.close(fd)  # the agent's copy keeps the lock
    return pid
