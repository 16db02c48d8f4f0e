"""Measure `ddpslurm analyze` on a large job folder against `grep -E` over the same files.

    python benchmarks/analyze_throughput.py [--folder .bench/big_job] [--ranks 512 --gb 1.0] [--runs 3]
                                            [--jobs N] [--linearity] [--no-generate]

Generates the folder with make_big_job.py unless it exists (or --no-generate), checks that the diagnosis names the
planted cause, rank and host (PLANTED.json), and prints: bytes, analyze time (best of --runs, warm page cache),
GB/s, peak RSS (largest single process, and the whole process tree sampled every 20 ms), grep time, ratio.
--linearity also runs analyze on the first 1/4 and 1/2 of the rank files and prints seconds per GB for each size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the tree whose package these benchmarks measure: the one they sit in. `python -m ddpslurm.cli` finds the package in
#: the current folder before PYTHONPATH, so each timed command runs there, with PYTHONPATH naming it too
TREE = HERE.parent
#: what a person greps for in a failed job: the same families the analyzer's signatures look for
GREP_PATTERN = ("Traceback|Error|error:|NCCL WARN|Watchdog caught|failure detected by watchdog|out of memory|"
                "CANCELLED|Killed|Segmentation fault|closing signal|exitcode|Connection (closed|reset)|timed out|"
                "Xid|ECC|oom_kill|Exited with exit code")


@dataclass
class Run:
    seconds: float
    cpu_seconds: float     # user + system time of the whole process tree (robust to a loaded machine)
    max_rss_mb: float      # largest single process (getrusage of the children)
    tree_rss_mb: float     # sum over the process tree, sampled
    stdout: str
    returncode: int


def _tree_rss_kb(root: int) -> int:
    """Sum of VmRSS over `root` and its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ppid = int(fields[1])
            with open(f"/proc/{entry}/statm") as f:
                pages = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
        rss[int(entry)] = pages * (os.sysconf("SC_PAGE_SIZE") // 1024)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def measure(argv: list[str]) -> Run:
    """Run argv once; wall time, peak RSS of the largest process and of the sampled process tree."""
    wrapper = ("import resource, subprocess, sys\n"
               "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
               "sys.stdout.buffer.write(p.stdout)\n"
               "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
               "sys.stderr.write(f'{u.ru_maxrss} {u.ru_utime + u.ru_stime}')\n"
               "sys.exit(p.returncode)\n")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", wrapper, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=TREE, env=tree_environ())
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    max_rss_kb, cpu = err.strip().splitlines()[-1].split() if err.strip() else ("0", "0")
    return Run(seconds, float(cpu), int(max_rss_kb) / 1024, peak[0] / 1024, out, proc.returncode)


def tree_environ() -> dict[str, str]:
    """This environment with TREE first on PYTHONPATH."""
    paths = [str(TREE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def measured_tree() -> str:
    """Which package the timed commands import, and its commit: the first line of every benchmark's output."""
    done = subprocess.run(["git", "-C", str(TREE), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return f"measuring {TREE / 'ddpslurm'} at {done.stdout.strip() or 'an unknown commit'}"


def compile_package() -> None:
    """The measured package's modules compiled to bytecode before anything is timed, as `pip install` leaves them:
    where PYTHONDONTWRITEBYTECODE is set (this project's machines), every run would otherwise compile the ~25
    modules analyze imports again, 0.12 s of its time that no installed copy pays."""
    import compileall

    compileall.compile_dir(TREE / "ddpslurm", quiet=1)


def best(argv: list[str], runs: int) -> Run:
    results = [measure(argv) for _ in range(runs)]
    return min(results, key=lambda r: r.seconds)


def rank_files(folder: Path) -> list[Path]:
    """The log files of the job, ordered by rank (the task id in `<job>_<task>_log.*`)."""
    files = [p for p in folder.iterdir() if p.name.endswith(("_log.out", "_log.err"))]
    return sorted(files, key=lambda p: (int(p.name.split("_")[1]), p.name))


def warm(files: list[Path]) -> None:
    """Every file read once (the page cache warmed), in this process: 131k names do not fit one `cat` argv."""
    for path in files:
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass


#: the most file names grep is given on its command line; a job with more is searched as the folder (`-r` with the
#: rank files' name patterns), the same files
GREP_ARGV_FILES = 20_000


def grep_command(folder: Path, files: list[Path]) -> list[str]:
    """`grep -E` over the rank files: named one by one, or for a job of more than GREP_ARGV_FILES files (an argv
    the kernel refuses) the folder searched for their name patterns."""
    if len(files) <= GREP_ARGV_FILES:
        return ["grep", "-E", "-n", "-H", GREP_PATTERN, *map(str, files)]
    return ["grep", "-E", "-n", "-H", "-r", "--include=*_log.out", "--include=*_log.err", GREP_PATTERN, str(folder)]


def analyze_argv(paths: list[Path], jobs: int | None) -> list[str]:
    argv = [sys.executable, "-m", "ddpslurm.cli", "analyze", *map(str, paths), "--json"]
    return argv + (["--jobs", str(jobs)] if jobs else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path(".bench/big_job"))
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3, help="timed runs per measurement (best is reported)")
    parser.add_argument("--jobs", type=int, default=None, help="passed to `ddpslurm analyze --jobs`")
    parser.add_argument("--linearity", action="store_true", help="also time 1/4 and 1/2 of the rank files")
    parser.add_argument("--no-generate", action="store_true", help="never generate, use --folder as it is")
    args = parser.parse_args()

    planted_file = args.folder / "PLANTED.json"
    if not planted_file.is_file():
        if args.no_generate:
            raise SystemExit(f"{args.folder} has no PLANTED.json: generate it with benchmarks/make_big_job.py")
        subprocess.run([sys.executable, str(HERE / "make_big_job.py"), "--ranks", str(args.ranks), "--gb",
                        str(args.gb), "--out", str(args.folder)], check=True)
    args.folder = args.folder.resolve()  # the timed commands run in TREE
    planted = json.loads(planted_file.read_text())
    files = rank_files(args.folder)
    size = sum(p.stat().st_size for p in files)

    print(measured_tree())
    compile_package()
    # warm the page cache (and check the answer) once before timing anything
    warm(files)
    first = measure(analyze_argv([args.folder], args.jobs))
    if first.returncode != 0:
        raise SystemExit(f"ddpslurm analyze exited {first.returncode}")
    got = json.loads(first.stdout)
    wanted = {k: planted[k] for k in ("cause", "first_failing_rank", "first_failing_host")}
    answer = {k: got[k] for k in wanted}
    print(f"diagnosis: {answer}  planted: {wanted}  -> {'RIGHT' if answer == wanted else 'WRONG'}")

    grep_argv = grep_command(args.folder, files)
    subprocess.run(grep_argv, stdout=subprocess.DEVNULL)
    analyze = best(analyze_argv([args.folder], args.jobs), args.runs)
    grep = best(grep_argv, args.runs)

    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, analyze --jobs {args.jobs or 'default'}, "
          f"best of {args.runs}, warm cache")
    print(f"load average before: {os.getloadavg()[0]:.1f} (wall times are only meaningful on an idle machine; "
          "CPU seconds are user+sys of the whole process tree)")
    print(f"{'bytes':>14} {'analyze s':>10} {'GB/s':>7} {'analyze cpu s':>14} {'RSS MB (max proc)':>18} "
          f"{'RSS MB (tree)':>14} {'grep s':>8} {'grep cpu s':>11} {'ratio wall':>11} {'ratio cpu':>10}")
    print(f"{size:>14,} {analyze.seconds:>10.2f} {size / 1e9 / analyze.seconds:>7.3f} {analyze.cpu_seconds:>14.2f} "
          f"{analyze.max_rss_mb:>18.0f} {analyze.tree_rss_mb:>14.0f} {grep.seconds:>8.2f} {grep.cpu_seconds:>11.2f} "
          f"{analyze.seconds / grep.seconds:>10.1f}x {analyze.cpu_seconds / max(grep.cpu_seconds, 1e-3):>9.1f}x")

    if args.linearity:
        ranks = sorted({int(p.name.split("_")[1]) for p in files})
        print(f"\nlinearity ({len(ranks)} ranks in the full job):")
        print(f"{'fraction':>9} {'files':>6} {'bytes':>14} {'analyze s':>10} {'s per GB':>9} {'cpu s':>8} "
              f"{'cpu s per GB':>13}")
        for frac in (0.25, 0.5, 1.0):
            keep = set(ranks[: max(1, int(len(ranks) * frac))])
            subset = [p for p in files if int(p.name.split("_")[1]) in keep]
            sub_size = sum(p.stat().st_size for p in subset)
            run = best(analyze_argv(subset, args.jobs), args.runs)
            print(f"{frac:>9.2f} {len(subset):>6} {sub_size:>14,} {run.seconds:>10.2f} "
                  f"{run.seconds / (sub_size / 1e9):>9.2f} {run.cpu_seconds:>8.2f} "
                  f"{run.cpu_seconds / (sub_size / 1e9):>13.2f}")


if __name__ == "__main__":
    main()
