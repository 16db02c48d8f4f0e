"""The `ddpslurm` command line: parse, call one library function, render. Nothing else.

Heavy modules (torch, pandas, submitit, rich) are imported inside the commands that need them, so
`ddpslurm --help` starts fast. All known errors become one line and an exit code in `main()`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys

import click

from ddpslurm._version import __version__
from ddpslurm.errors import DdpSlurmError, TemplateError
from ddpslurm.jobfolder import DEFAULT_ROOT, job_folder_name
from ddpslurm.sanitize import terminal

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
#: `analyze --jobs` beyond this is refused: more worker processes than cores only cost memory and forks
MAX_ANALYZE_JOBS = max(64, os.cpu_count() or 1)


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="ddpslurm")
@click.option("--debug", is_flag=True, help="Show full Python tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Launch PyTorch DDP scripts on Slurm, and tell why a multi-node job failed.

    \b
      ddpslurm submit train.py --nodes 2 --gpus-per-node 8 -- --lr 0.1
      ddpslurm status 1234
      ddpslurm analyze ddpslurm_jobs/job_1234/
      ddpslurm lint train.py
      ddpslurm template --list
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path())  # a path: shell completion offers files
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-N", "--nodes", default="1", show_default=True, metavar="N|MIN:MAX",
              help="Number of nodes, or a range MIN:MAX (torchrun: the job runs on what Slurm gives and goes on "
                   "after losing nodes while MIN remain).")
@click.option("--tasks-per-node", "--ntasks-per-node", "tasks_per_node", type=int, default=None,
              help="Ranks per node [default: --gpus-per-node or 1].")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (sbatch --gpus-per-node).")
@click.option("-c", "--cpus-per-task", type=int, default=None, help="CPUs per rank.")
@click.option("--mem", default=None, help="Memory per node, e.g. 64G.")
@click.option("-p", "--partition", default=None, help="Slurm partition (`sinfo -s` lists them).")
@click.option("-A", "--account", default=None, help="Slurm account.")
@click.option("-q", "--qos", default=None, help="Slurm QOS.")
@click.option("-t", "--time", "time_limit", default="60", show_default=True,
              help="Time limit as sbatch takes it: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S.")
@click.option("-C", "--constraint", default=None, help="Node features (sbatch --constraint).")
@click.option("-x", "--exclude", default=None, help="Nodes to avoid, e.g. node[03-04].")
@click.option("-w", "--nodelist", default=None, help="Nodes to run on, e.g. node[01-02] (sbatch --nodelist).")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="KEY=VALUE",
              help="Any other sbatch option (repeatable), e.g. --sbatch-arg reservation=r1.")
@click.option("--launcher", type=click.Choice(["srun", "torchrun"]), default=None,
              help="srun: one task per rank; torchrun: one task per node running torchrun [default: srun; torchrun "
                   "with --max-restarts or --nodes MIN:MAX].")
@click.option("--max-restarts", type=int, default=0, show_default=True, metavar="N",
              help="torchrun: after a worker fails, restart all workers in place (same job, same nodes) at most N "
                   "times; the script resumes from its checkpoint.")
@click.option("--folder", default=DEFAULT_ROOT, show_default=True,
              help=f"Jobs folder; the job gets {job_folder_name('<id>')}/.")
@click.option("--max-requeues", type=int, default=3, show_default=True,
              help="Requeue after preemption / time limit at most this many times.")
@click.option("--signal-delay", type=int, default=90, show_default=True,
              help="Send USR2 this many seconds before the time limit.")
@click.option("--interface", default=None,
              help="Network interface for NCCL and gloo [default: gloo the one routing to peers, NCCL its own].")
@click.option("-J", "--job-name", default="ddpslurm", show_default=True, help="Slurm job name.")
@click.option("--python", type=click.Path(), default=None, metavar="PATH",
              help="Interpreter every rank runs; checked for torch, submitit and ddpslurm before submitting and "
                   "again in the batch step [default: this ddpslurm's Python].")
@click.option("--master-port", type=int, default=None,
              help="MASTER_PORT for the job [default: 10000 + job id % 20000]; the shell's own is never used.")
@click.option("--hang-timeout", type=int, default=0, show_default=True, metavar="S",
              help="End the job when a rank makes no progress (collectives, ddpslurm.heartbeat()) for S seconds, "
                   "after dumping every rank's stacks into the job folder; 0: off.")
@click.option("--preflight", is_flag=True,
              help="Run `ddpslurm doctor`'s checks before the training step of every attempt.")
@click.option("--retries", type=int, default=0, show_default=True, metavar="N",
              help="When the job fails because of the infrastructure (analyze's retry: requeue; a failed "
                   "--preflight, a node, GPU or IB failure), submit it again excluding the blamed nodes, at most N "
                   "times; a bug in the script is never retried. Waits, like --wait.")
@click.option("--no-analyze", is_flag=True,
              help="No post-mortem at a failed job's end (diagnosis.json, diagnosis.md and the job's Slurm Comment).")
@click.option("--dry-run", is_flag=True, help="Print the sbatch script and the rank environment; submit nothing.")
@click.option("--wait", is_flag=True, help="Wait for the end; exit non-zero if the job failed.")
@click.option("--local", is_flag=True, help="No Slurm: run nodes x tasks-per-node ranks on this machine.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option("--lint", "lint_mode", type=click.Choice(["error", "warn", "off"]), default="warn", show_default=True,
              help="Run `ddpslurm lint` on SCRIPT first: warn prints its findings on stderr, error also refuses a "
                   "script with error-level findings, off skips it.")
def submit(script: str, script_args: tuple[str, ...], nodes: str, tasks_per_node: int | None,
           gpus_per_node: int | None, cpus_per_task: int | None, mem: str | None, partition: str | None,
           account: str | None, qos: str | None, time_limit: str, constraint: str | None, exclude: str | None,
           nodelist: str | None, sbatch_args: tuple[str, ...], launcher: str | None, max_restarts: int, folder: str,
           max_requeues: int,
           signal_delay: int, interface: str | None, job_name: str, python: str | None, master_port: int | None,
           hang_timeout: int, preflight: bool, retries: int, dry_run: bool, wait: bool, local: bool, as_json: bool,
           lint_mode: str, no_analyze: bool) -> None:
    """Submit a plain PyTorch DDP SCRIPT as a multi-node Slurm job (script arguments after `--`).

    \b
      ddpslurm submit train.py --nodes 2 --gpus-per-node 8 --time 4:00:00 -- --lr 0.1
      ddpslurm submit train.py -N 2 -p gpu -A proj123 -t 1-00:00:00 --python ~/venv/bin/python
      ddpslurm submit train.py --nodes 2 --dry-run
      ddpslurm submit train.py --nodes 1 --tasks-per-node 2 --local
    """
    if not dry_run:  # a dry run renders without submitit
        _require_launch_extra()
    from ddpslurm.launch.cli_glue import run_submit

    code = run_submit(
        dict(script=script, script_args=script_args, nodes=nodes, tasks_per_node=tasks_per_node,
             gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task, mem=mem, partition=partition,
             account=account, qos=qos, time=time_limit, constraint=constraint, exclude=exclude, nodelist=nodelist,
             sbatch_args=sbatch_args, launcher=launcher, folder=folder, max_requeues=max_requeues,
             signal_delay_s=signal_delay, interface=interface, local=local, job_name=job_name, python=python,
             master_port=master_port, hang_timeout_s=hang_timeout, preflight=preflight, analyze=not no_analyze,
             max_restarts=max_restarts),
        dry_run=dry_run, wait=wait, as_json=as_json, echo=click.echo, retries=retries, lint=lint_mode)
    if code:
        sys.exit(code)  # click.exceptions.Exit would be swallowed by standalone_mode=False


def _require_launch_extra() -> None:
    """`submit` builds and submits through submitit, which a plain `pip install ddpslurm` leaves out."""
    import importlib.util

    from ddpslurm.errors import SubmitError

    if importlib.util.find_spec("submitit") is None:
        raise SubmitError("submit needs submitit, which this installation lacks",
                          "pip install 'ddpslurm[launch]' (analyze, triage, status, template and submit --dry-run "
                          "work without it)")


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job")
@click.option("--wait", is_flag=True, help="Poll (1 s growing to 30 s) until the job ends; exit 3 if it failed.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def status(job: str, wait: bool, as_json: bool) -> None:
    """Show a job's state, its steps, exit codes, nodes and requeue count.

    JOB is a job id or a ddpslurm job folder (`.../job_<jobid>/`), also of a `submit --local` job (read from
    its folder; its id is looked up under ./ddpslurm_jobs). Exit status: 0 shown (with --wait: the job
    completed), 1 unknown job or no Slurm, 3 with --wait: the job ended in failure.
    """
    from collections.abc import Callable

    from ddpslurm.launch.local_status import local_job_folder, local_status, wait_local_job
    from ddpslurm.sanitize import json_dumps
    from ddpslurm.scheduler.status import JobStatus, exit_code_for, job_status, progress_line, render_text, wait_for_job

    local = local_job_folder(job)  # a `submit --local` job: its folder, not Slurm, knows its state

    def waited(on_update: Callable[[JobStatus], None]) -> JobStatus:
        return wait_local_job(local, on_update) if local else wait_for_job(job, on_update=on_update)

    if not wait:
        result = local_status(local) if local else job_status(job)
    elif as_json or not sys.stdout.isatty():
        last: list[str] = [""]

        def show_line(update: JobStatus) -> None:
            line = progress_line(update)
            if not as_json and line != last[-1]:
                click.echo(line)
            last.append(line)

        result = waited(show_line)
    else:
        from rich.live import Live
        from rich.text import Text

        with Live(Text("querying Slurm..."), refresh_per_second=4, transient=True) as live:
            result = waited(lambda s: live.update(Text(render_text(s))))
    from ddpslurm.launch.retries import chain_lines, chain_of_job
    from ddpslurm.postmortem.lookup import with_diagnosis

    result = result if local else with_diagnosis(result)  # a failed job's post-mortem: folder, else accounting
    chain = chain_of_job(result.job_id, result.folder)  # `submit --retries`: the whole chain this job is part of
    from ddpslurm.launch.restarts import first_summary, summary_line
    from ddpslurm.postmortem.lookup import job_folders

    # `submit --max-restarts`: torchrun's in-place restarts, from the job's folder (given, its StdOut's, or default)
    restarted = first_summary(job_folders(result.job_id, result.folder, result.stdout))
    if as_json:
        click.echo(json_dumps({**result.to_dict(), **({"retry_chain": chain} if chain else {}),
                               **({"restarts": restarted} if restarted else {})}))
    else:
        click.echo("\n".join([render_text(result), *([summary_line(restarted)] if restarted else []),
                              *(chain_lines(chain, terminal) if chain else [])]))
    code = exit_code_for(result, waited=wait)
    if code:
        sys.exit(code)



def _template_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of `ddpslurm template NAME`."""
    from ddpslurm.templates import TEMPLATES

    return [name for name in TEMPLATES if name.startswith(incomplete)]


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name", required=False, shell_complete=_template_names)
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--list", "list_only", is_flag=True, help="List the templates with a one-line description.")
@click.option("-N", "--nodes", type=int, default=None, help="Number of nodes.")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node, one rank each (0: no GPU request).")
@click.option("--tasks-per-node", "--ntasks-per-node", "tasks_per_node", type=int, default=None,
              help="Processes per node when no GPUs are used.")
@click.option("-c", "--cpus-per-task", type=int, default=None, help="CPU cores per task.")
@click.option("-p", "--partition", default=None, help="Partition(s), comma separated.")
@click.option("-A", "--account", default=None, help="Account to charge.")
@click.option("-q", "--qos", default=None, help="Quality of service.")
@click.option("--mem", default=None, help="Memory per node, e.g. 64G (0: all).")
@click.option("-t", "--time", "time_limit", default=None,
              help="Time limit as sbatch takes it: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S.")
@click.option("-J", "--job-name", default=None, help="Slurm job name.")
@click.option("--max-requeues", type=int, default=None, help="requeue: how often the job may requeue itself.")
@click.option("--signal-delay", type=int, default=None, help="requeue: seconds before the time limit for USR2.")
@click.option("--checkpoint-dir", default=None, help="requeue: folder for the per-job checkpoint folders.")
@click.option("--array", default=None, help="sweep: job-array indices, e.g. 0-7%2.")
@click.option("--script", default=None, help="Your training script (TRAIN_SCRIPT).")
@click.option("--python", default=None, help="Python interpreter with torch.")
@click.option("--log-dir", default=None, help="Folder for the per-job log folders.")
@click.option("--nccl-socket-ifname", default=None,
              help="GPU templates: NCCL_SOCKET_IFNAME, e.g. ib0 [default: unset, NCCL picks].")
@click.option("--nccl-ib-hca", default=None, help="GPU templates: NCCL_IB_HCA, e.g. mlx5 [default: unset, all active].")
@click.option("--gloo-socket-ifname", default=None, help="CPU templates: GLOO_SOCKET_IFNAME.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write to FILE, not stdout.")
@click.option("--regenerate", is_flag=True, help="Rewrite sbatch_templates/ (the golden files) in a source checkout.")
def template(name: str | None, train_args: tuple[str, ...], list_only: bool, output: str | None, regenerate: bool,
             time_limit: str | None, **values: object) -> None:
    """Print a standalone sbatch template filled with your site's values.

    \b
      ddpslurm template --list
      ddpslurm template srun-gpu --nodes 4 --gpus-per-node 8 --partition gpu --account p123 -o job.sbatch
      ddpslurm template requeue --time 1-00:00:00 --script train.py -- --lr 0.1 --data /scratch/set

    Arguments after `--` become TRAIN_ARGS. Options a template does not use are refused.
    """
    from pathlib import Path

    from ddpslurm import templates
    from ddpslurm.errors import UsageError

    if list_only or regenerate:
        if name:
            raise UsageError(f"--list and --regenerate take no template name (got {name!r})",
                             "drop the name, or drop --list/--regenerate")
        if regenerate:
            for path in templates.write_golden(templates.golden_folder()):
                click.echo(f"wrote {path}")
        else:
            for tname, description in templates.list_templates():
                click.echo(f"{tname:<14} {description}")
        return
    if not name:
        raise UsageError("no template name given", "run `ddpslurm template --list` and pick one")
    values["time"] = time_limit
    text = templates.render(name, {k: v for k, v in values.items() if v is not None}, train_args)
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as failed:
            raise TemplateError(f"cannot write {output!r}: {failed.strerror or failed}",
                                "Give -o a file in an existing folder you can write, or leave -o out to print "
                                "the script") from None
        click.echo(f"wrote {terminal(output)}: check it with `sbatch --test-only {terminal(output)}`", err=True)
    else:
        click.echo(text, nl=False)


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("inputs", nargs=-1, required=True, metavar="PATH_OR_JOBID...")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as one JSON object (same as --format json).")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default=None,
              help="Report format; markdown suits a support ticket.  [default: text]")
@click.option("--width", type=click.IntRange(20, 10_000), default=None, metavar="N",
              help="Wrap the text report at N columns [default: the terminal's; not wrapped in a pipe].")
@click.option("--signatures", "signature_dirs", multiple=True, metavar="DIR",
              help="Extra folder of *.toml failure signatures (also $DDPSLURM_SIGNATURES).")
@click.option("--attempt", default=None, metavar="N|all",
              help="Which attempt of a requeued job [default: the last]; `all`: every attempt and restart together.")
@click.option("--restart", default=None, metavar="K|all",
              help="Which in-place restart of the attempt (--max-restarts; 0: its first start) [default: the last, "
                   "the run that ended it]; `all`: all its restarts together.")
@click.option("--jobs", type=click.IntRange(1, MAX_ANALYZE_JOBS), default=None,
              help=f"Worker processes for large inputs, 1 to {MAX_ANALYZE_JOBS} [default: CPU count, at most 8].")
@click.option("--folder", "folders", multiple=True, metavar="ROOT", help="Where job folders are, for a JOBID.")
@click.option("--html", "html_file", default=None, metavar="FILE",
              help="Also write a self-contained HTML report (per-rank timeline, verdict, evidence) to FILE.")
def analyze(inputs: tuple[str, ...], as_json: bool, fmt: str | None, width: int | None,
            signature_dirs: tuple[str, ...], attempt: str | None, restart: str | None, jobs: int | None,
            folders: tuple[str, ...], html_file: str | None) -> None:
    """Tell why a multi-node job failed: the cause and the first failing rank.

    PATH is a job folder, a torchrun --log-dir, a folder of slurm-*.out files, or log files; `-` reads a
    log from standard input, and a pipe (`<(ssh n1 cat log)`) is read too; a JOBID (all digits) finds
    ./ddpslurm_jobs/job_<id> (or under --folder) and adds sacct's view. Exit 0 when a diagnosis was made
    (even `unknown`), 1 when the input cannot be read, 2 on a usage error.
    """
    from ddpslurm.analyze.command import output_format, run_analyze

    code = run_analyze(inputs, output=output_format(as_json, fmt, width), signature_dirs=signature_dirs,
                       attempt=attempt, restart=restart, jobs=jobs, folders=folders, echo=click.echo,
                       html_file=html_file, width=width)
    if code:
        sys.exit(code)


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("scripts", nargs=-1, metavar="SCRIPT...")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "sarif"]), default="text", show_default=True,
              help="text for people, json for scripts, sarif (2.1.0) for code-scanning tools.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--ignore", multiple=True, metavar="ID[,ID]", help="Skip these rules (repeatable).")
@click.option("--path", "roots", multiple=True, metavar="DIR",
              help="Also look for imported modules in DIR, as PYTHONPATH would (repeatable).")
@click.option("--list-rules", is_flag=True, help="Print every rule (id, level, name, message) and exit.")
def lint(scripts: tuple[str, ...], fmt: str, as_json: bool, ignore: tuple[str, ...], roots: tuple[str, ...],
         list_rules: bool) -> None:
    """Check DDP training scripts for the mistakes that fail on a cluster, before the job waits in the queue.

    \b
      ddpslurm lint train.py
      ddpslurm lint train.py --format sarif > lint.sarif
      ddpslurm lint --list-rules

    Reads SCRIPT and the modules it imports from its folder. Silence a finding with `# ddpslurm: ignore[DDP001]`
    on its line (`# ddpslurm: ignore` for all), a whole file with `# ddpslurm: ignore-file[DDP001]`. Exit 0: no
    error-level finding; 1: at least one; 2: usage error (missing file, not Python).
    """
    from ddpslurm.lint.command import run_lint
    from ddpslurm.lint.render import rules_table

    if list_rules:
        click.echo(rules_table(), nl=False)
        return
    code = run_lint(scripts, output="json" if as_json else fmt, ignore=ignore, roots=roots, echo=click.echo)
    if code:
        sys.exit(code)


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=False, metavar="PATH...")
@click.option("--since", default=None, metavar="DATE", help="Only jobs submitted at or after DATE (ISO, UTC); "
              "with --sacct any time sacct takes (default now-7days).")
@click.option("--sacct", "from_sacct", is_flag=True,
              help="Read no folder: the one-line diagnoses ddpslurm recorded in slurmdbd (Comment/AdminComment).")
@click.option("--user", default=None, help="With --sacct: only this user's jobs [default: every user's].")
@click.option("--csv", "csv_file", default=None, metavar="FILE", help="Also write one row per job to FILE (CSV).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: job_count, jobs (one row each), by_cause, nodes, drain.")
@click.option("--jobs", type=click.IntRange(1, MAX_ANALYZE_JOBS), default=None,
              help="Job folders analyzed at once [default: CPU count].")
@click.option("--no-sacct", is_flag=True, help="Do not ask sacct for each job's user and partition.")
def triage(paths: tuple[str, ...], since: str | None, csv_file: str | None, as_json: bool, jobs: int | None,
           no_sacct: bool, from_sacct: bool, user: str | None) -> None:
    """Analyze many failed jobs: which causes dominate, which nodes keep being blamed.

    PATH is a job folder, a Slurm output file (slurm-1234.out), or a folder of job folders such as
    ./ddpslurm_jobs. Prints the jobs (the 50 most recent), the jobs per cause, the node table (jobs run,
    jobs that blamed it, their causes; worst first) and a suggested drain list. A job that cannot be read
    is a row with cause `unknown` and the reason. A progress bar goes to stderr when it is a terminal.
    """
    from ddpslurm.errors import UsageError

    if from_sacct or user:
        if paths or not from_sacct or csv_file or no_sacct:
            raise UsageError("--sacct reads slurmdbd, not folders: it takes --since, --user and --json only",
                             "drop the PATHs (and --csv, --no-sacct), or drop --sacct")
        from ddpslurm.postmortem.sacct_triage import run_sacct_triage

        click.echo(run_sacct_triage(since=since, user=user, as_json=as_json))
        return
    if not paths:
        raise UsageError("no PATH given", "give job folders or Slurm output files, or --sacct to read slurmdbd")
    from ddpslurm.triage import run_triage

    click.echo(run_triage(paths, since=since, csv=csv_file, as_json=as_json, workers=jobs, accounting=not no_sacct,
                          progress=sys.stderr))


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--nodes", type=int, required=True, help="Number of nodes to check (one short job).")
@click.option("--partition", default=None, help="Slurm partition.")
@click.option("--account", default=None, help="Slurm account.")
@click.option("--qos", default=None, help="Slurm QOS.")
@click.option("--time", "time_limit", default="5", show_default=True, help="Time limit of the doctor's job.")
@click.option("--constraint", default=None, help="Node features (sbatch --constraint).")
@click.option("--exclude", default=None, help="Nodes to avoid, e.g. node[03-04].")
@click.option("-w", "--nodelist", default=None, help="Nodes to check, e.g. node[01-02] (sbatch --nodelist).")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="KEY=VALUE", help="Any other option (repeatable).")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs each node must show.")
@click.option("--interface", default=None, help="The interface NCCL/gloo will use [default: the one ddpslurm picks].")
@click.option("--master-port", type=int, default=None, help="Port to test [default: 10000 + job id % 20000].")
@click.option("--window", type=float, default=10.0, show_default=True,
              help="Seconds each node keeps trying to reach its peers.")
@click.option("--folder", default=DEFAULT_ROOT, show_default=True,
              help=f"Jobs folder; the records go to {job_folder_name('<id>')}/.")
@click.option("--json", "as_json", is_flag=True, help="Print {ok, checks, failing_nodes} as one JSON object.")
def doctor(nodes: int, time_limit: str, as_json: bool, **options: object) -> None:
    """Pre-flight checks on N nodes in seconds: links to the rank-0 host and between nodes, interface,
    name resolution, versions, GPUs, /dev/shm, disk, clock skew, master port.

    Exit status: 0 every check passed, 1 a check failed (the nodes are named) or the checks could not
    run, 2 usage error. `ddpslurm analyze` reads the records in the job folder too.
    """
    from ddpslurm.doctor.command import run_doctor

    code = run_doctor(dict(options, nodes=nodes, time=time_limit), as_json=as_json, echo=click.echo)
    if code:
        sys.exit(code)


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id", required=False)
@click.option("--log", "log_file", default=None, metavar="FILE", help="Append one JSON line per job [default: stderr].")
@click.option("--budget", type=click.FloatRange(1, 3600), default=60, show_default=True, metavar="S",
              help="Seconds the analysis of one job may take, reading included.")
@click.option("--max-bytes", type=click.IntRange(4096, None), default=32 * 1024 * 1024, show_default=True,
              help="Bytes read of each output file: the whole file, or its head and tail.")
@click.option("--store", default=None, metavar="DIR", help="Also write DIR/<jobid>.json (the full diagnosis).")
@click.option("--no-record", is_flag=True, help="Do not put the diagnosis on the job's accounting record.")
@click.option("--foreground", is_flag=True, help="Analyze now, in this process (the hook itself detaches).")
def epilog(job_id: str | None, log_file: str | None, budget: float, max_bytes: int, store: str | None,
           no_record: bool, foreground: bool) -> None:
    """Site hook: diagnose a failed job from its StdOut/StdErr and record it in Slurm's accounting.

    \b
      slurm.conf:  EpilogSlurmctld=/etc/slurm/ddpslurm-epilog   (a script: exec ddpslurm epilog --log FILE)
      per job:     strigger --set --jobid 1234 --fini --program /etc/slurm/ddpslurm-epilog

    JOB_ID (strigger passes it) defaults to $SLURM_JOB_ID. A job that succeeded costs nothing; for a failed one
    the hook detaches and returns at once. Always exits 0: failures go to the log.
    """
    from ddpslurm.postmortem.epilog import run_epilog

    run_epilog(job_id, environ=os.environ, log=log_file, foreground=foreground, budget_s=budget,
               max_bytes=max_bytes, store=store, record=not no_record)


@cli.command(context_settings={"help_option_names": ["-h", "--help"], "ignore_unknown_options": True})
@click.option("--deliver", default="/usr/bin/mail", show_default=True, metavar="PROG",
              help="The real mail program, run as `PROG -s SUBJECT RECIPIENT...` with the body on stdin.")
@click.option("--wait", type=click.FloatRange(0, 90), default=60, show_default=True, metavar="S",
              help="Seconds to wait for the site epilog's diagnosis when the job's Comment holds none.")
@click.option("--log", "log_file", default=None, metavar="FILE", help="Append one JSON line per mail.")
@click.argument("mail_args", nargs=-1, type=click.UNPROCESSED)
def mailprog(deliver: str, wait: float, log_file: str | None, mail_args: tuple[str, ...]) -> None:
    """Site hook: slurm.conf's MailProg that adds the diagnosis to a failed job's mail, then hands it on.

    \b
      slurm.conf:  MailProg=/etc/slurm/ddpslurm-mail
      the script:  exec ddpslurm mailprog --deliver /usr/bin/mail --log FILE -- "$@"

    slurmctld calls it as `MailProg -s SUBJECT USER`. The mail always goes out (unchanged when anything here
    fails); the exit status is the mail program's.
    """
    from ddpslurm.postmortem.mail import run_mailprog

    sys.exit(run_mailprog(list(mail_args), _bounded_stdin(), environ=os.environ, program=[deliver], wait_s=wait,
                          log=log_file))


def _bounded_stdin(limit: int = 1 << 20, wait_s: float = 1.0) -> str:
    """What a caller pipes in (a mail body), at most `limit` bytes and only what arrives within `wait_s`;
    nothing from a terminal."""
    import select

    try:
        if sys.stdin is None or sys.stdin.isatty():
            return ""
        fd = sys.stdin.fileno()
        chunks: list[bytes] = []
        size = 0
        while size < limit and select.select([fd], [], [], wait_s)[0]:
            chunk = os.read(fd, min(65536, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def _debug_requested(argv: list[str]) -> bool:
    """`--debug` may come before the subcommand only; look for it without parsing everything."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--debug":
            return True
    return False


def _error_line(text: str) -> None:
    """One line on stderr, whatever the text holds (own arguments may carry escapes or newlines)."""
    click.echo(terminal(text), err=True)


def _show_usage_error(usage: click.ClickException) -> None:
    """click's usage message, with the arguments it quotes made terminal-safe."""
    buffer = io.StringIO()
    usage.show(file=buffer)
    click.echo(terminal(buffer.getvalue(), single_line=False), err=True, nl=False)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and map every known failure to one line + exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(args)
    _tolerant_streams()
    try:
        cli.main(args=args, prog_name="ddpslurm", standalone_mode=False)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not as Python's message at exit
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.Abort:
        _error_line("ddpslurm: aborted.")
        sys.exit(130)
    except click.ClickException as usage:
        _show_usage_error(usage)
        sys.exit(usage.exit_code)
    except DdpSlurmError as error:
        if debug:
            raise
        _error_line(f"ddpslurm: error: {error.one_line()}")
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        _error_line("ddpslurm: interrupted.")
        sys.exit(130)
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(1)
    except OSError as failed:
        if debug or failed.errno not in (errno.ENOSPC, errno.EDQUOT):
            _internal_error(failed, debug)
        _quiet_stdout()
        _error_line(f"ddpslurm: error: cannot write: {failed.strerror}. Free some space, or write elsewhere")
        sys.exit(1)
    except Exception as unexpected:
        _internal_error(unexpected, debug)


def _internal_error(unexpected: Exception, debug: bool) -> None:
    """A bug of ddpslurm's own: one line and exit 1, or the traceback with --debug."""
    if debug:
        raise unexpected
    _error_line(f"ddpslurm: internal error: {type(unexpected).__name__}: {unexpected}. "
                "Rerun with `ddpslurm --debug ...` for the traceback and report it.")
    sys.exit(1)


def _tolerant_streams() -> None:
    """A character the terminal's encoding lacks (an ASCII locale) is written as `\\xNN`, never a crash."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main()
