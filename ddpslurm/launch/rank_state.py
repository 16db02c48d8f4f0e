"""What one rank knows about its signals and its end, and the records it writes about them.

The signal handlers only take note (`ddpslurm.launch.signals`); `RankState.on_signal` runs on the
dispatcher thread and decides:

- the first SIGTERM or USR2 is the preemption / time-limit signal: tell the node's agent (`node_live.RankLink`;
  the batch step reads it in `node_<host>.json`), say so in the log, arm the grace alarm for a script that never
  reads the flag;
- a later SIGTERM while the script has not read the flag ends the rank (`signal` exit record, 128 + 15);
- a later SIGTERM once the script has read the flag is recorded (in the signal record and the log) and not
  obeyed: the script is saving its checkpoint. Such SIGTERMs come from the supervisor's own requeue, the
  end of the batch script, an array or retry requeue; Slurm's SIGKILL after KillWait still ends a rank
  that never finishes;
- after the script has returned, nothing ends the rank: it is leaving by itself (its record, then
  submitit writing `<job>_<task>_result.pkl`; cut between its `.save_tmp` file and the rename, the stale
  file fails that task of the next attempt: "A temporary saved file already exists").

Records per node, not per rank: the start, signal and exit records are told to the node's agent
(`node_live.RankLink`, node-local), which writes them into the node's one file (`node_<host>.json`). Before the
rank leaves it waits for the agent to confirm (`flush`); where the agent did not in time (killed, stuck), the rank
writes its own `rank_R.start.json` and `rank_R.exit.json` into its host folder, which every reader takes too
(`jobfolder.read_rank_records`). A rank without a link (unit tests, older callers) writes its own files at once.

Exit records go through one lock: the first terminal one (`hang`, `signal`) seals the record, so the main
thread failing afterwards (a peer left) cannot replace it.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from ddpslurm import preemption
from ddpslurm.launch import records
from ddpslurm.launch.signals import WATCHED

#: What a later signal's entry in the signal record says was done with it.
OBEYED, IGNORED_SAVING, IGNORED_FLAG_SET = "ended the rank", "recorded, not obeyed: the script read the flag", \
    "recorded: the flag was already set"


class GraceExpired(BaseException):
    """Raised in the script when it ignored the preemption flag for the whole grace period."""


def on_alarm(signum: int, frame: FrameType | None) -> None:
    """SIGALRM, armed `grace_s` after the first signal: stop a script that never looked at the flag; never
    one that did (it may be saving). Raising is all it does."""
    if not preemption.flag_seen():
        raise GraceExpired()


class RankState:
    """A rank's signals and exit record, shared by the main, dispatcher and heartbeat threads."""

    def __init__(self, cfg: Any, dist: Any, attempt: int, paths: dict[str, Path], tee: Any, link: Any = None) -> None:
        self.cfg, self.dist, self.attempt, self.paths, self.tee = cfg, dist, attempt, paths, tee
        self.link = link  # node_live.RankLink, or None
        self.final_code: int | None = None
        self.signal_unix: float | None = None
        self.signal_name: str | None = None
        self.later: list[dict[str, Any]] = []
        self.script_ended = False
        self.grace_deadline: float | None = None
        self._grace_told = False
        self._lock = threading.Lock()
        self._sealed = False
        self.exit = os._exit  # tests replace it

    # --- records --------------------------------------------------------------------------------------

    def exit_record(self, status: str, exit_code: int, final: bool = False, while_running: bool = False,
                    **fields: Any) -> bool:
        """Write the exit record unless a terminal one (`final`) was written already, or, `while_running`,
        the script has returned; whether it was written."""
        record = records.exit_record(rank=self.dist.rank, host=socket.gethostname(), pid=os.getpid(),
                                     job_id=self.dist.job_id, attempt=self.attempt, status=status,
                                     exit_code=exit_code, unix=time.time(), **fields)
        with self._lock:
            if self._sealed or (while_running and self.script_ended):
                return False
            if self.link is None:
                records.write_json(self.paths["exit"], record)
            else:
                self.link.publish(exit=record)
            self.final_code = exit_code
            self._sealed = final
            return True

    def start_record(self, record: dict[str, Any]) -> None:
        """The rank's start record: to the node's agent (its own file only without a link)."""
        if self.link is None:
            records.write_json(self.paths["start"], record)
        else:
            self.link.publish(start=record)

    def flush(self) -> None:
        """Before the rank leaves: wait (briefly) for the node's agent to have written what the rank told it; where
        it did not, write the rank's own start and exit records (never raises: the rank is leaving)."""
        if self.link is None or self.link.wait_flushed():
            return
        for kind in ("start", "exit"):
            record = self.link.state.get(kind)
            if isinstance(record, dict):
                try:
                    records.write_json(self.paths[kind], record)
                except OSError as error:
                    print(f"ddpslurm: rank {self.dist.rank}: cannot write {self.paths[kind]}: {error}",
                          file=sys.stderr, flush=True)

    def end_script(self, arrivals: list[tuple[int, float]]) -> bool:
        """The script has returned: from now on no signal ends the rank. Whether a preemption signal came
        while it ran (`arrivals`, the handlers' notes: one the dispatcher has not handled yet counts too); never
        after a terminal record (`hang`): the rank was leaving already, a signal record would requeue the job."""
        with self._lock:
            self.script_ended = True
            sealed = self._sealed
        if sealed:  # a terminal record (the hang monitor's) came first: the signal is the teardown that followed
            return False
        first = next(((signum, unix) for signum, unix in list(arrivals) if signum in WATCHED), None)
        if self.signal_unix is None and first is not None:
            self.signal_unix, self.signal_name = first[1], signal.Signals(first[0]).name
            self._write_signal_record()
        return self.signal_unix is not None

    def _write_signal_record(self) -> None:
        record = {"rank": self.dist.rank, "signal": self.signal_name, "unix": self.signal_unix,
                  "time": records.timestamp(self.signal_unix or 0.0)}
        if self.later:
            record["later"] = list(self.later)
        if self.link is not None:
            self.link.publish(signal=record)
            return
        try:
            records.write_json(self.paths["signal"], record)
        except OSError as error:  # the batch step then waits for the exit records or Slurm's end
            print(f"ddpslurm: rank {self.dist.rank}: cannot write {self.paths['signal']}: {error}",
                  file=sys.stderr, flush=True)

    # --- the dispatcher thread's callbacks -----------------------------------------------------------

    def on_signal(self, signum: int, unix: float) -> None:
        """One caught signal, in arrival order (see the module docstring)."""
        name = signal.Signals(signum).name
        with self._lock:
            ended = self.script_ended or self._sealed
        if ended:
            return  # leaving by itself; a signal record now would make the batch step requeue a finished job
        if self.signal_unix is None:
            self._first(name, unix)
        elif signum == signal.SIGTERM and not preemption.flag_seen():
            self._terminate(signum, name, unix)
        else:
            self._later(name, unix, IGNORED_SAVING if signum == signal.SIGTERM else IGNORED_FLAG_SET)

    def _first(self, name: str, unix: float) -> None:
        self.signal_unix, self.signal_name = unix, name
        self._write_signal_record()
        grace = self.cfg.grace_s
        self.grace_deadline = unix + grace
        print(f"ddpslurm: rank {self.dist.rank} got {name}: the script should checkpoint and return "
              f"(ddpslurm.preemption_requested()); stopping it {grace}s after the signal unless it has read "
              "the flag by then", file=sys.stderr, flush=True)
        signal.alarm(max(1, math.ceil(self.grace_deadline - time.time())))

    def _later(self, name: str, unix: float, action: str) -> None:
        self.later.append({"signal": name, "unix": unix, "time": records.timestamp(unix), "action": action})
        self._write_signal_record()
        print(f"ddpslurm: rank {self.dist.rank}: another {name}, {action} (it may be saving its checkpoint; "
              "Slurm's SIGKILL after KillWait still ends a rank that does not finish)", file=sys.stderr, flush=True)

    def _terminate(self, signum: int, name: str, unix: float) -> None:
        self.later.append({"signal": name, "unix": unix, "time": records.timestamp(unix), "action": OBEYED})
        self._write_signal_record()
        if self.exit_record("signal", 128 + signum, final=True, while_running=True, signal=name):
            print(f"ddpslurm: rank {self.dist.rank} terminated by a second {name} (the script had not read the "
                  "preemption flag)", file=sys.stderr, flush=True)
            self.flush()
            self.tee.stop(timeout=0.5)
            self.exit(128 + signum)

    def on_wake(self, now: float) -> float | None:
        """Say once when the grace time is over for a script that read the flag; the next wake-up."""
        if self.grace_deadline is None or self._grace_told:
            return None
        if now < self.grace_deadline:
            return self.grace_deadline - now
        self._grace_told = True
        if preemption.flag_seen() and not self.script_ended:
            print(f"ddpslurm: rank {self.dist.rank}: grace time over, but the script has read the preemption "
                  "flag: letting it finish", file=sys.stderr, flush=True)
        return None
