"""Cost of one poll of the batch-step supervisor (`ddpslurm.launch.batch.read_attempt`), which runs once a
second while the job's srun runs.

    python benchmarks/batch_poll.py [RANKS...]        # default: 64 1024 8192

For each rank count it writes a fake attempt folder as a finished preempted attempt leaves it (8 ranks a node:
each rank's start and exit record in its host folder, one node file per node with its ranks' signals and ends,
as `ddpslurm.launch.node_live`'s agents write them) under a temporary directory and prints the wall time of one
poll before any signal (the whole normal life of a job), of the first poll that sees every record after it,
and of the polls after that (only node files that changed are read). A local disk; a parallel file system's
metadata latency comes on top.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from ddpslurm.launch.batch import AttemptReader, read_attempt


def fill(attempt: Path, ranks: int, with_signal: bool, per_node: int = 8) -> None:
    from ddpslurm import jobfolder
    from ddpslurm.launch.node_live import node_record

    for node in range((ranks + per_node - 1) // per_node):
        host, states = f"n{node:05d}", {}
        for rank in range(node * per_node, min(ranks, (node + 1) * per_node)):
            paths = jobfolder.rank_paths(attempt, rank, host)
            paths["start"].parent.mkdir(exist_ok=True)
            paths["start"].write_text(json.dumps({"rank": rank, "env": {"NCCL_DEBUG": "INFO"}}))
            states[rank] = {"rank": rank, "progress": None}
            if with_signal:
                paths["exit"].write_text(json.dumps({"rank": rank, "status": "preempted", "unix": 2.0}))
                states[rank].update(signal={"signal": "SIGTERM", "unix": 1.0},
                                    exit={"status": "preempted", "exit_code": 0, "unix": 2.0})
        jobfolder.write_json(jobfolder.node_file_path(attempt, host), node_record(host, states, 1, 5.0, 0.0))


def poll_s(attempt: Path, repeat: int = 5) -> float:
    """Best wall time of a first poll (every record parsed once)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        read_attempt(attempt)
        best = min(best, time.perf_counter() - start)
    return best


def next_poll_s(attempt: Path) -> float:
    """Wall time of a later poll of the same supervisor (nothing new: a directory listing)."""
    reader = AttemptReader(attempt)
    reader.poll()
    start = time.perf_counter()
    reader.poll()
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    print(f"{'ranks':>6}  {'poll before signal (ms)':>24}  {'first poll after (ms)':>22}  {'next polls (ms)':>16}")
    for ranks in [int(a) for a in argv] or [64, 1024, 8192]:
        with tempfile.TemporaryDirectory() as tmp:
            before, after = Path(tmp, "before"), Path(tmp, "after")
            before.mkdir()
            after.mkdir()
            fill(before, ranks, with_signal=False)
            fill(after, ranks, with_signal=True)
            print(f"{ranks:>6}  {poll_s(before) * 1000:>24.2f}  {poll_s(after) * 1000:>22.2f}  "
                  f"{next_poll_s(after) * 1000:>16.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
