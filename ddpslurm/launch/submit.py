"""Execute a `LaunchPlan` through submitit (the only module of ddpslurm that imports submitit).

`render_sbatch(plan)` goes through submitit's own sbatch builder, so `--dry-run` prints exactly the
script `submit(plan)` hands to sbatch (without submitit installed, through ddpslurm's copy of its format).
Everything that reaches a shell is quoted by submitit (`shlex.quote` on every #SBATCH value and srun
argument); the script path and its arguments never reach a shell at all: they travel inside the pickled worker.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm._version import __version__
from ddpslurm.errors import SubmitError
from ddpslurm.launch.interpreter import NEEDED_MODULES
from ddpslurm.launch.plan import ENV_DEFAULTS, LaunchPlan
from ddpslurm.launch.spec import JobSpec

#: sbatch error fragments -> the hint that fixes them (data, first match wins).
SBATCH_HINTS: tuple[tuple[str, str], ...] = (
    ("invalid partition", "List the partitions with `sinfo -s` and pass one with --partition"),
    ("invalid account", "List your accounts with `sacctmgr show assoc user=$USER format=account` "
                        "and pass one with --account"),
    ("invalid qos", "List the QOS you may use with `sacctmgr show assoc user=$USER format=qos`"),
    ("node count specification invalid", "Lower --nodes (see `sinfo -s` for the partition's size)"),
    ("requested node configuration is not available",
     "Lower --tasks-per-node/--cpus-per-task/--gpus-per-node/--mem, or check `sinfo -o '%P %c %m %G'`"),
    ("time limit", "Lower --time to the partition's limit (`sinfo -o '%P %l'`)"),
    ("unable to contact slurm controller", "Is slurmctld running and SLURM_CONF right? Try `sinfo`"),
)


NO_SUBMITIT = ("submitit is not installed in this Python: the script below is ddpslurm's rendering of its format, "
               "and submitting needs pip install 'ddpslurm[launch]'")


@dataclass(frozen=True)
class Submitted:
    """A submitted job: its id and its folder (plus submitit's job object for waiting)."""

    job_id: str
    folder: Path
    job: Any = None


def sbatch_hint(stderr: str) -> str:
    """The fix for an sbatch failure, from its error text."""
    low = stderr.lower()
    return next((hint for fragment, hint in SBATCH_HINTS if fragment in low),
                "Check the options against `sinfo -s` and your site's limits")


def _executor_class(offline: bool) -> Any:
    from submitit import SlurmExecutor

    if not offline:
        return SlurmExecutor

    class _OfflineSlurmExecutor(SlurmExecutor):
        """submitit's SlurmExecutor without its `srun on PATH` check, for rendering only."""

        @classmethod
        def affinity(cls) -> int:
            return 2

    return _OfflineSlurmExecutor


def _python(plan: LaunchPlan) -> str:
    """The interpreter of the ranks as submitit puts it into a shell line."""
    return shlex.quote(plan.python or sys.executable)


def has_submitit() -> bool:
    """Whether submitit can be imported here (`submit` needs it; `--dry-run` renders without it)."""
    return importlib.util.find_spec("submitit") is not None


def _slurm_executor(plan: LaunchPlan, offline: bool = False) -> Any:
    executor = _executor_class(offline)(folder=plan.folder, max_num_timeout=plan.max_requeues, python=_python(plan))
    executor.update_parameters(**plan.executor_params)
    return executor


def render_sbatch(plan: LaunchPlan) -> str:
    """The sbatch script submitit would submit for `plan` (nothing is written or submitted); without
    submitit, the same text from ddpslurm's copy of its format (`ddpslurm.launch.sbatch_text`)."""
    if not has_submitit():
        from ddpslurm.launch import sbatch_text

        return sbatch_text.render(plan, _python(plan))
    executor = _slurm_executor(plan, offline=True)
    return executor._make_submission_file_text(executor._submitit_command_str, "dry-run")


def _restart_lines(spec: JobSpec) -> list[str]:
    """The dry run's lines on in-place restarts and node ranges (torchrun's argv as each node's agent derives it)."""
    if not spec.max_restarts and not spec.elastic:
        return []
    from ddpslurm.launch.torchrun_agent import shown_argv

    lines = [f"# in-place restarts: at most {spec.max_restarts} (all workers, same job and attempt; "
             "DDPSLURM_RESTART_COUNT tells the script)"]
    if spec.elastic:
        lines.append(f"# node range: sbatch --nodes={spec.min_nodes}-{spec.nodes}, srun --no-kill: a lost node leaves "
                     f"the others training while {spec.min_nodes} remain; below that torchrun gives up after its "
                     "rendezvous join timeout and the batch step requeues the job (--max-requeues)")
    shown = shown_argv(min_nodes=spec.min_nodes or 0, max_nodes=spec.nodes, max_restarts=spec.max_restarts)
    lines.append(f"# per node: {shown}")
    return lines


def dry_run_text(spec: JobSpec, plan: LaunchPlan) -> str:
    """What `--dry-run` prints: the plan, the complete sbatch script, and the environment of every rank."""
    launcher = "local" if spec.local else spec.launcher
    shown_job = jobfolder.job_folder_name(jobfolder.SHOWN_JOB_ID)
    nodes = f"{spec.min_nodes}..{spec.nodes}" if spec.elastic else str(spec.nodes)
    world = f"{(spec.min_nodes or 0) * spec.tasks_per_node}..{spec.world_size}" if spec.elastic else spec.world_size
    lines = [
        f"# ddpslurm dry run: nothing is submitted. Job folder: {spec.folder}/{shown_job}/",
        f"# script: {spec.script}",
        f"# script args: {json.dumps(list(spec.script_args))}",
        f"# ranks: {nodes} node(s) x {spec.tasks_per_node} = {world}, launcher {launcher}",
        *_restart_lines(spec),
        f"# signal {plan.signal} (seconds before the time limit), max requeues {plan.max_requeues}, "
        f"grace {plan.worker.grace_s}s for a script that ignores the flag",
        f"# python: {plan.python or sys.executable} (checked for {', '.join(NEEDED_MODULES)} at submission"
        f"{'' if spec.local else ' and in the batch step'})",
        *(f"# warning: {text}" for text in plan.warnings),
        *([f"# warning: {NO_SUBMITIT}"] if not has_submitit() else []),
    ]
    if spec.local:
        lines += [f"# local run through submitit's LocalExecutor: {json.dumps(plan.executor_params, sort_keys=True)}"]
    else:
        lines += ["", "# ---- sbatch script ----", render_sbatch(plan).rstrip("\n"), "# ---- end ----"]
    width = max(len(name) for name, _ in plan.rank_env)
    lines += ["", "# environment of every rank"]
    lines += [f"{name.ljust(width)}  {value}" for name, value in plan.rank_env]
    return "\n".join(lines) + "\n"


def job_record(spec: JobSpec, plan: LaunchPlan, job_id: str, unix: float) -> dict[str, Any]:
    """The job-level record (`jobfolder.JOB_RECORD_FILE`)."""
    spec_fields = asdict(spec)
    spec_fields.update(script=str(spec.script), folder=str(spec.folder),
                       script_args=list(spec.script_args), sbatch_args=[list(p) for p in spec.sbatch_args])
    from ddpslurm.launch.records import timestamp

    return {
        "schema": 1, "kind": "job", "version": __version__, "job_id": job_id, "executor": plan.executor,
        "submit_time": timestamp(unix), "submit_unix": unix, "spec": spec_fields,
        "launcher": "local" if spec.local else spec.launcher, "world_size": spec.world_size,
        "sbatch_options": plan.executor_params, "srun_args": list(plan.srun_args), "signal": plan.signal,
        "max_requeues": plan.max_requeues, "env_defaults": {name: value for name, value, _ in ENV_DEFAULTS},
    }


def _write_job_record(spec: JobSpec, plan: LaunchPlan, job_id: str, unix: float) -> Path:
    folder = jobfolder.job_folder(spec.folder, job_id)
    jobfolder.write_json(jobfolder.job_record_path(folder), job_record(spec, plan, job_id, unix))
    return folder


def submit(spec: JobSpec, plan: LaunchPlan) -> Submitted:
    """Submit through submitit (Slurm, or the local executor with --local); returns the job id and folder."""
    from ddpslurm.launch.worker import Worker

    jobfolder.check_folder(spec.folder)
    if spec.local:
        return _submit_local(spec, plan)
    from ddpslurm.scheduler.run import require_slurm

    require_slurm("sbatch", os.environ)
    from submitit.core.utils import FailedJobError

    unix = time.time()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):  # submitit echoes sbatch's stderr; we say it in one line
            job = _slurm_executor(plan).submit(Worker(plan.worker))
    except FailedJobError as error:
        text = str(error) or captured.getvalue()
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "no error output")
        raise SubmitError(f"sbatch refused the job: {first}", sbatch_hint(text)) from None
    folder = _write_job_record(spec, plan, str(job.job_id), unix)
    return Submitted(str(job.job_id), folder, job)


def _submit_local(spec: JobSpec, plan: LaunchPlan) -> Submitted:
    from submitit import LocalExecutor

    from ddpslurm.launch.worker import Worker

    unix = time.time()
    executor = LocalExecutor(folder=plan.folder, max_num_timeout=plan.max_requeues, python=_python(plan))
    executor.update_parameters(**plan.executor_params)
    job = executor.submit(Worker(plan.worker))
    folder = _write_job_record(spec, plan, str(job.job_id), unix)
    return Submitted(str(job.job_id), folder, job)


def wait_local(submitted: Submitted, poll_s: float = 0.5) -> int:
    """Wait for a --local job; its exit status is the worst of the ranks' (from their exit records)."""
    job = submitted.job
    while not job.done():
        time.sleep(poll_s)
    with contextlib.suppress(OSError):  # submitit's local controller creates the unformatted `job_%j` folder
        jobfolder.job_folder(submitted.folder.parent, jobfolder.SUBMITIT_JOB_ID).rmdir()
    return local_outcome(submitted.folder, job.num_tasks)


def local_outcome(job_dir: Path, world_size: int) -> int:
    """0 when every rank's exit record says ok, else the first non-zero exit code (1 when one is missing)."""
    codes = []
    found = jobfolder.read_rank_records(jobfolder.attempt_folder(job_dir, 0), "exit")  # node files, rank files
    for rank in range(world_size):
        try:
            codes.append(int(found[rank]["exit_code"]))
        except (KeyError, TypeError, ValueError):
            codes.append(1)
    return next((code for code in codes if code), 0)


@dataclass(frozen=True)
class Outcome:
    """How a waited-for job ended."""

    state: str
    ok: bool
    detail: str = ""
    nodes: tuple[str, ...] = ()


def wait_slurm(job_id: str) -> Outcome:
    """Wait for the end of the job through `ddpslurm status`'s poller (sacct, scontrol while sacct lags;
    intervals growing to 30 s; a requeued job is not over)."""
    from ddpslurm.scheduler.status import wait_for_job

    status = wait_for_job(job_id)
    details = []
    if status.exit_code is not None:
        details.append(f"exit code {status.exit_code}" + (f", signal {status.signal}" if status.signal else ""))
    if status.requeue_count:
        details.append(f"requeued {status.requeue_count} time(s)")
    from ddpslurm.scheduler.parse import node_names

    return Outcome(status.state.value, not status.failed, ", ".join(details), node_names(status.nodelist))
