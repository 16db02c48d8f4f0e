"""Time the start of the command line: `ddpslurm --help` and `python -c "import ddpslurm.cli"`.

    python benchmarks/cli_startup.py [--runs 20]

Uses hyperfine when it is installed (its own warmup and statistics); otherwise a Python loop of --runs fresh
processes after one warmup run, printing min and median wall and CPU (user+sys) time in milliseconds (CPU time is
what to compare on a loaded machine). Also reports whether the
import pulled in torch, pandas, submitit or numpy (it must not: tests/unit/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "pandas", "submitit", "numpy")
COMMANDS = {
    "ddpslurm --help": [sys.executable, "-m", "ddpslurm.cli", "--help"],
    "import ddpslurm.cli": [sys.executable, "-c", "import ddpslurm.cli"],
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def loop(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (user+sys) milliseconds of `runs` fresh processes, after one warmup run."""
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)  # warmup
    wall, cpu = [], []
    for _ in range(runs):
        start, cpu0 = time.perf_counter(), _children_cpu()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((_children_cpu() - cpu0) * 1000)
    return wall, cpu


def heavy_modules() -> list[str]:
    code = ("import sys, ddpslurm.cli; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    hyperfine = shutil.which("hyperfine")
    if hyperfine:
        subprocess.run([hyperfine, "--warmup", "2", "--runs", str(args.runs),
                        *[" ".join(argv) for argv in COMMANDS.values()]], check=True)
    else:
        print(f"hyperfine not installed: Python loop, {args.runs} runs after 1 warmup")
        print(f"{'command':32} {'min ms':>8} {'median ms':>10} {'cpu min ms':>11} {'cpu median ms':>14}")
        for name, argv in COMMANDS.items():
            wall, cpu = loop(argv, args.runs)
            print(f"{name:32} {min(wall):>8.1f} {statistics.median(wall):>10.1f} {min(cpu):>11.1f} "
                  f"{statistics.median(cpu):>14.1f}")
    heavy = heavy_modules()
    print("heavy modules imported by `import ddpslurm.cli`: " + (", ".join(heavy) if heavy else "none"))


if __name__ == "__main__":
    main()
