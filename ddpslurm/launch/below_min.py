"""Fewer than MIN nodes left (`submit --nodes MIN:MAX`): torchrun's agents give up, the batch step requeues the job.

Slurm keeps a `--no-kill` job running when a node is lost, so a job left with fewer than MIN nodes is neither
ended nor requeued by Slurm. The surviving agents restart their workers and wait in the c10d rendezvous for MIN
nodes; no node can join (Slurm never grows an allocation), so the wait is bounded by torchrun's
`--rdzv-conf join_timeout=S` (`join_timeout_s`: DEFAULT_JOIN_TIMEOUT_S, or $DDPSLURM_RDZV_JOIN_TIMEOUT_S), after
which torch's DynamicRendezvousHandler raises RendezvousTimeoutError (`_RendezvousOpExecutor.run`, action
ERROR_TIMEOUT: "fewer than min_nodes joined before the deadline"); the first agent to give up closes the
rendezvous, and the others' waits end in RendezvousClosedError. Each agent writes what ended its wait into
`<attempt>/<host>/rendezvous_gave_up.json`; when srun has ended, the batch step reads them (`decide`) and requeues
the job through the preemption requeue's path (`batch.requeue_if_running`, `requeue.json`, counted against
--max-requeues), excluding nothing: the lost node is Slurm's business (it is DOWN and gets no job until it
returns). Its decision, with the nodes whose agents did not give up (the lost ones), goes to
`<attempt>/below_min.json`, which `ddpslurm status` shows.

Names, `join_timeout_s`, `gave_up_entry` and `decide` are pure; the rest reads and writes the job folder. No torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder

#: seconds the agents wait in a rendezvous for MIN nodes (torchrun's own default is 600 s): long enough for every
#: node of the step to start Python and torch and reach the rendezvous, far shorter than the wait of 600 s for
#: nodes that cannot come (Slurm never adds a node to a running job)
DEFAULT_JOIN_TIMEOUT_S = 120
JOIN_TIMEOUT_ENV = "DDPSLURM_RDZV_JOIN_TIMEOUT_S"
GAVE_UP_FILE = jobfolder.GAVE_UP_FILE
RECORD_FILE = jobfolder.BELOW_MIN_FILE
TIMEOUT = "timeout"  # RendezvousTimeoutError: fewer than MIN nodes joined within join_timeout
CLOSED = "closed"  # RendezvousClosedError: another agent gave up (or the job ended) and closed the rendezvous
#: torch's rendezvous exceptions (torch/distributed/elastic/rendezvous/api.py) by name, and what they mean here
ERROR_KINDS = {"RendezvousTimeoutError": TIMEOUT, "RendezvousClosedError": CLOSED}
REQUEUE = "requeue"
NONE = "none"


def join_timeout_s(environ: Mapping[str, str]) -> int:
    """$DDPSLURM_RDZV_JOIN_TIMEOUT_S as whole seconds (at least 1), else DEFAULT_JOIN_TIMEOUT_S. Pure; a value that
    is not a positive integer raises ValueError naming it."""
    text = (environ.get(JOIN_TIMEOUT_ENV) or "").strip()
    if not text:
        return DEFAULT_JOIN_TIMEOUT_S
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{JOIN_TIMEOUT_ENV}={text!r} is not a whole number of seconds of at least 1")
    return int(text)


def kind_of(error_type: str) -> str | None:
    """TIMEOUT or CLOSED for torch's rendezvous exception named `error_type`, None for any other. Pure."""
    return ERROR_KINDS.get(error_type)


def gave_up_entry(*, host: str, error_type: str, message: str, min_nodes: int, join_timeout: int, starts: int,
                  unix: float | None = None) -> dict[str, Any]:
    """One agent's give-up as `rendezvous_gave_up.json` keeps it (`starts`: its workers' starts so far). Pure
    (given `unix`)."""
    from ddpslurm.launch.records import timestamp

    now = time.time() if unix is None else unix
    return {"schema": 1, "kind": kind_of(error_type), "error": error_type, "message": message[:500], "host": host,
            "min_nodes": min_nodes, "join_timeout_s": join_timeout, "worker_starts": starts, "unix": now,
            "time": timestamp(now)}


def write_gave_up(host_dir: Path, entry: Mapping[str, Any]) -> None:
    """The agent's record; a failure to write it is said on stderr (the job then simply fails)."""
    try:
        jobfolder.write_json(host_dir / GAVE_UP_FILE, dict(entry))
    except OSError as error:
        print(f"ddpslurm: cannot record the rendezvous give-up in {host_dir}: {error}", file=sys.stderr, flush=True)


def read_gave_up(attempt_dir: Path) -> dict[str, dict[str, Any]]:
    """The give-up records of an attempt by host folder name; {} when none."""
    found: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(attempt_dir):
            if not entry.is_dir(follow_symlinks=False):
                continue
            data = jobfolder.read_object(Path(entry.path) / GAVE_UP_FILE)
            if data is not None:
                found[entry.name] = data
    return found


@dataclass(frozen=True)
class Decision:
    action: str  # REQUEUE | NONE
    reason: str  # "" when no agent gave up for want of nodes
    lost: tuple[str, ...] = field(default=())  # the job's nodes whose agents did not give up


def decide(gave_up: Mapping[str, Mapping[str, Any]], *, hosts: Sequence[str], attempt: int,
           max_requeues: int) -> Decision:
    """Whether the batch step requeues a job whose srun has ended, from its agents' give-up records by host and the
    job's hosts. Only a rendezvous timeout means too few nodes (a closed rendezvous alone is the job's own end).
    Pure."""
    timeouts = [rec for rec in gave_up.values() if rec.get("kind") == TIMEOUT]
    if not timeouts:
        return Decision(NONE, "")
    lost = tuple(host for host in dict.fromkeys(hosts) if host not in gave_up)
    low = max((int(rec.get("min_nodes") or 0) for rec in timeouts), default=0)
    wait = max((int(rec.get("join_timeout_s") or 0) for rec in timeouts), default=0)
    left = len(gave_up)
    what = (f"{left} of {len(hosts) or '?'} node(s) left, fewer than --nodes MIN {low}: torchrun's rendezvous timed "
            f"out after {wait}s" + (f" (lost: {','.join(lost[:8])})" if lost else ""))
    if attempt >= max_requeues:
        return Decision(NONE, f"{what}; attempt {attempt} reached --max-requeues {max_requeues}", lost)
    return Decision(REQUEUE, what, lost)


def write_record(attempt_dir: Path, decision: Decision, requeued: bool) -> None:
    """The batch step's decision in `<attempt>/below_min.json`."""
    now = time.time()
    from ddpslurm.launch.records import timestamp

    with contextlib.suppress(OSError):
        jobfolder.write_json(attempt_dir / RECORD_FILE, {
            "schema": 1, "kind": "below_min", "action": decision.action, "reason": decision.reason,
            "lost_nodes": list(decision.lost), "requeued": requeued, "unix": now, "time": timestamp(now)})


def read_record(attempt_dir: Path) -> dict[str, Any] | None:
    """`below_min.json` of an attempt, or None."""
    return jobfolder.read_object(attempt_dir / RECORD_FILE)


def summary(job_dir: Path) -> list[dict[str, Any]]:
    """The attempts of a job that ended below MIN nodes, oldest first: {attempt, requeued, reason, lost_nodes}."""
    out = []
    with contextlib.suppress(OSError):
        for name in os.listdir(job_dir):
            match = jobfolder.ATTEMPT_NAME.fullmatch(name)
            record = read_record(job_dir / name) if match else None
            if match and record:
                out.append({"attempt": int(match["n"]), "requeued": bool(record.get("requeued")),
                            "reason": str(record.get("reason", "")), "lost_nodes": record.get("lost_nodes") or []})
    return sorted(out, key=lambda item: item["attempt"])


def summary_line(entries: Sequence[Mapping[str, Any]]) -> str:
    """`status`'s line for `summary(...)`. Pure."""
    parts = [f"attempt {e['attempt']} {'requeued' if e['requeued'] else 'not requeued'}: {e['reason']}"
             for e in entries]
    return "below --nodes MIN: " + "; ".join(parts)
