"""Per-rank heartbeat and hang dumps: the rank side of `ddpslurm submit --hang-timeout`.

Progress is observed without changing the script. torch 2.13 offers no completion hook for gloo
(`ProcessGroup._register_on_completion_hook` raises "Only ProcessGroupNCCL supports onCompletion hook"),
and wrapping `torch.distributed.all_reduce` & co. would miss DDP's gradient all-reduces, which the C++
reducer issues directly. What every backend keeps is the process group's collective sequence number
(`ProcessGroup._get_sequence_number_for_group()`, bumped each time a collective is issued, DDP's included):
a rank blocked in a collective issues no next one, so a sequence number that stops moving is a rank that
stopped progressing. A daemon thread reads it (summed over the process groups) once per
`DDPSLURM_HEARTBEAT_S` seconds, and `ddpslurm.heartbeat()` lets a script report steps as well (a counter:
nanoseconds per call). The thread tells the node's agent (`node_live.RankLink`: a node-local file, no shared
file system) only when something moved; the agent puts it into the node's one file (`node_<host>.json`).

On a hang the batch step's monitor (`hang_monitor.py`) first sends `STACK_SIGNAL`: faulthandler, registered
here, writes every thread's Python stack from the signal handler (it works while the main thread is stuck in C++
with or without the GIL) into a node-local file (the node-local folder of `node_live`: no file per rank on the
shared file system while nothing hangs), which the node's agent, and the thread below, copy into
`attempt_N/<host>/rank_R.stacks.txt`. Then it writes `attempt_N/hang.json`;
the node's agent copies it node-locally, the thread sees it there, writes the rank's `hang` exit record and ends
the rank with `HANG_EXIT_CODE`, which ends the step through srun's --kill-on-bad-exit. Before the record it
writes torch's flight recorder (the recent collectives of every process group, with their sequence numbers and
sizes) as JSON into `rank_R.fr_trace.json` beside the stacks, which `ddpslurm analyze` compares across ranks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from ddpslurm.jobfolder import fr_trace_path, stacks_path
from ddpslurm.launch import records

#: Seconds between the thread's looks at the counters; set by `submit --hang-timeout` (absent: no heartbeat).
HEARTBEAT_ENV = "DDPSLURM_HEARTBEAT_S"
#: Default-ignored by every process that did not register it, and used by neither NCCL (USR1) nor the
#: preemption path (USR2, SIGTERM): a stray one harms nothing.
STACK_SIGNAL = signal.SIGWINCH
#: Exit status of a rank ended by the hang monitor (as timeout(1) uses it).
HANG_EXIT_CODE = 124
#: Seconds between a rank's `hang` record and its exit: more than the agents' and the threads' looks at the
#: request (`LOOK_S`, node_live.TICK_S) take, so every rank has recorded `hang` before the first one leaves (a
#: peer's exit fails the others' collectives at once).
HANG_EXIT_DELAY_S = 2.0
#: Seconds between the thread's looks at the node-local copy of the hang request.
LOOK_S = 0.25

_step = 0
_keep_open: list[TextIO] = []  # faulthandler writes into these from a signal handler: never closed


def heartbeat(step: int | None = None) -> None:
    """Tell ddpslurm's hang monitor this rank made progress (call it once per step; costs nanoseconds).

    Collectives are seen without it; a script with long stretches between collectives (evaluation on
    one rank, a slow save) calls it there so `--hang-timeout` does not take the stretch for a hang.
    """
    global _step
    _step = _step + 1 if step is None else int(step)


def flight_recorder_json() -> str | None:
    """torch's flight recorder (the recent collectives of every process group, gloo's too) as JSON text; None
    without torch.distributed or without the recorder (torch < 2.5, TORCH_FR_BUFFER_SIZE=0). Never a pickle."""
    if sys.modules.get("torch.distributed") is None:
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        dumped = _dump_fr_trace_json(True, False)  # includeCollectives, onlyActive
    except Exception:  # no recorder in this torch, or it is off
        return None
    return dumped.decode("utf-8", "replace") if isinstance(dumped, bytes) else str(dumped)


def collective_count() -> int | None:
    """Collectives issued by this process over all its process groups; None before init_process_group.

    Never imports torch: a script that has not imported it has issued no collective.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not dist.is_initialized():
            return None
        groups = list(dist.distributed_c10d._world.pg_map)
        return sum(int(group._get_sequence_number_for_group()) for group in groups)
    except Exception:  # a torch without these private calls: steps only
        return None


def progress_record(collectives: int | None, step: int, unix: float) -> dict[str, Any]:
    """The rank's progress as it tells the node's agent (the `progress` of its entry in `node_<host>.json`). Pure."""
    return {"collectives": collectives, "step": step, "unix": unix}


def register_stack_dump(path: Path, rank: int) -> TextIO:
    """Open the rank's stack file (a header line names it) and let `STACK_SIGNAL` dump every thread into it."""
    handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for faulthandler
    handle.write(f"# ddpslurm stack dump file: rank {rank} host {socket.gethostname()} pid {os.getpid()}\n")
    handle.flush()
    faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
    _keep_open.append(handle)
    return handle


class HeartbeatThread(threading.Thread):
    """Tells the node's agent of the rank's progress when it moves; ends the rank when the monitor asks."""

    def __init__(self, state: Any, interval_s: float, stacks: TextIO) -> None:
        super().__init__(name="ddpslurm-heartbeat", daemon=True)
        self.state, self.interval_s, self.stacks = state, interval_s, stacks
        self.link = state.link
        self.folder = state.paths["exit"].parent  # the rank's host folder (on the shared file system)
        self.exit = os._exit  # tests replace it

    def run(self) -> None:
        last: tuple[int | None, int] | None = None
        next_look = 0.0
        while True:
            request = self.link.hang_request()
            if request is not None:
                break
            if time.monotonic() >= next_look:
                now = (collective_count(), _step)
                if now != last:
                    self.link.publish(progress=progress_record(*now, time.time()))
                    last = now
                next_look = time.monotonic() + self.interval_s
            time.sleep(min(self.interval_s, LOOK_S))
        self.end_for_hang(request)

    def end_for_hang(self, request: dict[str, Any]) -> None:
        """The monitor declared a hang: make sure the stacks are on disk, record `hang`, leave."""
        if self.state.final_code is not None:
            return  # the script ended by itself meanwhile
        if _only_header(self.stacks):  # the signal did not come: dump from here
            faulthandler.dump_traceback(file=self.stacks, all_threads=True)
        shared = stacks_path(self.folder, self.state.dist.rank)
        with contextlib.suppress(OSError):  # the node-local dump into the host folder, unless the agent copied it
            self.stacks.flush()
            text = Path(self.stacks.name).read_text(encoding="utf-8", errors="replace")
            if not _same_size(shared, len(text.encode("utf-8"))):
                records.write_text(shared, text)
        trace = flight_recorder_json()
        if trace:
            with contextlib.suppress(OSError):
                records.write_text(fr_trace_path(self.folder, self.state.dist.rank), trace)
        with contextlib.suppress(OSError):  # final: the main thread failing later (a peer left) changes nothing
            self.state.exit_record("hang", HANG_EXIT_CODE, final=True, reason="hang_monitor",
                                   hang_timeout_s=request.get("timeout_s"), stalled=request.get("stalled"))
        print(f"ddpslurm: rank {self.state.dist.rank}: the hang monitor saw no progress for "
              f"{request.get('timeout_s', '?')}s; stacks in {shared}; ending the job",
              file=sys.stderr, flush=True)
        started = time.monotonic()
        self.state.flush()
        time.sleep(max(0.0, HANG_EXIT_DELAY_S - (time.monotonic() - started)))
        self.state.tee.stop(timeout=0.5)
        self.exit(HANG_EXIT_CODE)


def _same_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _only_header(handle: TextIO) -> bool:
    with contextlib.suppress(OSError):
        return Path(handle.name).read_text(encoding="utf-8", errors="replace").count("\n") <= 1
    return False


def start(environ: Mapping[str, str], state: Any) -> HeartbeatThread | None:
    """Start the rank's heartbeat when `DDPSLURM_HEARTBEAT_S` asks for it (the worker's one hook).

    `state` is the worker's per-rank state (`rank_state.RankState`): `dist.rank`, `paths` (in the rank's host
    folder), `link` (`node_live.RankLink`), `exit_record(status, code, final=..., **fields)`, `final_code`, `tee`.
    """
    text = environ.get(HEARTBEAT_ENV, "").strip()
    try:
        interval = float(text)
    except ValueError:
        return None
    if not 0 < interval <= 3600 or getattr(state, "link", None) is None:
        return None
    stacks = register_stack_dump(stacks_path(state.link.folder, state.dist.rank), state.dist.rank)  # node-local
    thread = HeartbeatThread(state, interval, stacks)
    thread.start()
    return thread
