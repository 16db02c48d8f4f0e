"""Launch overhead of `ddpslurm submit`, read from job folders (ddpslurm.json + per-rank records).

    python benchmarks/launch_overhead.py ddpslurm_jobs/job_*

Per job and attempt 0: submit -> first rank's start record (queueing + srun + python/submitit start),
submit -> last rank's start record, the spread of rank starts, and first exit -> last exit record
(how long the other ranks outlive the first one to end: the fail-fast figure for a failed job).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def job_figures(job: Path) -> dict[str, float] | None:
    try:
        submitted = json.loads((job / "ddpslurm.json").read_text())["submit_unix"]
    except (OSError, ValueError, KeyError):
        return None
    attempt = job / "attempt_0"
    starts = [json.loads(p.read_text())["unix"] for p in [*attempt.glob("rank_*.start.json"),
                                                          *attempt.glob("*/rank_*.start.json")]]  # host folders
    exits = [json.loads(p.read_text())["unix"] for p in [*attempt.glob("rank_*.exit.json"),
                                                         *attempt.glob("*/rank_*.exit.json")]]
    if not starts:
        return None
    figures = {"ranks": float(len(starts)), "submit_to_first_start_s": min(starts) - submitted,
               "submit_to_last_start_s": max(starts) - submitted, "start_spread_s": max(starts) - min(starts)}
    if len(exits) > 1:
        figures["exit_spread_s"] = max(exits) - min(exits)
    return figures


def main(paths: list[str]) -> None:
    unique = dict.fromkeys(Path(p).resolve() for p in paths)  # the same folder through two globs counts once
    rows = [(p, f) for p in unique if (f := job_figures(p)) is not None]
    if not rows:
        sys.exit("no job folder with ddpslurm.json and attempt_0/ records given")
    keys = ["submit_to_first_start_s", "submit_to_last_start_s", "start_spread_s", "exit_spread_s"]
    for path, fig in rows:
        print(path.name, f"ranks={int(fig['ranks'])}", " ".join(f"{k}={fig[k]:.2f}" for k in keys if k in fig))
    for key in keys:
        values = [fig[key] for _, fig in rows if key in fig]
        if values:
            print(f"{key}: median {statistics.median(values):.2f} s, max {max(values):.2f} s over {len(values)} jobs")


if __name__ == "__main__":
    main(sys.argv[1:])
