"""The batch-step supervisor: runs the job's srun and requeues the job after a preemption or time-limit signal.

The sbatch script runs `srun` through it (`python -m ddpslurm.launch.batch [options] -- srun ...`).
Requeueing from here, not from a rank, means the job is requeued only once every rank of the attempt
has left its exit record (no rank is cut while it writes its checkpoint shard), or once the grace time
after the first rank's signal ran out (a rank stuck in a collective cannot stop the requeue).

Signals: the ranks get them from Slurm (USR2 `--signal-delay` s before the time limit; at preemption
SIGTERM, or USR2 with `SlurmctldParameters=preempt_send_user_signal`); each rank tells its node's agent when it
takes the first one, and the agent writes it into the node's file (`node_<host>.json`, `node_live`), which the
supervisor reads with every other node's in one listing per poll (`node_files`). The attempt folder, its host
folders and `checkpoints/` are made here once, before srun. The job is requeued only while Slurm still says
RUNNING: a preempted job in its GraceTime is RUNNING, a `scancel`ed or timed-out one is not (Slurm
would otherwise requeue a cancelled job: `scontrol requeue` accepts finished batch jobs).

The grace: at the first signal the supervisor asks Slurm once whether it is preempting the job
(`scontrol show job`: PreemptTime). If so, the ranks have the partition's GraceTime (`scontrol show
partition`) from PreemptTime, less a margin for the requeue itself, whatever `--signal-delay` says;
otherwise (the time limit) they have `--grace` s from the signal. A step that ends with no signal
recorded and a non-zero status is asked about too: ranks killed by the preemption's SIGTERM before they
could take it (still starting Python) are a preemption, requeued, not a failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.launch import records
from ddpslurm.launch.plan import REQUEUE_MARGIN_S
from ddpslurm.postmortem.jobend import at_job_end

WAIT = "wait"
REQUEUE = "requeue"
NONE = "none"
#: Status values of an exit record that mean the rank failed by itself.
FAILED_STATUSES = ("exception", "exit", "signal")
POLL_S = 1.0


@dataclass(frozen=True)
class Decision:
    action: str  # WAIT | REQUEUE | NONE
    reason: str


def _failed_before(exits: Mapping[int, Mapping[str, Any]], signal_unix: float) -> list[int]:
    return sorted(rank for rank, rec in exits.items()
                  if rec.get("status") in FAILED_STATUSES and float(rec.get("unix", 0)) < signal_unix)


def decide(*, exits: Mapping[int, Mapping[str, Any]], signal_unix: float | None, world_size: int,
           srun_running: bool, now: float, grace_s: float, attempt: int, max_requeues: int,
           signalled: frozenset[int] | None = None, preempted: bool = False) -> Decision:
    """What the batch step does now, from the attempt's exit records, first signal time, the ranks that
    recorded a signal (None: every rank counts as signalled) and whether Slurm is preempting the job. Pure."""
    if signal_unix is None:
        if preempted and not srun_running and attempt < max_requeues:
            return Decision(REQUEUE, "Slurm preempted the job and its ranks ended before they could take the "
                                     "signal (still starting)")
        return Decision(WAIT if srun_running else NONE, "no preemption or time-limit signal reached a rank")
    if attempt >= max_requeues:
        return Decision(NONE, f"attempt {attempt} reached --max-requeues {max_requeues}")
    failed = _failed_before(exits, signal_unix)
    if failed:
        return Decision(NONE, f"rank(s) {failed} failed before the signal: a requeue would fail again")
    if not srun_running:
        silent = sorted(set(range(world_size)) - set(exits) - (set(range(world_size)) if signalled is None
                                                                else signalled))
        if silent and not preempted:  # killed without taking any signal: srun's kill-on-bad-exit SIGTERMed the others
            return Decision(NONE, f"rank(s) {silent[:8]} ended with neither an exit record nor a signal "
                                  "(killed): the others' SIGTERM was srun ending the step, not a preemption")
        return Decision(REQUEUE, "every task has ended after the signal")
    missing = sorted(set(range(world_size)) - set(exits))
    if not missing:
        return Decision(WAIT, "every rank left its exit record; srun is ending")
    if now >= signal_unix + grace_s:
        return Decision(REQUEUE, f"grace time of {grace_s:g}s ran out with rank(s) {missing[:8]} still running")
    return Decision(WAIT, f"rank(s) {missing[:8]} still stopping")


class AttemptReader:
    """The attempt's signals and ends as the node files tell them (`node_files.NodeFiles`: one listing of the
    attempt folder per poll, only the node files that changed read)."""

    def __init__(self, attempt_dir: Path, world_size: int = 0) -> None:
        from ddpslurm.launch.node_files import NodeFiles

        self.attempt_dir, self.world_size = attempt_dir, world_size
        self.files = NodeFiles(attempt_dir)
        self.signalled: set[int] = set()

    def poll(self, final: bool = False) -> tuple[dict[int, dict[str, Any]], float | None]:
        """The ends by rank, and the earliest signal time any rank recorded (None: no signal yet). `final` (srun
        has ended): every node file read again, and the exit records of ranks no node file says ended."""
        self.files.poll(full=final)
        if final:
            self.files.read_exit_records(self.world_size)
        signals = self.files.signals()
        self.signalled = set(signals)
        if not signals:
            return {}, None
        return self.files.exits(), min(signals.values())


def read_attempt(attempt_dir: Path) -> tuple[dict[int, dict[str, Any]], float | None]:
    """The ends of an attempt's ranks by rank, and the earliest signal time any rank recorded."""
    return AttemptReader(attempt_dir).poll(final=True)


def make_folders(attempt_dir: Path, environ: Mapping[str, str]) -> int:
    """The attempt folder, one folder per node of the job (SLURM_JOB_NODELIST) and `checkpoints/`, made once here
    before srun instead of by every rank; how many were made. The ranks are told (`FOLDERS_MADE_ENV`)."""
    from ddpslurm.launch.worker import FOLDERS_MADE_ENV
    from ddpslurm.scheduler.hostlist import expand_hostlist

    made = 0
    try:
        hosts = expand_hostlist(environ.get("SLURM_JOB_NODELIST", ""))
    except ValueError:
        hosts = []
    try:
        attempt_dir.mkdir(parents=True, exist_ok=True)
        jobfolder.checkpoints_folder(attempt_dir.parent).mkdir(exist_ok=True)
        for host in dict.fromkeys(hosts):
            try:
                os.mkdir(jobfolder.host_folder(attempt_dir, host))
                made += 1
            except FileExistsError:
                pass
    except OSError as error:  # the ranks make what is missing themselves
        print(f"ddpslurm batch: cannot make the job's folders in {attempt_dir}: {error}", file=sys.stderr, flush=True)
        return made
    os.environ[FOLDERS_MADE_ENV] = str(attempt_dir)  # srun passes it on to every task
    return made


def job_state(job_id: str) -> str | None:
    """The job's state as slurmctld has it now (RUNNING, COMPLETING, ...), None if it cannot be read."""
    from ddpslurm.scheduler.commands import scontrol_show_job_argv
    from ddpslurm.scheduler.parse import parse_scontrol_show
    from ddpslurm.scheduler.run import run

    try:
        found = parse_scontrol_show(run(scontrol_show_job_argv(job_id), timeout=30).stdout)
    except Exception:  # any failure: the caller says so and does not requeue
        return None
    return found[0].get("JobState") if found else None


def preemption_margin_s(grace_time_s: float) -> float:
    """Seconds before the end of Slurm's GraceTime at which the supervisor requeues ranks still running: the
    requeue must reach slurmctld while the job still runs (a tenth of the grace, 2 s to REQUEUE_MARGIN_S)."""
    return min(float(REQUEUE_MARGIN_S), max(2.0, grace_time_s / 10))


def slurm_preemption(job: Mapping[str, str], partition: Mapping[str, str] | None) -> tuple[float, float] | None:
    """(PreemptTime as unix time, the partition's GraceTime in s) when Slurm is preempting the job, from
    `scontrol show job` and `show partition` records; None when it is not (PreemptTime=None, the time limit).
    A GraceTime that cannot be read counts as 0. Pure (PreemptTime is the controller's local time)."""
    text = (job.get("PreemptTime") or "").strip()
    if not text or text in ("None", "Unknown", "N/A"):
        return None
    try:
        preempt_unix = datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
    grace = (partition or {}).get("GraceTime", "").strip()
    return preempt_unix, float(grace) if grace.isdigit() else 0.0


def grace_after_signal(preemption: tuple[float, float] | None, signal_unix: float, grace_s: float) -> float:
    """Seconds from the first signal until the supervisor requeues with ranks still running: the partition's
    GraceTime from PreemptTime (less `preemption_margin_s`) when Slurm preempts, else `grace_s`. Pure."""
    if preemption is None:
        return grace_s
    preempt_unix, grace_time = preemption
    return max(0.0, preempt_unix + grace_time - preemption_margin_s(grace_time) - signal_unix)


def query_preemption(job_id: str) -> tuple[float, float] | None:
    """`slurm_preemption` of the running job, asked of slurmctld (two scontrol calls); None on any failure."""
    from ddpslurm.scheduler.commands import scontrol_show_job_argv, scontrol_show_partition_argv
    from ddpslurm.scheduler.parse import parse_scontrol_show
    from ddpslurm.scheduler.run import run

    try:
        found = parse_scontrol_show(run(scontrol_show_job_argv(job_id), timeout=30).stdout)
        if not found or slurm_preemption(found[0], None) is None:
            return None
        name = found[0].get("Partition", "").split(",")[0]
        partition = parse_scontrol_show(run(scontrol_show_partition_argv(name), timeout=30).stdout)
        return slurm_preemption(found[0], partition[0] if partition else None)
    except Exception:  # any failure: the --grace rule applies
        return None


def requeue_if_running(job_id: str, attempt_dir: Path, reason: str) -> bool:
    """`scontrol requeue` when Slurm still runs the job; the outcome goes to `requeue.json` and stderr.

    The record is written before Slurm is asked: a requeue ends this batch step, which may not live to write after
    it. A refused requeue then rewrites the record."""
    from ddpslurm.launch.requeue import requeue_job

    state = job_state(job_id)
    outcome: dict[str, Any] = {"job_id": job_id, "reason": reason, "job_state": state, "unix": time.time(),
                               "time": records.timestamp(time.time()), "requeued": state == "RUNNING"}
    if state != "RUNNING":
        outcome["why_not"] = f"Slurm has the job {state or 'in an unknown state'}: it was cancelled or ended"
    else:
        jobfolder.write_json(jobfolder.requeue_path(attempt_dir), outcome)
        print(f"ddpslurm batch: requeuing job {job_id}: {reason}", file=sys.stderr, flush=True)
        try:
            requeue_job(job_id)
            return True
        except Exception as error:  # recorded; the job then simply ends
            outcome["requeued"] = False
            outcome["why_not"] = str(error).splitlines()[0] if str(error) else type(error).__name__
    jobfolder.write_json(jobfolder.requeue_path(attempt_dir), outcome)
    print(f"ddpslurm batch: not requeuing job ({outcome['why_not']}): {job_id}: {reason}", file=sys.stderr,
          flush=True)
    return False


def record_no_requeue(job_id: str, attempt_dir: Path, reason: str) -> None:
    """A signal reached the ranks but the job is not requeued: say why in `requeue.json` and the batch log."""
    now = time.time()
    outcome = {"job_id": job_id, "reason": reason, "job_state": None, "unix": now, "time": records.timestamp(now),
               "requeued": False, "why_not": reason}
    jobfolder.write_json(jobfolder.requeue_path(attempt_dir), outcome)
    print(f"ddpslurm batch: not requeuing job {job_id}: {reason}", file=sys.stderr, flush=True)


def supervise(srun_argv: Sequence[str], *, folder: str, world_size: int, grace_s: float, max_requeues: int,
              environ: Mapping[str, str], hang_timeout_s: float = 0) -> int:
    """Run srun; requeue when `decide` says so; watch for hangs with --hang-timeout; srun's exit status."""
    from ddpslurm.scheduler.run import start

    job_id = environ.get("SLURM_JOB_ID", "")
    attempt = int(environ.get("SLURM_RESTART_COUNT", "0") or 0)
    attempt_dir = jobfolder.attempt_folder(jobfolder.job_folder(folder, job_id), attempt)
    if job_id:
        make_folders(attempt_dir, environ)
    process = start(srun_argv)
    reader = AttemptReader(attempt_dir, world_size)
    acted = False
    monitor = _hang_monitor(attempt_dir, job_id, hang_timeout_s, reader)
    slurm = SlurmView(job_id)
    while True:
        code = process.poll()
        exits, signal_unix = reader.poll(final=code is not None)  # the one listing of this poll
        if monitor is not None and code is None:
            monitor.poll()
        preemption = slurm.preemption(signal_unix is not None or bool(code), failed=bool(code))
        grace = grace_s if signal_unix is None else grace_after_signal(preemption, signal_unix, grace_s)
        decision = decide(exits=exits, signal_unix=signal_unix, world_size=world_size,
                          srun_running=code is None, now=time.time(), grace_s=grace, attempt=attempt,
                          max_requeues=max_requeues, signalled=frozenset(reader.signalled),
                          preempted=preemption is not None)
        if decision.action == REQUEUE and not acted and job_id:
            acted = True
            requeue_if_running(job_id, attempt_dir, decision.reason)
        if code is not None:
            if code and not acted and decision.action != REQUEUE:  # fewer than --nodes MIN left (torchrun)
                acted = requeue_below_min(job_id, attempt_dir, attempt=attempt, max_requeues=max_requeues,
                                          environ=environ)
            if decision.action == NONE and signal_unix is not None and not acted:
                record_no_requeue(job_id, attempt_dir, decision.reason)
            return code
        time.sleep(POLL_S)


class SlurmView:
    """Asks Slurm whether it preempts the job once, when first needed (a signal reached a rank, or srun
    failed), and again only if that first answer came before the job was preempted and srun then failed."""

    def __init__(self, job_id: str, query: Any = None) -> None:
        self.job_id, self.query = job_id, query or query_preemption
        self._asked: list[bool] = []  # the `failed` value of each question asked
        self._answer: tuple[float, float] | None = None

    def preemption(self, needed: bool, failed: bool = False) -> tuple[float, float] | None:
        if not needed or not self.job_id or self._answer is not None or len(self._asked) >= 2:
            return self._answer
        if self._asked and not failed:
            return self._answer
        self._asked.append(failed)
        self._answer = self.query(self.job_id)
        if self._answer is not None:
            print(f"ddpslurm batch: Slurm is preempting job {self.job_id}: the ranks have the partition's "
                  f"GraceTime of {self._answer[1]:g}s", file=sys.stderr, flush=True)
        return self._answer


def _hang_monitor(attempt_dir: Path, job_id: str, hang_timeout_s: float, reader: AttemptReader) -> Any:
    if hang_timeout_s <= 0 or not job_id:
        return None
    from ddpslurm.launch.hang_monitor import HangMonitor

    return HangMonitor(attempt_dir, job_id, hang_timeout_s, files=reader.files)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpslurm.launch.batch", description=__doc__.split("\n")[0])
    job_dir = jobfolder.job_folder_name("<id>")
    parser.add_argument("--folder", required=True, help=f"the jobs root (the job folder is FOLDER/{job_dir})")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--grace", type=float, required=True, help="seconds after the first signal")
    parser.add_argument("--max-requeues", type=int, required=True)
    parser.add_argument("--hang-timeout", type=float, default=0, help="seconds without progress (0: no monitor)")
    parser.add_argument("--preflight", action="store_true", help="run ddpslurm doctor's checks first")
    parser.add_argument("--no-analyze", action="store_true", help="no post-mortem at a failed job's end")
    parser.add_argument("srun", nargs=argparse.REMAINDER, help="-- srun ARGS...")
    args = parser.parse_args(argv)
    srun_argv = args.srun[1:] if args.srun[:1] == ["--"] else args.srun
    if not srun_argv:
        parser.error("give the srun command after --")
    if args.preflight:
        from ddpslurm.doctor.preflight import PREFLIGHT_FAILED_EXIT, preflight_passes

        if not preflight_passes(args.folder, os.environ):
            return PREFLIGHT_FAILED_EXIT
    code = supervise(srun_argv, folder=args.folder, world_size=args.world_size, grace_s=args.grace,
                     max_requeues=args.max_requeues, environ=os.environ, hang_timeout_s=args.hang_timeout)
    if not args.no_analyze:  # diagnosis.json, .md and the job's Comment (ddpslurm.postmortem.jobend)
        at_job_end(args.folder, os.environ, code)
    return code


def requeue_below_min(job_id: str, attempt_dir: Path, *, attempt: int, max_requeues: int,
                      environ: Mapping[str, str]) -> bool:
    """Once srun has ended: requeue the job when its torchrun agents gave up for want of nodes
    (`below_min.decide`); whether it was requeued. Records its decision; does nothing for any other end."""
    from ddpslurm.launch.below_min import NONE, decide, read_gave_up, write_record
    from ddpslurm.scheduler.hostlist import expand_hostlist

    gave_up = read_gave_up(attempt_dir)
    if not gave_up or not job_id:
        return False
    try:
        hosts = expand_hostlist(environ.get("SLURM_JOB_NODELIST", ""))
    except ValueError:
        hosts = []
    decision = decide(gave_up, hosts=hosts, attempt=attempt, max_requeues=max_requeues)
    if decision.action == NONE:
        if decision.reason:
            write_record(attempt_dir, decision, False)
            record_no_requeue(job_id, attempt_dir, decision.reason)
        return False
    write_record(attempt_dir, decision, True)  # before the requeue: Slurm ends this batch step with it
    requeued = requeue_if_running(job_id, attempt_dir, decision.reason)
    if not requeued:
        write_record(attempt_dir, decision, False)
    return requeued


if __name__ == "__main__":
    sys.exit(main())
