"""torch's flight recorder, dumped as JSON by the hang monitor (`attempt_N/rank_R.fr_trace.json`) -> events.

The dump is `torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)` (torch
2.5+, gloo and NCCL; format version 2.x): `{"version", "pg_config", "pg_status", "entries": [...]}`, one entry per
recent collective of any process group with `process_group: [name, desc]`, `collective_seq_id` (per group, the
same on every rank for the same collective), `is_p2p`, `profiling_name` (`gloo:all_reduce`, `nccl:broadcast`),
`input_sizes`, `state`. Read with `json` only, size-capped; torch's own timeout dumps are pickles and never read.

Per rank and process group the last collective it issued becomes one `fr_last` event (no role: it is not a failure
by itself). The producer `flight_recorder` (producers.py) compares the ranks: a rank whose last sequence number is
lower than its peers' never issued the collective they wait in (collective_timeout); ranks at the same number in
different collectives or with different sizes are a collective_mismatch.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from ddpslurm.analyze.model import Event, SourceFile
from ddpslurm.jobfolder import FR_TRACE_SUFFIX, rank_file_pattern
from ddpslurm.sanitize import escape_undecodable

#: A dump beyond this is not read (torch's default ring of 2000 entries is about 1 MB).
MAX_BYTES = 64 * 1024 * 1024
_FILE_NAME = rank_file_pattern(FR_TRACE_SUFFIX, 7)
_BACKEND = re.compile(r"^(?:gloo|nccl|ucc|mpi|xccl|fake|custom):")


def _seq(entry: Mapping[str, Any]) -> int | None:
    value = entry.get("collective_seq_id")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62 else None


def _group(entry: Mapping[str, Any]) -> str | None:
    group = entry.get("process_group")
    if isinstance(group, list) and group and isinstance(group[0], str | int):
        return str(group[0])[:100]
    pg_id = entry.get("pg_id")
    return str(pg_id) if isinstance(pg_id, int) else None


def _sizes(entry: Mapping[str, Any]) -> str:
    sizes = entry.get("input_sizes")
    return json.dumps(sizes, separators=(",", ":"))[:200] if isinstance(sizes, list) else "?"


def last_collectives(data: Any) -> dict[str, Mapping[str, Any]]:
    """Process group -> the entry of the last collective (not point-to-point) this rank issued in it. Pure."""
    entries = data.get("entries") if isinstance(data, dict) else None
    last: dict[str, Mapping[str, Any]] = {}
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or entry.get("is_p2p") is True:
            continue
        seq, group = _seq(entry), _group(entry)
        if seq is None or group is None or not isinstance(entry.get("profiling_name"), str):
            continue
        if group not in last or seq >= (_seq(last[group]) or 0):
            last[group] = entry
    return last


def fr_events(source: SourceFile) -> list[Event]:
    """One `fr_last` event per process group of the rank's dump; none for a file that is not such a dump."""
    match = _FILE_NAME.fullmatch(os.path.basename(source.path))
    rank = int(match["rank"]) if match else source.rank
    if rank is None:
        return []
    try:
        if os.path.getsize(source.path) > MAX_BYTES:
            return []
        with open(source.path, encoding="utf-8", errors="replace") as handle:
            data = json.load(handle)
    except (OSError, ValueError, RecursionError):
        return []
    events = []
    for group, entry in sorted(last_collectives(data).items()):
        name = _BACKEND.sub("", str(entry["profiling_name"]))[:100]
        state = str(entry.get("state", "?"))[:40]
        seq, sizes = _seq(entry), _sizes(entry)
        text = (f"rank {rank} flight recorder: the last collective it issued in process group {group} is #{seq} "
                f"{name} of input sizes {sizes} ({state})")
        events.append(Event(file=source.display, line=1, kind="fr_last", text=escape_undecodable(text), rank=rank,
                            host=source.host, fields=(("pg", group), ("seq", str(seq)), ("collective", name),
                                                      ("sizes", sizes), ("state", state))))
    return events
