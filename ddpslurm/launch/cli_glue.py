"""`ddpslurm submit` as one library call: spec -> plan -> dry run | submit (| wait). Prints through `echo`."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpslurm.errors import DdpSlurmError, LintRefusedError, UsageError
from ddpslurm.launch.plan import LaunchPlan
from ddpslurm.launch.plan import plan as make_plan
from ddpslurm.launch.spec import JobSpec, make_spec
from ddpslurm.sanitize import terminal

#: Exit status of `submit --wait` when the job ended in failure (the same as `ddpslurm status --wait`).
EXIT_JOB_FAILED = 3
#: `submit --lint`: refuse error-level findings, print findings, or skip the linter
LINT_MODES = ("error", "warn", "off")


def lint_gate(script: Path, mode: str, echo: Callable[..., None]) -> None:
    """`submit --lint`: the script's warning and error findings on stderr; with `error`, a LintRefusedError when
    one is an error. A script the linter cannot read, or a fault of the linter, is noted and not held back."""
    if mode not in LINT_MODES:
        raise UsageError(f"--lint {mode!r} is unknown", f"Use one of: {', '.join(LINT_MODES)}")
    if mode == "off":
        return
    from ddpslurm.lint import render
    from ddpslurm.lint.engine import lint_script
    from ddpslurm.lint.model import ERROR, INFO

    try:
        report = lint_script(script)
    except DdpSlurmError as failed:
        echo(f"ddpslurm: lint: skipped: {terminal(failed.one_line())}", err=True)
        return
    except Exception as failed:  # a fault of the linter must not stop a submission
        echo(f"ddpslurm: lint: skipped after an internal error ({type(failed).__name__}: {terminal(failed)}); "
             "please report it", err=True)
        return
    shown = [f for f in report.findings if f.level != INFO]
    for finding in shown:
        echo(f"ddpslurm: lint: {render.one_line(finding)}", err=True)
    errors = sorted({f.rule for f in shown if f.level == ERROR})
    command = f"ddpslurm lint {shlex.quote(render.shown_path(script))}"
    if mode == "error" and errors:
        count = sum(f.level == ERROR for f in shown)
        raise LintRefusedError(f"not submitted: the script has {count} error-level lint finding"
                               f"{'s' if count != 1 else ''} ({', '.join(errors)})",
                               f"Fix {'it' if count == 1 else 'them'} (`{terminal(command)}` says why and how), "
                               "mark a deliberate one `# ddpslurm: ignore[ID]`, or submit with --lint warn")
    if shown:
        echo(f"ddpslurm: lint: {render.counts_text(shown)}; `{terminal(command)}` says why and how to fix "
             "(--lint error refuses such a script, --lint off skips this)", err=True)


def check_python(spec: JobSpec, echo: Callable[..., None]) -> None:
    """`submit --python`: refuse an interpreter that cannot import what the ranks need, before the queue wait;
    a warning when it cannot be run here (the batch step checks it again before srun)."""
    from ddpslurm.launch.interpreter import check_interpreter
    from ddpslurm.launch.plan import package_parent

    warning = check_interpreter(spec.python, package_parent=package_parent())
    if warning:
        echo(f"ddpslurm: warning: {terminal(warning)}", err=True)


def print_dry_run(spec: JobSpec, plan: LaunchPlan, as_json: bool, echo: Callable[..., None]) -> None:
    """`submit --dry-run`: the plan, the sbatch script and the ranks' environment, as text or one JSON object."""
    from ddpslurm.launch import submit as submitting

    if not as_json:
        echo(submitting.dry_run_text(spec, plan), nl=False)
        return
    missing = [] if submitting.has_submitit() else [submitting.NO_SUBMITIT]
    echo(json.dumps({"sbatch": None if spec.local else submitting.render_sbatch(plan),
                     "rank_env": dict(plan.rank_env), "executor": plan.executor, "python": plan.python,
                     "executor_params": plan.executor_params, "warnings": [*plan.warnings, *missing]},
                    indent=1, default=str))


def run_submit(options: dict[str, Any], *, dry_run: bool, wait: bool, as_json: bool,
               echo: Callable[..., None], retries: int = 0, lint: str = "warn") -> int:
    """Validate, lint (`lint`: error|warn|off), plan, and print (--dry-run) or submit; returns the exit status
    for the CLI (0, or EXIT_JOB_FAILED when a waited-for job failed). `retries` > 0: the retry chain (it waits)."""
    spec = make_spec(**options)
    if retries < 0:
        raise UsageError(f"--retries {retries} is negative", "Give 0 (no retries) or more")
    if retries and spec.local:
        raise UsageError("--retries resubmits to Slurm away from bad nodes and cannot run with --local",
                         "Drop --retries or --local")
    if retries and spec.nodelist:
        raise UsageError("--retries resubmits away from the blamed nodes and cannot keep --nodelist",
                         "Drop --retries or --nodelist")
    lint_gate(spec.script, lint, echo)
    if not dry_run:
        check_python(spec, echo)
    if retries and not dry_run:
        return run_retries(spec, options, retries, as_json=as_json, echo=echo)
    plan = make_plan(spec)
    from ddpslurm.launch import submit as submitting

    if not (dry_run and not as_json):  # the dry-run text carries them itself
        for text in plan.warnings:
            echo(f"ddpslurm: warning: {text}", err=True)
    if dry_run:
        print_dry_run(spec, plan, as_json, echo)
        return 0
    submitted = submitting.submit(spec, plan)
    folder = shlex.quote(str(submitted.folder))
    result: dict[str, Any] = {"job_id": submitted.job_id, "folder": str(submitted.folder),
                              "executor": plan.executor}
    if not as_json:
        where = "locally (pid)" if spec.local else ""
        echo(f"Submitted job {submitted.job_id} {where}".rstrip())
        echo(f"  folder:  {submitted.folder}")
        echo(f"  status:  ddpslurm status {folder if spec.local else submitted.job_id} --wait")
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


def run_retries(spec: JobSpec, options: dict[str, Any], retries: int, *, as_json: bool,
                echo: Callable[..., None]) -> int:
    """`submit --retries N`: the job, and after an infrastructure fault the same job away from the blamed
    nodes, at most N more times (ddpslurm.launch.retries). Prints the chain; 0 when its last job completed."""
    from ddpslurm.launch import submit as submitting
    from ddpslurm.launch.retries import ChainSteps, analyze_job, chain_lines, run_chain

    def submit_once(exclude: str | None) -> tuple[str, str]:
        this = make_spec(**{**options, "exclude": exclude})
        this_plan = make_plan(this)
        for text in this_plan.warnings:
            echo(f"ddpslurm: warning: {text}", err=True)
        submitted = submitting.submit(this, this_plan)
        if not as_json:
            away = f" (excluding {exclude})" if exclude else ""
            echo(f"Submitted job {submitted.job_id}{away}\n  folder:  {submitted.folder}")
        return submitted.job_id, str(submitted.folder)

    def wait_once(job_id: str) -> tuple[str, bool, tuple[str, ...]]:
        outcome = submitting.wait_slurm(job_id)
        return outcome.state, outcome.ok, outcome.nodes

    steps = ChainSteps(submit=submit_once, wait=wait_once, analyze=analyze_job,
                       say=lambda text: echo(terminal(text), err=True))
    record = run_chain(steps, retries, spec.exclude)
    if as_json:
        echo(json.dumps(record))
    else:
        echo("\n".join(chain_lines(record, terminal)))
        last = record["attempts"][-1]
        if record["ok"]:
            echo(f"Job {last['job_id']} completed.")
        else:
            echo(f"Job {last['job_id']} {last['state']}. See why: ddpslurm analyze {shlex.quote(last['folder'])}",
                 err=True)
    return 0 if record["ok"] else EXIT_JOB_FAILED
