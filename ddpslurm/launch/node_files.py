"""The batch step's view of an attempt's node files (`node_<host>.json`, written by each node's agent, `node_live`).

One listing of the attempt folder per poll for everything the supervisor and its hang monitor watch: a node file's
inode (from the listing itself, no stat) changes each time its agent rewrites it (a new file renamed over the old
one), and only the files that changed are read. A node file holds each rank's whole exit record (`ranks.R.exit`).
At the end of the step one full read, and, for the ranks no node file names as ended, their own exit records
(`<host>/rank_R.exit.json`: a rank whose agent did not confirm its record writes it itself; older job folders).
An agent killed with its node says nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder

#: a node file bigger than this is not one (a node of 10k local ranks' states is ~3 MB)
MAX_NODE_FILE_BYTES = 8 << 20


class NodeFiles:
    """The ranks' last states, from the node files of one attempt folder."""

    def __init__(self, attempt_dir: Path) -> None:
        self.attempt_dir = attempt_dir
        self.inodes: dict[str, int] = {}
        self.ranks: dict[int, dict[str, Any]] = {}
        self.record_exits: dict[int, dict[str, Any]] = {}
        self.interval_s = 0.0  # the longest interval between two progress writes a node file gives
        self._records_read = False

    def poll(self, full: bool = False) -> int:
        """List the attempt folder once; read the node files that changed (all of them with `full`). How many
        were read."""
        try:
            with os.scandir(self.attempt_dir) as listing:
                changed = [(entry.name, entry.path, entry.inode()) for entry in listing
                           if jobfolder.NODE_FILE_NAME.fullmatch(entry.name)
                           and (full or self.inodes.get(entry.name) != entry.inode())]
        except OSError:
            return 0
        read = 0
        for name, path, inode in changed:
            record = _read(Path(path))
            if record is None:
                continue  # written atomically: unreadable now is not a node file of ours
            self.inodes[name] = inode
            read += 1
            if isinstance(record.get("interval_s"), int | float):
                self.interval_s = max(self.interval_s, float(record["interval_s"]))
            for key, state in (record.get("ranks") or {}).items():
                if isinstance(state, dict) and str(key).isdigit():
                    self.ranks[int(key)] = state
        return read

    def progress(self) -> dict[int, tuple[Any, Any, Any]]:
        """Each rank's last progress (its process, collectives, step), for the ranks that reported one or have
        started: a rank's new process (torchrun's in-place restart) is progress before its first step."""
        out = {}
        for rank, state in self.ranks.items():
            beat = state.get("progress")
            if isinstance(beat, dict):
                out[rank] = (state.get("pid"), beat.get("collectives"), beat.get("step"))
            elif state.get("start"):
                out[rank] = (state.get("pid"), None, None)
        return out

    def progress_unix(self, rank: int) -> float | None:
        beat = self.ranks.get(rank, {}).get("progress")
        return float(beat["unix"]) if isinstance(beat, dict) and isinstance(beat.get("unix"), int | float) else None

    def exits(self) -> dict[int, dict[str, Any]]:
        """How each ended rank ended (`status`, `exit_code`, `unix`, `rank`): the node files', else (after
        `read_exit_records`) the rank's own exit record."""
        out = dict(self.record_exits)
        for rank, state in self.ranks.items():
            end = state.get("exit")
            if isinstance(end, dict):
                out[rank] = {**end, "rank": rank}
        return out

    def signals(self) -> dict[int, float]:
        """The time of each rank's first preemption signal, for the ranks that took one."""
        out = {}
        for rank, state in self.ranks.items():
            sig = state.get("signal")
            if isinstance(sig, dict) and isinstance(sig.get("unix"), int | float):
                out[rank] = float(sig["unix"])
        return out

    def read_exit_records(self, world_size: int) -> None:
        """Once, at the end of the step: the exit records of the ranks below `world_size` no node file names as
        ended (one listing per host folder)."""
        if self._records_read:
            return
        self._records_read = True
        known = self.exits()
        if all(rank in known for rank in range(world_size)):
            return
        for rank, path in jobfolder.rank_record_paths(self.attempt_dir, jobfolder.EXIT_SUFFIX).items():
            if rank in known:
                continue
            record = _read(path)
            if record is not None and isinstance(record.get("rank"), int):
                self.record_exits[rank] = record
                sig = record.get("signal_unix")
                if isinstance(sig, int | float) and rank not in self.ranks:
                    self.ranks[rank] = {"signal": {"unix": float(sig)}}


def _read(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(MAX_NODE_FILE_BYTES + 1) or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
