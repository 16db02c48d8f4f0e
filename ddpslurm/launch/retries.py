"""`ddpslurm submit --retries N`: after a failed job, read its post-mortem; when it blames the infrastructure
(analyze's `retry` is "requeue": a failed pre-flight, a node failure, a GPU or IB fault...), submit the same job
again with the blamed nodes added to `--exclude`, at most N times. A bug in the script (an exception, an OOM,
unused parameters: `retry` "stop") or a cause analyze cannot judge (`retry` "unknown") is never retried, and
one root cause (its fingerprint: cause and node, or cause and script) is resubmitted until it has ended
`same_root.SAME_ROOT_BUDGET` jobs with no training progress between them (`ddpslurm.launch.same_root`).
Why the chain stopped is its record's `stop` ({reason, text, fingerprint, repeats, budget}).

The chain of attempts is written as `retries.json` into the folder of every job of the chain, so that
`ddpslurm status <any of its job ids>` shows the whole chain. Deciding and merging are pure functions; the
loop that submits, waits and analyzes lives in `run_chain`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.errors import DdpSlurmError, EnvDerivationError
from ddpslurm.launch import same_root
from ddpslurm.scheduler.hostlist import compress_hostlist, expand_hostlist

#: Causes the job survives by requeueing itself (USR2, preemption; `--max-requeues`): a new job would only
#: double that budget, so the chain leaves them to it.
REQUEUED_IN_PLACE = frozenset({"slurm_time_limit", "preempted"})


@dataclass(frozen=True)
class Attempt:
    """One job of a retry chain: where it ran, how it ended, what analyze said, what the chain did next."""

    job_id: str
    folder: str
    nodes: tuple[str, ...]
    state: str
    cause: str | None = None
    retry: str | None = None
    exclude_nodes: tuple[str, ...] = ()
    summary: str = ""
    decision: str = ""  # "completed", "resubmitted", or why the chain stopped here
    excluded: tuple[str, ...] = field(default=())  # the --exclude this job was submitted with
    fingerprint: str | None = None  # same_root.fingerprint: the root cause and the entity it lives on
    progress: dict[str, int | None] = field(default_factory=dict)  # same_root.Progress: how far training got
    progressed: bool = False  # went past every earlier job of the chain
    repeats: int = 0  # jobs that ended with this fingerprint since the chain last progressed (this one included)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("nodes", "exclude_nodes", "excluded"):
            out[key] = list(out[key])
        return out


def stop_reason(cause: str | None, retry: str | None) -> tuple[str, str] | None:
    """None when a new submission may succeed, else (reason, why not) (pure)."""
    if cause is None:
        return "no_post_mortem", "no post-mortem: analyze could not read the job's logs"
    if retry == "stop":
        return "deterministic", f"{cause} is a fault of the job itself (analyze: retry stop); it would fail again"
    if retry != "requeue":
        return "undecided", f"analyze cannot tell whether resubmitting helps after {cause} (retry {retry or 'unknown'})"
    if cause in REQUEUED_IN_PLACE:
        return "requeues_in_place", f"the job requeues itself after {cause} (--max-requeues), a new job is not needed"
    return None


def why_not_resubmit(cause: str | None, retry: str | None) -> str | None:
    """None when a new submission may succeed, else why not (pure)."""
    reason = stop_reason(cause, retry)
    return reason[1] if reason else None


def merged_exclude(current: str | None, nodes: Iterable[str]) -> str | None:
    """`current` (a Slurm hostlist or None) with `nodes` added; unchanged when nothing is new (pure)."""
    try:
        have = expand_hostlist(current) if current else []
    except EnvDerivationError:  # an expression ddpslurm cannot expand: kept as it is, for Slurm to read
        new = [node for node in nodes if node != current]
        return ",".join([current, *new]) if new else current
    new = [node for node in nodes if node not in have]
    if not new:
        return current
    return compress_hostlist(sorted({*have, *new}))


def chain_record(attempts: Sequence[Attempt], retries: int, ok: bool,
                 stop: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What `--wait --json` prints and `retries.json` holds (pure); `stop`: why the chain ended short of a
    completed job (None while it runs and once it completed)."""
    last = attempts[-1]
    return {"ok": ok, "job_id": last.job_id, "folder": last.folder, "retries": retries,
            "budget": {"same_root": same_root.SAME_ROOT_BUDGET, "deterministic": same_root.DETERMINISTIC_BUDGET},
            "stop": dict(stop) if stop else None, "attempts": [a.to_dict() for a in attempts]}


def write_chain(record: Mapping[str, Any]) -> None:
    """`retries.json` into the folder of every job of the chain (best effort: a folder may be gone)."""
    chain = {"schema": 1, "kind": "retry_chain", **record}
    for attempt in record["attempts"]:
        folder = Path(attempt["folder"])
        if folder.is_dir():
            with contextlib.suppress(OSError):
                jobfolder.write_json(jobfolder.chain_path(folder), chain)


def read_chain(folder: str | Path | None) -> dict[str, Any] | None:
    """The chain a job folder belongs to, or None (no file, or not a chain ddpslurm wrote)."""
    if not folder:
        return None
    try:
        data = json.loads(jobfolder.chain_path(folder).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") != "retry_chain" or not isinstance(data.get("attempts"), list):
        return None
    return data


def chain_lines(chain: Mapping[str, Any], sanitize: Callable[[str], str] = str) -> list[str]:
    """The chain as text lines for `submit` and `status` (pure); every value from a file goes through `sanitize`."""
    lines = [sanitize(f"retry chain ({len(chain['attempts'])} job(s), at most {chain.get('retries', '?')} retries):")]
    for number, attempt in enumerate(chain["attempts"]):
        if not isinstance(attempt, Mapping):
            continue
        nodes = ",".join(map(str, attempt.get("nodes") or [])) or "-"
        cause = f", cause {attempt['cause']}" if attempt.get("cause") else ""
        blamed = f", blamed {','.join(map(str, attempt['exclude_nodes']))}" if attempt.get("exclude_nodes") else ""
        root = f" [root {attempt['fingerprint']}, {attempt.get('repeats')}x]" if attempt.get("fingerprint") else ""
        lines.append(sanitize(f"  {number}: job {attempt.get('job_id')} on {nodes}: {attempt.get('state')}"
                              f"{cause}{blamed}{root} -> {attempt.get('decision')}"))
    stop = chain.get("stop")
    if isinstance(stop, Mapping):
        lines.append(sanitize(f"stopped ({stop.get('reason')}): {stop.get('text')}"))
    return lines


def observe(folder: str, diagnosis: Mapping[str, Any]) -> tuple[str | None, same_root.Progress]:
    """A failed job's fingerprint (analyze's verdict and the job folder's records) and how far it got."""
    cause = diagnosis.get("cause")
    node_level = bool(cause) and cause_is_node_level(str(cause))
    rank = diagnosis.get("first_failing_rank")
    exception = same_root.exception_type(folder, rank if isinstance(rank, int) else None)
    key = same_root.fingerprint(diagnosis, node_level, same_root.script_of(folder), exception)
    return key, same_root.progress_of(folder)


@functools.lru_cache(maxsize=1)
def _node_level_causes() -> frozenset[str]:
    from ddpslurm.analyze.rules.loading import load_signatures

    try:
        causes = load_signatures().causes
    except DdpSlurmError:  # a broken site rule folder: analyze says so; the fingerprint falls back to the host
        return frozenset()
    return frozenset(name for name, info in causes.items() if info.node_level)


def cause_is_node_level(cause: str) -> bool:
    """Whether the analyzer's cause table says `cause` lives on a node (a port, a NIC, a GPU, the node)."""
    return cause in _node_level_causes()


@dataclass
class ChainSteps:
    """What `run_chain` does with the world: submit a spec, wait for a job, analyze its folder, print; `inspect`
    reads a failed job's folder for its fingerprint and progress (`observe` by default)."""

    submit: Callable[[str | None], tuple[str, str]]  # exclude -> (job id, folder)
    wait: Callable[[str], tuple[str, bool, tuple[str, ...]]]  # job id -> (state, ok, nodes)
    analyze: Callable[[str, str], Mapping[str, Any] | None]  # (job id, folder) -> analyze --json dict or None
    say: Callable[[str], None] = lambda text: None
    inspect: Callable[[str, Mapping[str, Any]], tuple[str | None, same_root.Progress]] = observe


def _judge(attempts: Sequence[Attempt], diagnosis: Mapping[str, Any], retries: int,
           key: str | None, point: same_root.Progress) -> tuple[dict[str, Any] | None, int, bool]:
    """(stop or None, repeats, progressed) for a failed job after `attempts` (pure)."""
    progressed = point.beyond(same_root.furthest(same_root.Progress(**a.progress) for a in attempts))
    history = [(a.fingerprint, a.progressed) for a in attempts] + [(key, progressed)]
    seen, retry = same_root.repeats(history), diagnosis.get("retry")
    why = stop_reason(diagnosis.get("cause"), retry)
    text = same_root.same_root_stop(history, retry) if why is None else None
    if why is None and text is not None:
        why = ("same_root", text)
    if why is None and len(attempts) >= retries:
        why = ("no_retries_left", f"no retries left ({retries})")
    stop = {"reason": why[0], "text": why[1], "fingerprint": key, "repeats": seen,
            "budget": same_root.budget(retry)} if why else None
    return stop, seen, progressed


def run_chain(steps: ChainSteps, retries: int, exclude: str | None) -> dict[str, Any]:
    """Submit, wait, and on an infrastructure fault resubmit away from the blamed nodes; the chain record.

    The first submission's errors propagate; a refused resubmission (too few nodes left once the blamed ones
    are excluded, say) ends the chain and is recorded as the last attempt's decision.
    """
    attempts: list[Attempt] = []
    stop: dict[str, Any] | None = None
    while True:
        try:
            job_id, folder = steps.submit(exclude)
        except DdpSlurmError as error:
            if not attempts:
                raise
            attempts[-1] = replace(attempts[-1], decision=f"resubmission refused: {error.one_line()}")
            last = attempts[-1]
            stop = {"reason": "resubmission_refused", "text": last.decision, "fingerprint": last.fingerprint,
                    "repeats": last.repeats, "budget": same_root.budget(last.retry)}
            steps.say(f"Resubmission refused: {error.one_line()}")
            break
        state, ok, nodes = steps.wait(job_id)
        excluded = tuple(expand_or_keep(exclude))
        if ok:
            attempts.append(Attempt(job_id, folder, nodes, state, decision="completed", excluded=excluded))
            stop = None
            break
        diagnosis = steps.analyze(job_id, folder) or {}
        key, point = steps.inspect(folder, diagnosis)
        stop, seen, progressed = _judge(attempts, diagnosis, retries, key, point)
        blamed = tuple(str(n) for n in diagnosis.get("exclude_nodes") or ())
        attempts.append(Attempt(job_id, folder, nodes, state, diagnosis.get("cause"), diagnosis.get("retry"), blamed,
                                str(diagnosis.get("summary", "")), decision=stop["text"] if stop else "resubmitted",
                                excluded=excluded, fingerprint=key, progress=point.to_dict(), progressed=progressed,
                                repeats=seen))
        write_chain(chain_record(attempts, retries, ok=False, stop=stop))
        if stop is not None:  # the chain's last line says why
            break
        exclude = merged_exclude(exclude, blamed)
        away = f" excluding {exclude}" if exclude else ""
        steps.say(f"Job {job_id} {state} ({diagnosis.get('cause')}): resubmitting{away} "
                  f"(retry {len(attempts)} of {retries}).")
    record = chain_record(attempts, retries, ok=attempts[-1].decision == "completed", stop=stop)
    write_chain(record)
    return record


def expand_or_keep(hostlist: str | None) -> list[str]:
    """A hostlist's node names; an expression ddpslurm cannot expand stays one entry (pure)."""
    if not hostlist:
        return []
    try:
        return expand_hostlist(hostlist)
    except EnvDerivationError:
        return [hostlist]


def analyze_job(job_id: str, folder: str) -> Mapping[str, Any] | None:
    """`ddpslurm analyze <folder>` as a dict (with sacct's view), or None when the folder cannot be analyzed."""
    from ddpslurm.analyze.api import add_accounting, analyze_paths

    try:
        diagnosis = analyze_paths([folder])
    except DdpSlurmError:
        return None
    add_accounting(diagnosis, job_id)
    return diagnosis.to_dict()


def job_folder_from_submit_line(submit_line: str, job_id: str) -> str | None:
    """The ddpslurm job folder of a job from sacct's SubmitLine (`sbatch <root>/.submission_file_<hex>.sh`),
    or None for a job ddpslurm did not submit (pure)."""
    try:
        words = shlex.split(submit_line)
    except ValueError:
        words = submit_line.split()
    for word in words:
        path = Path(word)
        if jobfolder.SUBMITIT_BATCH_FILE.fullmatch(path.name):  # in the jobs root, beside the job folders
            return str(jobfolder.job_folder(path.parent, job_id.split("_")[0]))
    return None


def chain_of_job(job_id: str, folder: str | None) -> dict[str, Any] | None:
    """The retry chain of a job, from its folder, or for a bare job id from the folder sacct's SubmitLine names.
    None when the job is not part of a chain or Slurm cannot say where its folder is."""
    if folder is None:
        from ddpslurm.errors import SlurmCommandError, SlurmNotFoundError
        from ddpslurm.scheduler.commands import sacct_argv
        from ddpslurm.scheduler.run import run

        try:
            out = run([*sacct_argv(job_id, fields=("SubmitLine",), duplicates=False), "--allocations"],
                      timeout=30, check=False).stdout
        except (SlurmCommandError, SlurmNotFoundError):
            return None
        lines = [line for line in out.splitlines() if line.strip()]
        folder = job_folder_from_submit_line(lines[-1], job_id) if lines else None
    return read_chain(folder)
