"""`submit --preflight`: the doctor's checks as the first step of every attempt, inside the job's allocation.

The batch-step supervisor calls `preflight_passes` before it starts the training srun: one probe per node
(an srun step through `ddpslurm.scheduler.run`), records in the job folder, the verdict on stderr (the batch
log). A failed pre-flight ends the attempt at once, so `ddpslurm analyze` names the node instead of an init
timeout naming nobody.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from ddpslurm.doctor.command import load_records, render_table
from ddpslurm.doctor.judge import failing_nodes, judge
from ddpslurm.doctor.probe import DEFAULT_WINDOW_S
from ddpslurm.env import master_port_for
from ddpslurm.errors import SlurmCommandError
from ddpslurm.jobfolder import doctor_folder, job_folder
from ddpslurm.scheduler.hostlist import expand_hostlist

#: Exit status of the batch step when the pre-flight failed (the training step never started).
PREFLIGHT_FAILED_EXIT = 1
#: The training srun runs as the step after the pre-flight's, and its default MASTER_PORT depends on the step id.
TRAINING_STEP_ID = "1"
#: The probes end after their window; srun gets this long before the nodes that left no record are failed.
PREFLIGHT_TIMEOUT_S = DEFAULT_WINDOW_S + 50


def training_port(environ: Mapping[str, str]) -> int:
    """The MASTER_PORT the training step will get: a preset one, else the one derived for step 1."""
    preset = environ.get("MASTER_PORT", "").strip()
    if preset.isdigit():
        return int(preset)
    return master_port_for(environ.get("SLURM_JOB_ID", "0"), TRAINING_STEP_ID)


def preflight_argv(environ: Mapping[str, str], folder: str, python: str = sys.executable) -> list[str]:
    """One probe task on every node of the allocation (pure)."""
    nodes = len(expand_hostlist(environ["SLURM_JOB_NODELIST"]))
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            "--job-name=ddpslurm-preflight", python, "-m", "ddpslurm.doctor.probe", "--folder", folder,
            "--window", f"{DEFAULT_WINDOW_S:g}", "--port", str(training_port(environ))]


def preflight_passes(folder: str, environ: Mapping[str, str]) -> bool:
    """Run the checks on every node of this job; print the verdict to stderr; True when every check passed."""
    from ddpslurm.scheduler.run import run

    nodes = expand_hostlist(environ["SLURM_JOB_NODELIST"])
    try:
        code: int | str = run(preflight_argv(environ, folder), timeout=PREFLIGHT_TIMEOUT_S, check=False).returncode
    except SlurmCommandError as error:  # a probe that never returns: the nodes that wrote records still tell
        code = error.one_line()
    job_dir = job_folder(folder, environ["SLURM_JOB_ID"])
    checks = judge(nodes, load_records(Path(job_dir), nodes))
    failing = failing_nodes(checks)
    print(render_table(checks), file=sys.stderr, flush=True)
    if failing:
        print(f"ddpslurm batch: pre-flight failed on {','.join(failing)}: the training step does not start "
              f"(srun: {code}); records in {doctor_folder(job_dir)}/", file=sys.stderr, flush=True)
    return not failing
