"""The hang monitor of `ddpslurm submit --hang-timeout S`: the job side of the heartbeat (heartbeat.py).

Where it runs: in the batch step's supervisor (`ddpslurm.launch.batch`), not in rank 0's worker. The batch
step is one process per job that takes no part in the collectives: it keeps running whichever rank hangs
(rank 0 included, or a rank stuck in C code holding its GIL, where a watcher thread inside that rank would
stop too), it already polls the attempt folder every second, and it may run `scancel` for the whole job,
which reaches the tasks on every node (a rank can only signal processes on its own node).

What it does: every poll it takes each rank's progress from the node files the supervisor's reader has just read
(`node_files.NodeFiles`: one listing of the attempt folder a poll, no file per rank); a different (collectives,
step) is progress, timed by the monitor's own clock, so node clocks never compare. A node file is rewritten at
most every `node_live.node_interval_s` s (5 s, more past 5,000 nodes): a silence shorter than two of those is
never a hang, whatever --hang-timeout says (`effective_timeout_s`). When a
rank that has not ended (a rank that has ended is no longer watched) shows no progress for S seconds, it sends
`STACK_SIGNAL` to every task
(`scancel --signal`: faulthandler dumps each rank's stacks), waits `STACK_WAIT_S`, writes
`attempt_N/hang.json` (the ranks' heartbeat threads read it, write `hang` exit records and exit 124, and
srun's --kill-on-bad-exit ends the step), and if srun still runs `KILL_AFTER_S` later, kills the job's
steps (`scancel --signal=KILL`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.launch import records
from ddpslurm.launch.heartbeat import STACK_SIGNAL
from ddpslurm.launch.node_files import NodeFiles

STACK_WAIT_S = 3.0
KILL_AFTER_S = 30.0


@dataclass
class Progress:
    """When the monitor last saw each rank's progress change (its own clock)."""

    keys: dict[int, Any] = field(default_factory=dict)
    changed: dict[int, float] = field(default_factory=dict)

    def observe(self, stats: Mapping[int, Any], now: float) -> None:
        """Record the ranks' progress keys seen at `now`: a different key is progress. Pure."""
        for rank, key in stats.items():
            if self.keys.get(rank) != key:
                self.keys[rank] = key
                self.changed[rank] = now


def stalled_ranks(progress: Progress, finished: Iterable[int], now: float, timeout_s: float) -> list[int]:
    """Ranks still running whose progress is older than `timeout_s` seconds, most stalled first. Pure."""
    done = set(finished)
    late = [(seen, rank) for rank, seen in progress.changed.items() if rank not in done and now - seen >= timeout_s]
    return [rank for _, rank in sorted(late)]


def effective_timeout_s(timeout_s: float, interval_s: float) -> float:
    """The silence that counts as a hang: `timeout_s`, but never less than two node-file intervals and the news
    delay (a rank that progresses shows it only when its node's file is rewritten). Pure."""
    return max(timeout_s, 2 * interval_s + 2)


def hang_request(timeout_s: float, stalled: list[int], progress: Progress, now: float) -> dict[str, Any]:
    """The content of `hang.json`. Pure."""
    return {"kind": "hang", "timeout_s": timeout_s, "unix": now, "time": records.timestamp(now),
            "stalled": stalled[:64], "stack_signal": STACK_SIGNAL.name,
            "seconds_since_progress": {str(r): round(now - t, 1) for r, t in sorted(progress.changed.items())}}


def send_signal(job_id: str, signal_name: str) -> None:
    """`scancel --signal=NAME JOB`: every task of every step of the job (never the batch step)."""
    from ddpslurm.scheduler.commands import scancel_argv
    from ddpslurm.scheduler.run import run

    try:
        run(scancel_argv(job_id, signal_name), timeout=30)
    except Exception as error:  # said, not fatal: the ranks' threads still dump and end on hang.json
        print(f"ddpslurm batch: scancel --signal={signal_name} {job_id} failed: {error}", file=sys.stderr, flush=True)


class HangMonitor:
    """Polled by the batch supervisor once a second; acts once per attempt."""

    def __init__(self, attempt_dir: Path, job_id: str, timeout_s: float,
                 signal_job: Callable[[str, str], None] = send_signal, files: NodeFiles | None = None) -> None:
        self.attempt_dir, self.job_id, self.timeout_s = attempt_dir, job_id, timeout_s
        self.signal_job = signal_job
        self.files = files  # None: the monitor lists the attempt folder itself (tests, a monitor alone)
        self._own_files = NodeFiles(attempt_dir) if files is None else None
        self.progress = Progress()
        self.signalled_at: float | None = None
        self.requested_at: float | None = None
        self.killed = False
        self.stalled: list[int] = []

    def poll(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if self.signalled_at is None:
            self._watch(now)
        elif self.requested_at is None and now - self.signalled_at >= STACK_WAIT_S:
            jobfolder.write_json(jobfolder.hang_path(self.attempt_dir),
                                 hang_request(self.timeout_s, self.stalled, self.progress, now))
            self.requested_at = now
        elif self.requested_at is not None and not self.killed and now - self.requested_at >= KILL_AFTER_S:
            print(f"ddpslurm batch: ranks still running {KILL_AFTER_S:g}s after the hang request: killing the "
                  "job's steps", file=sys.stderr, flush=True)
            self.signal_job(self.job_id, "KILL")
            self.killed = True

    def _watch(self, now: float) -> None:
        files = self.files
        if files is None:
            files = self._own_files
            assert files is not None
            files.poll()
        self.progress.observe(files.progress(), now)
        self.stalled = stalled_ranks(self.progress, files.exits(), now, effective_timeout_s(self.timeout_s,
                                                                                            files.interval_s))
        if not self.stalled:
            return
        print(f"ddpslurm batch: no progress from rank(s) {self.stalled[:8]} for {self.timeout_s:g}s "
              f"(--hang-timeout): dumping every rank's stacks into {self.attempt_dir} and ending the job",
              file=sys.stderr, flush=True)
        self.signal_job(self.job_id, str(int(STACK_SIGNAL)))  # by number: scancel knows no WINCH by name
        self.signalled_at = now
