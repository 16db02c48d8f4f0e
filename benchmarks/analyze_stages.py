"""Issue 48: where `analyze` of a job goes, stage by stage, per rank: discovery, the scan, the diagnosis.

Runs `api.analyze_paths` on each folder in a fresh process of its own (`--jobs` scan workers, 1 by default: the
main process's own CPU is then the whole), timing the three stages by wrapping `discover_all`, `scan_files` and
`diagnose` for the run (a measuring tool; the child runs in this tree, its package first on the path), and prints
per folder: rank files, CPU seconds of each stage (median of `--runs`), microseconds per rank file for the scan and
the diagnosis, and the answer (cause, rank).

    python3 benchmarks/analyze_stages.py FOLDER [FOLDER ...] [--runs 3] [--jobs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys, time
from ddpslurm.analyze import api
spent = {}
def timed(name, fn):
    def run(*args, **kwargs):
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.process_time() - start
    return run
api.discover_all = timed("discover", api.discover_all)
api.scan_files = timed("scan", api.scan_files)
api.diagnose = timed("diagnose", api.diagnose)
start = time.process_time()
d = api.analyze_paths([sys.argv[1]], workers=int(sys.argv[2]))
spent["total"] = time.process_time() - start
print(json.dumps({"spent": spent, "cause": d.cause, "rank": d.first_failing_rank}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TREE), os.environ.get("PYTHONPATH", "")])}
    print("| folder | files | discover s | scan s | diagnose s | total CPU s | scan us/file | diagnose us/file "
          "| cause | rank |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for folder in (f.resolve() for f in args.folders):
        files = sum(1 for p in folder.rglob("*") if p.is_file())
        runs = []
        for _ in range(args.runs):
            done = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(args.jobs)], capture_output=True,
                                  text=True, env=env, check=False, cwd=TREE)
            if done.returncode != 0:
                print(f"| {folder} | {files} | failed: {(done.stderr.strip().splitlines() or ['?'])[-1]} |")
                break
            runs.append(json.loads(done.stdout))
        if not runs:
            continue
        med = {k: statistics.median(r["spent"].get(k, 0.0) for r in runs)
               for k in ("discover", "scan", "diagnose", "total")}
        print(f"| {folder.name} | {files:,} | {med['discover']:.2f} | {med['scan']:.2f} | {med['diagnose']:.2f} | "
              f"{med['total']:.2f} | {1e6 * med['scan'] / files:.0f} | {1e6 * med['diagnose'] / files:.0f} | "
              f"{runs[-1]['cause']} | {runs[-1]['rank']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
