"""`ddpslurm triage`: many failed jobs -> one table (pandas) of causes and of the nodes that keep being blamed.

Each job folder is analyzed on its own (in parallel, one process per core); a folder that cannot be read
becomes a row with cause `unknown` and the reason, never a crash. pandas is imported here only, lazily,
so the CLI starts without it; a plain `pip install ddpslurm` has none, and triage says which extra brings it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from ddpslurm import jobfolder, sanitize
from ddpslurm.errors import AnalyzeInputError, DdpSlurmError, UsageError

#: files whose presence makes a folder a job's folder (else its sub-folders are the jobs)
LOG_SUFFIXES = (".out", ".err", ".log", ".txt", ".json")
#: causes that point at a node, not at the job: one such blame is enough to suggest draining the node
NODE_CAUSES = frozenset({"gpu_hardware", "infiniband_error", "node_failure"})
#: sacct fields triage asks for (the job's own line: JobIDRaw without a step suffix)
SACCT_FIELDS = ("JobIDRaw", "User", "Partition", "NodeList")
COLUMNS = ("job", "path", "job_id", "array_task", "cause", "first_failing_rank", "first_failing_host", "confidence",
           "retry", "exclude_nodes", "nodes", "submitted", "first_failure", "last_seen", "user", "partition", "reason")
_JOB_ID_IN_NAME = re.compile(r"(?:^|_)(\d+)$")
#: a plain Slurm output file (sbatch's default `slurm-%j.out`, `slurm-%A_%a.out` for an array task)
_SLURM_OUTPUT = re.compile(r"^slurm-(\d+)(?:_(\d+))?\.(?:out|err|log)$")
#: jobs listed one per line in the text report (most recent first); the rest are in --json and --csv
MAX_JOB_LINES = 50


def parse_since(text: str | None) -> float | None:
    """`--since` as unix seconds: an ISO date or date-time (naive = UTC); a clear error otherwise."""
    if text is None:
        return None
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since {text!r} is not a date",
                         "use --since 2026-11-20 or --since 2026-11-20T08:00") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def is_job_folder(folder: Path) -> bool:
    """A folder holding log files or `attempt_N/` itself, not only other folders."""
    for entry in folder.iterdir():
        if entry.is_file() and entry.suffix in LOG_SUFFIXES:
            return True
        if entry.is_dir() and entry.name.startswith(jobfolder.ATTEMPT_PREFIX):
            return True
    return False


def job_folders(paths: Iterable[str | Path]) -> list[Path]:
    """The jobs under PATHs: a job folder or log file as is; a folder of job folders -> its sub-folders;
    a folder of several jobs' Slurm output files (sbatch's working directory) -> those files.

    A path that does not exist or cannot be listed is kept: its row will say why.
    """
    jobs: list[Path] = []
    for path in map(Path, paths):
        try:
            if path.is_dir() and not is_job_folder(path):
                jobs.extend(sorted(p for p in path.iterdir() if p.is_dir()))
                continue
            if path.is_dir() and (outputs := slurm_outputs(path)):
                jobs.extend(outputs)
                continue
        except OSError:
            pass
        jobs.append(path)
    return list(dict.fromkeys(jobs))


def slurm_outputs(folder: Path) -> list[Path]:
    """The `slurm-<id>[_<task>].out` files of a folder that is not a ddpslurm job folder, when they are of two
    or more jobs (one row each); else [] (the folder is one job)."""
    if jobfolder.job_record_path(folder).is_file():
        return []
    found = {p: m.groups() for p in folder.iterdir() if p.suffix == ".out" and (m := _SLURM_OUTPUT.match(p.name))}
    outputs = sorted(found, key=lambda p: (int(found[p][0]), int(found[p][1] or -1)))
    return outputs if len(outputs) > 1 else []


def submit_record(folder: Path) -> dict[str, Any]:
    """ddpslurm.json of a ddpslurm job folder (plain JSON, never code), or {}."""
    try:
        record = json.loads(jobfolder.job_record_path(folder).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def job_time(folder: Path) -> float | None:
    """When the job was submitted (ddpslurm.json), else the folder's modification time."""
    submitted = submit_record(folder).get("submit_unix")
    if isinstance(submitted, (int, float)):
        return float(submitted)
    try:
        return folder.stat().st_mtime
    except OSError:
        return None


def job_ids(folder: Path, record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(Slurm job id, array task): ddpslurm.json's id, else a Slurm output file's name (`slurm-771204_3.out`
    -> 771204, task 3), else a trailing number of the folder name (`job_1234`), else the Slurm output files
    in the folder when they all name one job."""
    job_id = str(record.get("job_id") or "")
    if job_id.isdigit():
        return job_id, None
    if match := _SLURM_OUTPUT.match(folder.name):
        return match.group(1), match.group(2)
    if match := _JOB_ID_IN_NAME.search(folder.name):
        return match.group(1), None
    try:
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    except OSError:
        return None, None
    found = {m.groups() for name in names if (m := _SLURM_OUTPUT.match(name))}
    return found.pop() if len(found) == 1 else (None, None)


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def empty_row(folder: Path) -> dict[str, Any]:
    """A row with only what the folder itself says (name, job id, partition, submit time)."""
    record = submit_record(folder) if folder.is_dir() else {}
    spec = record.get("spec") if isinstance(record.get("spec"), dict) else {}
    submitted = record.get("submit_unix")
    job_id, task = job_ids(folder, record)
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(job=folder.name, path=str(folder), job_id=job_id, array_task=task, cause="unknown",
               exclude_nodes=[], nodes=[], partition=spec.get("partition"), reason="",
               submitted=_iso(float(submitted)) if isinstance(submitted, (int, float)) else None)
    return row


def diagnosis_row(folder: Path, diagnosis: Any) -> dict[str, Any]:
    """One job's row from its Diagnosis: verdict, nodes seen, time of the first failure line and of the last line (a
    failure the timeline places by the line before it, which has no time of its own, gives no failure time)."""
    from ddpslurm.analyze.report.html_timeline import rank_marks
    from ddpslurm.analyze.report.timeline_rows import FAILURE_LINE_TIMES

    row = empty_row(folder)
    marks = rank_marks(diagnosis)
    hosts = [m.host for m in marks if m.host != "?"] + list(diagnosis.exclude_nodes)
    failures = [m.time for m in marks if m.time is not None and m.placed in FAILURE_LINE_TIMES]
    seen = [m.last_time for m in marks if m.last_time is not None] + failures
    row.update(cause=diagnosis.cause, first_failing_rank=diagnosis.first_failing_rank,
               first_failing_host=diagnosis.first_failing_host, confidence=diagnosis.confidence,
               retry=diagnosis.retry, exclude_nodes=list(diagnosis.exclude_nodes),
               nodes=sorted(set(hosts)), first_failure=_iso(min(failures)) if failures else None,
               last_seen=_iso(max(seen)) if seen else None)
    return row


def analyze_job(folder: Path) -> dict[str, Any]:
    """Analyze one job (in a worker process); any failure becomes a row with cause `unknown` and the reason."""
    from ddpslurm.analyze.api import analyze_paths

    try:
        return diagnosis_row(folder, analyze_paths([folder], workers=1))
    except DdpSlurmError as error:
        reason = error.one_line()
    except OSError as error:
        reason = f"cannot read {folder}: {error.strerror or error}"
    except Exception as error:  # one broken job must not end the fleet report
        reason = f"analysis failed: {type(error).__name__}: {error}"
    if _listable(folder):
        row = empty_row(folder)
    else:
        job_id, task = job_ids(folder, {})
        row = {**dict.fromkeys(COLUMNS), "job": folder.name, "path": str(folder), "job_id": job_id,
               "array_task": task, "cause": "unknown", "exclude_nodes": [], "nodes": []}
    row["reason"] = sanitize.terminal(reason)
    return row


def _listable(folder: Path) -> bool:
    try:
        return folder.is_dir() and os.access(folder, os.R_OK | os.X_OK)
    except OSError:
        return False


def analyze_jobs(folders: Sequence[Path], workers: int | None = None,
                 advance: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Rows for all jobs, in the order given, analyzed by up to `workers` processes (default: CPU count);
    `advance` is called once per job done."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(folders)))
    rows: list[dict[str, Any]] = []
    results: Iterable[dict[str, Any]]
    with contextlib.ExitStack() as stack:
        if workers == 1:
            results = map(analyze_job, folders)
        else:
            results = stack.enter_context(ProcessPoolExecutor(max_workers=workers)).map(analyze_job, folders,
                                                                                        chunksize=1)
        for result in results:
            rows.append(result)
            if advance is not None:
                advance()
    return rows


@contextlib.contextmanager
def progress_bar(total: int, stream: TextIO | None) -> Iterator[Callable[[], None] | None]:
    """A transient bar of jobs analyzed on `stream` (stderr) when it is a terminal and there are several jobs;
    else None: nothing is written to a pipe or a file."""
    if stream is None or total < 2 or not stream.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress("triage: analyzing jobs", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(file=stream), transient=True) as bar:
        task = bar.add_task("triage", total=total)
        yield lambda: bar.advance(task)


def parse_sacct_users(text: str) -> dict[str, dict[str, Any]]:
    """`sacct --parsable2` lines of SACCT_FIELDS -> {job id: {user, partition, nodes}}; step lines ignored."""
    from ddpslurm.scheduler.hostlist import expand_hostlist

    found: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS) or not parts[0].isdigit():
            continue
        try:
            nodes = expand_hostlist(parts[3]) if parts[3] not in ("", "None assigned") else []
        except DdpSlurmError:
            nodes = []
        found[parts[0]] = {"user": parts[1] or None, "partition": parts[2] or None, "nodes": nodes}
    return found


def add_accounting(rows: list[dict[str, Any]], environ: Mapping[str, str] | None = None) -> None:
    """User and partition from sacct, where Slurm is reachable; a job id sacct knows for other nodes
    (another cluster's job with the same number) is left alone."""
    from ddpslurm.scheduler.commands import sacct_argv
    from ddpslurm.scheduler.run import run

    ids = sorted({row["job_id"] for row in rows if row.get("job_id")})
    if not ids:
        return
    try:
        done = run(sacct_argv(ids, fields=SACCT_FIELDS, duplicates=False), env=environ, timeout=30, check=False)
    except DdpSlurmError:
        return
    merge_accounting(rows, parse_sacct_users(done.stdout) if done.returncode == 0 else {})


def merge_accounting(rows: list[dict[str, Any]], known: Mapping[str, Mapping[str, Any]]) -> None:
    """Copy user and partition into the rows whose job sacct knows, unless sacct's nodes share none with
    the logs' nodes (the same job number on another cluster)."""
    for row in rows:
        info = known.get(row.get("job_id") or "")
        if info is None or (row["nodes"] and info["nodes"] and not set(row["nodes"]) & set(info["nodes"])):
            continue
        row["user"] = info["user"]
        row["partition"] = info["partition"] or row.get("partition")


#: the one-line answer to a triage where pandas is missing (a plain `pip install ddpslurm`)
PANDAS_HINT = "pip install 'ddpslurm[triage]' (analyze, status, template and submit work without it)"


def require_pandas() -> None:
    """Refuse, in one line naming the pip command, where pandas cannot be found (before any job is analyzed)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("pandas") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise DdpSlurmError("triage needs pandas, which this installation lacks", PANDAS_HINT)


def frame(rows: Sequence[Mapping[str, Any]]):
    """The rows as a pandas DataFrame, one row per job, in COLUMNS order."""
    import pandas as pd

    return pd.DataFrame(list(rows), columns=list(COLUMNS))


def cause_counts(table) -> dict[str, int]:
    """Jobs per cause, most frequent first (ties by name)."""
    counts = table["cause"].value_counts()
    return {str(k): int(v) for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}


def blamed_nodes(row: Mapping[str, Any]) -> list[str]:
    """The nodes a job blames: its first failing host and the nodes it says to exclude."""
    return sorted({n for n in [row.get("first_failing_host"), *(row.get("exclude_nodes") or [])] if n})


def node_table(table):
    """One row per node: jobs run there, jobs that blamed it, the causes of those; worst first."""
    import pandas as pd

    ran = table[["job", "nodes"]].explode("nodes").dropna()
    jobs = ran.groupby("nodes")["job"].nunique()
    blame = table.assign(blamed=table.apply(blamed_nodes, axis=1))[["job", "cause", "blamed"]].explode("blamed")
    blame = blame.dropna(subset=["blamed"])
    blamed = blame.groupby("blamed")["job"].nunique()
    causes = blame.groupby("blamed")["cause"].agg(lambda c: dict(sorted(c.value_counts().items(),
                                                                        key=lambda kv: (-kv[1], kv[0]))))
    nodes = sorted(set(jobs.index) | set(blamed.index))
    out = pd.DataFrame({"node": nodes, "jobs": [int(jobs.get(n, 0)) for n in nodes],
                        "blamed": [int(blamed.get(n, 0)) for n in nodes],
                        "causes": [causes.get(n, {}) for n in nodes]})
    out["jobs"] = out[["jobs", "blamed"]].max(axis=1)  # a node blamed by a job ran that job
    return out.sort_values(["blamed", "jobs", "node"], ascending=[False, False, True], ignore_index=True)


def drain_list(table, nodes) -> list[str]:
    """Nodes worth draining: named in some job's exclude_nodes, or blamed for a node-level cause by a job whose
    diagnosis does not say it fails the same way on resubmission (`retry: stop`: a set-up fault such as an IB
    completion with status 4, analyzer/ib_status.toml, which the next node with the same set-up repeats)."""
    excluded = {n for names in table["exclude_nodes"] for n in names or []}
    node_level = {n for cause, retry, row in zip(table["cause"], table["retry"], table.to_dict("records"),
                                                 strict=True)
                  if cause in NODE_CAUSES and retry != "stop" for n in blamed_nodes(row)}
    return [n for n in nodes["node"] if n in excluded | node_level]


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The `--json` object: {"job_count", "jobs" (one row per job), "by_cause", "nodes", "drain", "rows"};
    `rows` is the same list as `jobs`, kept for scripts written before `jobs` held the rows (deprecated)."""
    table = frame(rows)
    nodes = node_table(table) if len(table) else frame([]).iloc[0:0]
    node_rows = [] if not len(table) else [
        {"node": r.node, "jobs": int(r.jobs), "blamed": int(r.blamed), "causes": dict(r.causes)}
        for r in nodes.itertuples()]
    jobs = [dict(r) for r in rows]
    return {"job_count": len(jobs), "jobs": jobs, "by_cause": cause_counts(table) if len(table) else {},
            "nodes": node_rows, "drain": drain_list(table, nodes) if len(table) else [], "rows": jobs}


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """The rows as CSV, lists joined by spaces; one line per job."""
    table = frame(rows)
    for column in ("exclude_nodes", "nodes"):
        table[column] = table[column].map(lambda names: " ".join(names or []))
    # pandas makes an int column with a missing value float (11.0): write whole numbers, empty when missing
    table["first_failing_rank"] = table["first_failing_rank"].map(_whole)
    try:
        table.to_csv(path, index=False)
    except OSError as failed:
        raise DdpSlurmError(f"cannot write the CSV {str(path)!r}: {failed.strerror or failed}",
                            "give --csv a file in an existing folder you can write") from None


def _whole(value: object) -> str:
    """A rank for the CSV: `11`, never `11.0` (pandas makes an int column with a gap float); empty if missing."""
    if value is None or value != value:  # None or NaN
        return ""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def render_text(result: Mapping[str, Any], max_nodes: int = 20) -> str:
    """Counts by cause, the jobs (most recent first), the node table (worst first) and the suggested drain
    list, terminal-safe."""
    rows = result["jobs"]
    unreadable = sum(1 for r in rows if r.get("reason"))
    lines = [f"{result['job_count']} job(s) analyzed" + (f", {unreadable} could not be read" if unreadable else "")]
    lines += ["", *job_lines(rows), "", "cause                       jobs"]
    lines += [f"{sanitize.terminal(c):<27} {n:>4}" for c, n in result["by_cause"].items()]
    lines += ["", f"{'node':<24} {'jobs':>4} {'blamed':>6}  causes (of the jobs that blamed it)"]
    for node in result["nodes"][:max_nodes]:
        causes = ", ".join(f"{sanitize.terminal(c)} x{n}" for c, n in node["causes"].items()) or "-"
        lines.append(f"{sanitize.terminal(node['node']):<24} {node['jobs']:>4} {node['blamed']:>6}  {causes}")
    if len(result["nodes"]) > max_nodes:
        lines.append(f"... {len(result['nodes']) - max_nodes} more node(s): see --json or --csv")
    drain = " ".join(sanitize.terminal(n) for n in result["drain"])
    lines += ["", f"suggested drain list: {drain}" if drain else "suggested drain list: none (no node-level cause)"]
    for row in rows:
        if row.get("reason"):
            lines.append(f"unreadable: {sanitize.terminal(row['path'])}: {sanitize.terminal(row['reason'])}")
    return "\n".join(lines)


def _recency(row: Mapping[str, Any]) -> tuple[str, int]:
    """Sort key, most recent last: submit time, else the last log line's, else the first failure's; then job id."""
    when = row.get("submitted") or row.get("last_seen") or row.get("first_failure") or ""
    job_id = str(row.get("job_id") or "")
    return str(when), int(job_id) if job_id.isdigit() else -1


def job_lines(rows: Sequence[Mapping[str, Any]], limit: int = MAX_JOB_LINES) -> list[str]:
    """One line per job (job id, cause, first failing rank and host, confidence, folder), the `limit` most
    recent first, then how many more there are; every field terminal-safe."""
    def cell(value: object) -> str:
        return "-" if value is None or value == "" else sanitize.terminal(value)

    lines = [f"{'job id':<14} {'cause':<27} {'rank':>6}  {'host':<20} {'confidence':<10}  folder"]
    for row in sorted(rows, key=_recency, reverse=True)[:limit]:
        job_id = cell(row.get("job_id")) + (f"_{cell(row['array_task'])}" if row.get("array_task") else "")
        lines.append(f"{job_id:<14} {cell(row.get('cause')):<27} {cell(row.get('first_failing_rank')):>6}  "
                     f"{cell(row.get('first_failing_host')):<20} {cell(row.get('confidence')):<10}  "
                     f"{cell(row.get('path'))}")
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more job(s): see --json or --csv")
    return lines


def run_triage(paths: Sequence[str], *, since: str | None = None, csv: str | None = None, as_json: bool = False,
               workers: int | None = None, accounting: bool = True, progress: TextIO | None = None) -> str:
    """What `ddpslurm triage` prints: analyze every job under `paths` (newer than `since`), write the CSV;
    a progress bar goes to `progress` (stderr) when it is a terminal."""
    require_pandas()
    after = parse_since(since)
    folders = job_folders(paths)
    if not folders:
        raise AnalyzeInputError(f"no job folders under {', '.join(map(str, paths))}",
                                f"give job folders, or a folder of job folders such as ./{jobfolder.DEFAULT_ROOT}")
    if after is not None:
        folders = [f for f in folders if (t := job_time(f)) is None or t >= after]
    with progress_bar(len(folders), progress) as advance:
        rows = analyze_jobs(folders, workers, advance)
    if accounting:
        add_accounting(rows)
    if csv:
        write_csv(rows, csv)
    result = summary(rows)
    return sanitize.json_dumps(result) if as_json else render_text(result)
