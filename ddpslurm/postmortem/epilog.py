"""`ddpslurm epilog`: the site hook that diagnoses a failed job ddpslurm did not launch, from its StdOut/StdErr.

Run as slurm.conf's `EpilogSlurmctld` (by slurmctld, as SlurmUser, at every job's end, with the job's facts in
SLURM_JOB_* variables) or by `strigger --set --jobid J --fini --program PATH` (with the job id as argument:
the facts then come from `scontrol show job`). A job that succeeded costs one look at the environment. For a
failed one the hook starts a detached copy of itself (`--foreground`) and returns at once: slurmctld never
waits on an analysis. That copy reads the job's two output files within a size budget (`job_output`), analyzes
them within a time budget, and puts the one-line diagnosis on the job's accounting record (`record`). Every
outcome is one JSON line in the log; nothing is raised.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpslurm.postmortem.analysis import run_analysis
from ddpslurm.postmortem.comment import MARK, diagnosis_line
from ddpslurm.postmortem.job_output import DEFAULT_MAX_BYTES, JobFacts, copy_as_user, facts_from_env, output_paths

#: Seconds the detached analysis of one job may take, all in.
DEFAULT_BUDGET_S = 60.0


def log_line(log: str | None, record: Mapping[str, Any]) -> None:
    """One JSON line appended to `log` (stderr when None); a log that cannot be written is given up quietly."""
    text = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}, default=str)
    try:
        if log:
            with open(log, "a", encoding="utf-8") as out:
                out.write(text + "\n")
        else:
            print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


def job_facts(job_id: str | None, environ: Mapping[str, str]) -> JobFacts | None:
    """The finished job's facts: EpilogSlurmctld's variables, else (strigger) `scontrol show job` and squeue."""
    from_env = facts_from_env(environ)
    if from_env is not None and (job_id is None or from_env.job_id == job_id):
        return from_env
    if job_id is None:
        return None
    from ddpslurm.postmortem.job_output import facts_from_scontrol
    from ddpslurm.scheduler.commands import scontrol_show_job_argv
    from ddpslurm.scheduler.parse import parse_scontrol_show
    from ddpslurm.scheduler.run import run

    records = parse_scontrol_show(run(scontrol_show_job_argv(job_id), timeout=30).stdout)
    return facts_from_scontrol(job_id, records[0]) if records else None


def detach(argv: list[str], log: str | None) -> int:
    """Start `ddpslurm epilog --foreground ...` in a session of its own and return its pid."""
    from ddpslurm.scheduler.run import spawn_detached

    return spawn_detached([sys.executable, "-m", "ddpslurm.cli", "epilog", "--foreground", *argv], log_path=log)


def run_epilog(job_id: str | None, *, environ: Mapping[str, str], log: str | None, foreground: bool,
               budget_s: float = DEFAULT_BUDGET_S, max_bytes: int = DEFAULT_MAX_BYTES, store: str | None = None,
               record: bool = True) -> int:
    """The hook; always returns 0 (its failures are logged, a site's slurmctld must never see one)."""
    started = time.monotonic()
    try:
        facts = job_facts(job_id, environ)
        if facts is None:
            log_line(log, {"outcome": "skipped", "why": "no job: neither SLURM_JOB_ID nor a job id argument"})
            return 0
        if not facts.failed:
            return 0  # the common case: nothing is started, nothing logged
        if MARK in facts.comment:
            log_line(log, {"job_id": facts.job_id, "outcome": "skipped", "why": "already diagnosed (Comment)"})
            return 0
        if not foreground:
            argv = [facts.job_id, "--budget", str(budget_s), "--max-bytes", str(max_bytes)]
            argv += (["--store", store] if store else []) + ([] if record else ["--no-record"])
            argv += ["--log", log] if log else []
            pid = detach(argv, log)
            log_line(log, {"job_id": facts.job_id, "outcome": "detached", "pid": pid})
            return 0
        result = diagnose_job(facts, budget_s=budget_s, max_bytes=max_bytes, record=record, store=store)
        log_line(log, {"job_id": facts.job_id, **result, "seconds": round(time.monotonic() - started, 2)})
    except Exception as error:  # logged, never raised: slurmctld must not see the hook fail
        log_line(log, {"job_id": job_id or environ.get("SLURM_JOB_ID"), "outcome": "error",
                       "why": f"{type(error).__name__}: {error}"})
    return 0


def diagnose_job(facts: JobFacts, *, budget_s: float, max_bytes: int, record: bool,
                 store: str | None) -> dict[str, Any]:
    """Read the job's outputs, analyze them, record the line; what happened, for the log."""
    started = time.monotonic()
    paths = output_paths(facts)
    if not paths:
        return {"outcome": "skipped", "why": "the job's StdOut and StdErr are /dev/null or unset"}
    work = Path(tempfile.mkdtemp(prefix=f"ddpslurm-epilog-{facts.job_id}-"))
    try:
        copied = copy_as_user(paths, work, max_bytes, facts.uid, facts.gid, timeout_s=budget_s / 2, user=facts.user)
        readable = [c for c in copied if "copy" in c]
        files = [{k: c.get(k) for k in ("path", "size", "whole", "error") if k in c} for c in copied]
        if not readable:
            return {"outcome": "unreadable", "files": files}
        left = budget_s - (time.monotonic() - started)
        out_dir = work / "out"
        out_dir.mkdir()
        outcome = run_analysis([c["copy"] for c in readable], out_dir, left)
        if outcome.diagnosis is None:
            return {"outcome": "no diagnosis", "why": outcome.why_not, "files": files}
        diagnosis = single_node(_original_paths(outcome.diagnosis, readable), facts.nodelist)
        line = diagnosis_line(diagnosis, str(paths[0]))
        result: dict[str, Any] = {"outcome": "diagnosed", "line": line, "files": files}
        if store:
            _store(Path(store), facts.job_id, diagnosis, files)
        if record:
            result["recorded"] = _record(facts, line)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def single_node(diagnosis: dict[str, Any], nodelist: str) -> dict[str, Any]:
    """The diagnosis with its host filled in from a job that ran on one node only, when the logs did not name one
    (a plain job's output seldom carries a host name); unchanged otherwise. Pure."""
    if diagnosis.get("first_failing_host") or diagnosis.get("cause") in (None, "none"):
        return diagnosis
    from ddpslurm.scheduler.hostlist import expand_hostlist

    try:
        nodes = expand_hostlist(nodelist) if nodelist else []
    except Exception:  # a nodelist ddpslurm cannot expand: no host
        return diagnosis
    if len(nodes) != 1:
        return diagnosis
    notes = [*diagnosis.get("notes", []), f"host {nodes[0]}: the only node of the job (Slurm's NodeList)"]
    return {**diagnosis, "first_failing_host": nodes[0], "notes": notes}


def _original_paths(diagnosis: dict[str, Any], copied: list[dict[str, Any]]) -> dict[str, Any]:
    """The diagnosis with every copy's path put back to the job's own file (the JSON text, so every field)."""
    text = json.dumps(diagnosis)
    for c in copied:
        text = text.replace(json.dumps(c["copy"])[1:-1], json.dumps(c["path"])[1:-1])
    return json.loads(text)


def _store(folder: Path, job_id: str, diagnosis: dict[str, Any], files: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{job_id}.json"
    tmp = folder / f".{job_id}.json.{os.getpid()}"
    tmp.write_text(json.dumps({**diagnosis, "epilog_files": files}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def _record(facts: JobFacts, line: str) -> dict[str, Any]:
    from ddpslurm.postmortem.record import record_finished

    return record_finished(facts.job_id, line, facts.comment, admin=os.geteuid() == 0)
