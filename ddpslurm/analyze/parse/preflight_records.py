"""Doctor records -> analyzer events: a failed pre-flight is a diagnosis (cause, node) for `ddpslurm analyze`.

Links and versions are judged across nodes, so one record file is judged with its siblings in the same
`doctor/` folder; each file yields the failed checks of its own node (the first file also those of nodes that
left no record). The events carry a host and no rank: the analyzer's host-level evidence names the node.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

from ddpslurm.analyze.model import Event
from ddpslurm.doctor.command import NODE_NAME, load_records, read_record
from ddpslurm.doctor.judge import cause_of, judge

#: A failed pre-flight is a node's own failure: the strongest kind of evidence (own_weight 100).
PREFLIGHT_PRIORITY = 100


def _finished(record: dict) -> float | None:
    value = record.get("finished")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def doctor_events(path: str, display: str) -> list[Event]:
    """The failed checks that belong to the node of the record at `path` (none when every check passed)."""
    record = read_record(Path(path))
    if record is None or not isinstance(record.get("nodes"), list) or not isinstance(record.get("node"), str):
        return []
    nodes = [str(node) for node in record["nodes"]]
    if not nodes or not all(NODE_NAME.fullmatch(node) for node in nodes):
        return []
    folder = Path(path).parent
    try:
        stamp = os.stat(folder).st_mtime_ns
    except OSError:
        return []
    present, checks = _judged(str(folder.parent), tuple(nodes), stamp)
    mine = {record["node"]} | (set(nodes) - set(present) if present and present[0] == record["node"] else set())
    when = _finished(record)
    return [Event(file=display, line=1, kind="preflight", host=check.node, time=when,
                  time_family="record" if when is not None else None, cause=cause_of(check.name), role="culprit",
                  priority=PREFLIGHT_PRIORITY, text=f"pre-flight check {check.name} failed on {check.node}: "
                  f"{check.detail}", fields=(("check", check.name), ("host", check.node)))
            for check in checks if not check.ok and check.node in mine]


@functools.lru_cache(maxsize=8)
def _judged(root: str, nodes: tuple[str, ...], stamp: int) -> tuple[list[str], tuple]:
    """The nodes that left a record and the checks judged over all of a doctor folder's records, once per folder
    (each record file asks: judging per file read every record again, quadratic in nodes). `stamp`: the folder's
    mtime, so that a folder written again is judged again."""
    records = load_records(Path(root), list(nodes))
    return sorted(records), tuple(judge(list(nodes), records))
