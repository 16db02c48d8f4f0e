"""`ddpslurm triage --sacct`: causes and nodes to drain across a whole cluster from slurmdbd alone.

Every failed job whose accounting record holds ddpslurm's one-line diagnosis (in its AdminComment, which only
root or SlurmUser can set, else its Comment) becomes one row of `ddpslurm triage`'s table, so the counts, node
table and drain list are the same as from job folders, and no job folder is read. Failed jobs without a
diagnosis are counted by state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ddpslurm.postmortem.lookup import from_comments
from ddpslurm.scheduler.commands import SACCT_COMMENT_DELIMITER, SACCT_COMMENT_FIELDS, sacct_comments_argv
from ddpslurm.scheduler.hostlist import expand_hostlist

DEFAULT_SINCE = "now-7days"


def parse_rows(text: str) -> list[dict[str, str]]:
    """sacct output in SACCT_COMMENT_FIELDS order -> one dict per job (pure); the Comment takes the rest."""
    rows = []
    for line in text.splitlines():
        values = line.split(SACCT_COMMENT_DELIMITER, len(SACCT_COMMENT_FIELDS) - 1)
        if len(values) == len(SACCT_COMMENT_FIELDS):
            rows.append(dict(zip(SACCT_COMMENT_FIELDS, values, strict=True)))
    return rows


def _nodes(nodelist: str) -> list[str]:
    try:
        return expand_hostlist(nodelist) if nodelist and nodelist not in ("None assigned", "(null)") else []
    except Exception:  # a nodelist ddpslurm cannot expand: the job's nodes stay unknown
        return []


def triage_rows(records: Sequence[Mapping[str, str]]) -> tuple[list[dict[str, Any]], Counter[str]]:
    """`ddpslurm triage` rows of the diagnosed jobs, and the undiagnosed failed jobs per state (pure)."""
    rows: list[dict[str, Any]] = []
    undiagnosed: Counter[str] = Counter()
    for rec in records:
        found = from_comments(rec.get("AdminComment", ""), rec.get("Comment", ""))
        if found is None:
            undiagnosed[(rec.get("State") or "?").split()[0]] += 1
            continue
        rows.append({"job": rec["JobID"], "path": found.get("where"), "job_id": rec["JobID"], "array_task": None,
                     "cause": found["cause"], "first_failing_rank": found["rank"],
                     "first_failing_host": found["node"], "confidence": found["confidence"], "retry": None,
                     "exclude_nodes": [], "nodes": _nodes(rec.get("NodeList", "")), "submitted": None,
                     "first_failure": None, "last_seen": rec.get("End"), "user": rec.get("User") or None,
                     "partition": rec.get("Partition") or None, "reason": None, "recorded_in": found["source"]})
    return rows, undiagnosed


def run_sacct_triage(*, since: str | None, until: str | None = None, user: str | None = None,
                     as_json: bool = False, environ: Mapping[str, str] | None = None) -> str:
    """What `ddpslurm triage --sacct` prints."""
    from ddpslurm import sanitize, triage
    from ddpslurm.scheduler.run import run

    triage.require_pandas()
    argv = sacct_comments_argv(since or DEFAULT_SINCE, until or "now", user)
    rows, undiagnosed = triage_rows(parse_rows(run(argv, timeout=120, env=environ).stdout))
    result = {**triage.summary(rows), "source": "sacct", "since": since or DEFAULT_SINCE,
              "undiagnosed": dict(sorted(undiagnosed.items()))}
    if as_json:
        return sanitize.json_dumps(result)
    missing = ", ".join(f"{sanitize.terminal(s)} x{n}" for s, n in sorted(undiagnosed.items())) or "none"
    head = (f"from slurmdbd (sacct, ended since {sanitize.terminal(since or DEFAULT_SINCE)}): {len(rows)} failed "
            f"job(s) with a ddpslurm diagnosis; failed without one: {missing}")
    return head + "\n" + triage.render_text(result)
