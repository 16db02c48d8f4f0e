"""`ddpslurm submit` as one library call: spec -> plan -> dry run | submit (| wait). Prints through `echo`."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from ddpslurm.launch.plan import plan as make_plan
from ddpslurm.launch.spec import make_spec

#: Exit status of `submit --wait` when the job ended in failure (the same as `ddpslurm status --wait`).
EXIT_JOB_FAILED = 3


def run_submit(options: dict[str, Any], *, dry_run: bool, wait: bool, as_json: bool,
               echo: Callable[..., None]) -> int:
    """Validate, plan, and print (--dry-run) or submit; returns the exit status for the CLI
    (0, or EXIT_JOB_FAILED when a waited-for job failed)."""
    spec = make_spec(**options)
    plan = make_plan(spec)
    from ddpslurm.launch import submit as submitting

    if not (dry_run and not as_json):  # the dry-run text carries them itself
        for text in plan.warnings:
            echo(f"ddpslurm: warning: {text}", err=True)
    if dry_run:
        if as_json:
            echo(json.dumps({"sbatch": None if spec.local else submitting.render_sbatch(plan),
                             "rank_env": dict(plan.rank_env), "executor": plan.executor,
                             "executor_params": plan.executor_params}, indent=1, default=str))
        else:
            echo(submitting.dry_run_text(spec, plan), nl=False)
        return 0
    submitted = submitting.submit(spec, plan)
    folder = shlex.quote(str(submitted.folder))
    result: dict[str, Any] = {"job_id": submitted.job_id, "folder": str(submitted.folder),
                              "executor": plan.executor}
    if not as_json:
        where = "locally (pid)" if spec.local else ""
        echo(f"Submitted job {submitted.job_id} {where}".rstrip())
        echo(f"  folder:  {submitted.folder}")
        if not spec.local:
            echo(f"  status:  ddpslurm status {submitted.job_id} --wait")
        echo(f"  analyze: ddpslurm analyze {folder}")
    if not (wait or spec.local):
        if as_json:
            echo(json.dumps(result))
        return 0
    if spec.local:
        code = submitting.wait_local(submitted)
        state, ok, detail = ("completed", True, "") if code == 0 else ("failed", False, f"exit code {code}")
    else:
        outcome = submitting.wait_slurm(submitted.job_id)
        state, ok, detail = outcome.state, outcome.ok, outcome.detail
    result.update(state=state, ok=ok, detail=detail)
    if as_json:
        echo(json.dumps(result))
    else:
        suffix = f" ({detail})" if detail else ""
        if ok:
            echo(f"Job {submitted.job_id} {state}{suffix}.")
        else:
            echo(f"Job {submitted.job_id} {state}{suffix}. See why: ddpslurm analyze {folder}", err=True)
    return 0 if ok else EXIT_JOB_FAILED
