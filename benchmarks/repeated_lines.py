"""Issue 48: `ddpslurm analyze DIR --json` on one-rank logs whose error repeats 5,000 times, per variant.

Writes each variant's folder under `--root` (a `slurm-<job>.out` per variant), runs `ddpslurm analyze DIR --json`
`--runs` times in a fresh process each (this tree's package first on PYTHONPATH), and prints per variant the file's
size, the median wall and CPU seconds of the command (user+sys of the child: startup included) and of its
`analyze_paths` call alone (in a fresh process, imports done first), and the answer (cause, rank, evidence lines).
"one line" is the oom+progress log with one repeat: the floor the repeats are measured against.

    python3 benchmarks/repeated_lines.py [--root .bench/repeated] [--repeats 5000] [--runs 3] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use.")
WATCHDOG = ("[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
            "NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600023 milliseconds before timing out.")
TRACEBACK = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 88, in <module>\n    main()\n'
             '  File "/home/u/train.py", line 61, in main\n    loss = model(batch).sum()\n'
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")


def _stamp(i: int) -> str:
    return f"2026-11-02 10:{(i // 60) % 60:02d}:{i % 60:02d},{i % 1000:03d}"


def oom_progress(n: int) -> str:
    """The lead's shape: `[rank3]: ` OOM line, each followed by a progress line."""
    return "".join(f"[rank3]: {OOM}\n[rank3]: step {i} loss 1.234 retrying with smaller batch\n" for i in range(n))


def same_line(n: int) -> str:
    """One line, byte for byte, `n` times."""
    return f"[rank3]: {OOM}\n" * n


def timestamps(n: int) -> str:
    """The same line with a different timestamp each time."""
    return "".join(f"{_stamp(i)} [rank3]: {OOM}\n" for i in range(n))


def steps(n: int) -> str:
    """The same line with a different step number in it each time."""
    return "".join(f"[rank3]: step {i}: {OOM}\n" for i in range(n))


def traceback(n: int) -> str:
    """A whole traceback, `n` times (a retry loop printing its exception)."""
    return "".join(f"[rank3]: {line}\n" for _ in range(n) for line in TRACEBACK.splitlines())


def watchdog(n: int) -> str:
    """One rank's watchdog timeout line repeated."""
    return "".join(f"[rank5]:[E ProcessGroupNCCL.cpp:616] {WATCHDOG.format(r=5)}\n" for _ in range(n))


def merged(n: int) -> str:
    """Eight ranks in one merged file (srun's `R: ` labels): rank 3's OOM repeated, the others' watchdogs."""
    out = []
    for i in range(n):
        rank = i % 8
        line = OOM if rank == 3 else f"[E ProcessGroupNCCL.cpp:616] {WATCHDOG.format(r=rank)}"
        out.append(f"{rank}: [rank{rank}]: {line}\n")
    return "".join(out)


VARIANTS: dict[str, Callable[[int], str]] = {
    "oom+progress": oom_progress, "same line": same_line, "timestamps": timestamps, "step numbers": steps,
    "traceback": traceback, "watchdog": watchdog, "merged 8 ranks": merged,
}


def write(root: Path, name: str, repeats: int) -> Path:
    """The variant's folder, written once."""
    folder = root / name.replace(" ", "_").replace("+", "_")
    log = folder / "slurm-4242.out"
    make = oom_progress if name == "one line" else VARIANTS[name]
    if not log.exists():
        folder.mkdir(parents=True, exist_ok=True)
        log.write_text(make(repeats))
    return folder


#: the child: imports first (startup is not what is measured), then times `analyze_paths` and prints the answer
CHILD = """
import json, sys, time
from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.report.text import json_pieces
wall, cpu = time.perf_counter(), time.process_time()
diagnosis = analyze_paths([sys.argv[1]], workers=1)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "answer": json.loads("".join(json_pieces(diagnosis)))}))
"""


def run_once(folder: Path) -> tuple[float, float, float, float, dict]:
    """Wall and CPU seconds of one `ddpslurm analyze DIR --json --jobs 1` (a fresh process: startup included),
    the same of its `analyze_paths` alone (imports done), and its answer."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TREE), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", str(folder), "--json", "--jobs", "1"],
                   capture_output=True, text=True, env=env, check=False, cwd=TREE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, env=env,
                          check=False, cwd=TREE)
    try:
        inner = json.loads(done.stdout)
    except ValueError:
        inner = {"wall": float("nan"), "cpu": float("nan"),
                 "answer": {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}}
    return wall, cpu, inner["wall"], inner["cpu"], inner["answer"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=TREE / ".bench" / "repeated")
    parser.add_argument("--repeats", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", action="append", default=[], help="variant name (repeatable)")
    args = parser.parse_args()
    print("| variant | bytes | command wall s | command CPU s | analyze_paths wall s | analyze_paths CPU s | "
          "cause | rank | evidence lines |")
    print("|---|---|---|---|---|---|---|---|---|")
    names = ["one line", *VARIANTS] if not args.only else [v for v in ("one line", *VARIANTS) if v in args.only]
    for name in names:
        folder = write(args.root.resolve(), name, 1 if name == "one line" else args.repeats)
        runs = [run_once(folder) for _ in range(args.runs)]
        answer = runs[-1][4]
        evidence = answer.get("evidence") or []
        medians = " | ".join(f"{statistics.median(r[i] for r in runs):.3f}" for i in range(4))
        print(f"| {name} | {(folder / 'slurm-4242.out').stat().st_size:,} | {medians} | "
              f"{answer.get('cause', answer.get('error'))} | {answer.get('first_failing_rank')} | {len(evidence)} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
