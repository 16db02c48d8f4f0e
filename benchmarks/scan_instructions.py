"""Instructions a file of the scan, counted by callgrind: a figure this VM's noise does not move.

    python3 benchmarks/scan_instructions.py [--folder .bench/r16k] [--warm 400] [--files 800] [--tree DIR ...]

On a shared 2-vCPU VM the same run's wall time swings by a quarter, so a change of a tenth is not seen in seconds.
This counts instead: for each tree (this one by default; a `git worktree` of another commit, its `_bulk` built, to
compare), `scan_file` over the folder's first `--warm` log files (the memos warmed), then over those and the next
`--files`, each in a fresh interpreter under `valgrind --tool=callgrind` with that tree's package first on the path;
the difference of the two totals divided by `--files` is what one file of the job costs, start-up and warming
taken out. Prints one row per tree: its commit, whether the compiled scanner was taken, and instructions a file.
Needs valgrind (`apt-get install valgrind`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = """
import sys
from ddpslurm.analyze import api
from ddpslurm.analyze.parse.file_scan import scan_file
from ddpslurm.analyze.read.bulk import BULK
sigs = api.load_signatures(())
found = api.discover_all([sys.argv[1]], [sys.argv[1]])
logs = [s for s in found.sources if s.kind == "log"][:int(sys.argv[2])]
for source in logs:
    scan_file(source, sigs, 2026, keep_tail=False)
print("compiled" if BULK is not None else "pure", len(logs))
"""
COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(tree: Path, folder: Path, files: int) -> tuple[int, str]:
    """callgrind's total for a scan of the first `files` log files with `tree`'s package, and what it said."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                           CHILD, str(folder), str(files)], capture_output=True, text=True, env=env, cwd=tree,
                          check=False)
    found = COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"scan_instructions: the run with {tree} failed: "
                         f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return int(found[1]), done.stdout.strip()


def commit_of(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return (done.stdout.strip() or "?") + ("+changes" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path(".bench/r16k"))
    parser.add_argument("--warm", type=int, default=400, help="files scanned first, to warm the memos")
    parser.add_argument("--files", type=int, default=800, help="files counted after them")
    parser.add_argument("--tree", type=Path, action="append", help="a tree whose package to count (repeatable)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("scan_instructions: valgrind is not installed here; apt-get install valgrind", file=sys.stderr)
        return 2
    if not args.folder.is_dir() or args.warm < 0 or args.files < 1:
        print(f"scan_instructions: {args.folder} is no folder, or --warm/--files out of range; make one with "
              "make_big_job.py", file=sys.stderr)
        return 2
    folder = args.folder.resolve()
    print("| tree | commit | path | files counted | instructions a file |\n|---|---|---|---|---|")
    for tree in (t.resolve() for t in (args.tree or [HERE.parent])):
        warm, _said = instructions(tree, folder, args.warm)
        both, said = instructions(tree, folder, args.warm + args.files)
        path, read = said.split()
        counted = int(read) - args.warm
        if counted < 1:
            print(f"scan_instructions: {folder} has no more than {args.warm} log files", file=sys.stderr)
            return 2
        print(f"| {tree} | {commit_of(tree)} | {path} | {counted:,} | {(both - warm) / counted / 1e6:.3f} M |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
