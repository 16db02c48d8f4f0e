"""Time the start of the command line: `ddpslurm --help` and `python -c "import ddpslurm.cli"`.

    python benchmarks/cli_startup.py [--runs 20]

Uses hyperfine when it is installed (its own warmup and statistics); otherwise a Python loop of --runs fresh
processes after one warmup run, printing min and median wall time in milliseconds. Also reports whether the
import pulled in torch, pandas, submitit or numpy (it must not: tests/unit/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
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


def loop(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)  # warmup
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return times


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
        print(f"{'command':32} {'min ms':>8} {'median ms':>10}")
        for name, argv in COMMANDS.items():
            times = loop(argv, args.runs)
            print(f"{name:32} {min(times):>8.1f} {statistics.median(times):>10.1f}")
    heavy = heavy_modules()
    print("heavy modules imported by `import ddpslurm.cli`: " + (", ".join(heavy) if heavy else "none"))


if __name__ == "__main__":
    main()
