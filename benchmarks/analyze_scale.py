"""`ddpslurm analyze` from 512 to 65,536 ranks against `grep -E` over the same files, one table row per job.

    python benchmarks/analyze_scale.py [--root .bench/scale] [--runs 3] [--jobs N] [--cold]
                                       [--job RANKS:GB:LAYOUT:SCENARIO:CULPRIT ...] [--linear]

Each job is generated with make_big_job.py under --root unless it is there already (PLANTED.json), the page cache
is warmed by reading every file and ddpslurm's modules compiled to bytecode (as an installed copy has them), then
analyze and grep each run --runs times, alternately (a shared machine's load hits both). The package measured is
the one in the tree this script sits in, whatever the current folder (to compare two trees, run each one's copy of
this script with the same --root). With --cold (root on Linux) the page cache is dropped before every analyze and
every grep run instead: each reads its files from the disk, as a first look at a job's logs does (Python's own
files too, for analyze).
Printed per job: files, bytes, analyze wall (median), the same a rank, and CPU (user+sys of the process tree,
median), grep wall and CPU (median), wall and CPU ratios, peak RSS of the largest process and of the process tree
(max over runs), and whether every run named the planted cause, rank and host. The default jobs are the issue's:
512 ranks / 1 GB, 4,096 and 16,384 ranks with the culprit past the 20,000th file where there is one, 65,536 ranks,
256 ranks in torchrun per-node logs with a silent straggler, and 16,384 ranks in one merged `slurm-<job>.out`
(srun --label).
--linear measures one shape from 2,048 to 65,536 ranks at the same bytes a rank instead (with any --job) and says
how the time a rank grows from the smallest to the largest.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


throughput = _load("analyze_throughput")
make_big_job = _load("make_big_job")

#: ranks, GB, layout, scenario, culprit (-1: the generator's default, ranks/2 + 3)
DEFAULT_JOBS = ("512:1.0:submitit:oom:-1", "4096:0.4:submitit:oom:4000", "16384:0.5:submitit:oom:11000",
                "65536:1.0:submitit:oom:60001", "256:0.5:torchrun:straggler:77", "16384:0.5:merged:oom:11000",
                "16384:0.5:submitit:straggler:13001", "16384:0.5:torchrun:oom:9001", "16384:0.5:submitit:memkill:9001",
                "16384:0.5:submitit:ibfail:9001", "16384:0.5:submitit:segv:9001",
                "16384:0.5:submitit:inithang:9001", "16384:0.5:submitit:latelost:9001",
                "16384:0.5:submitit:desync:9001")
#: --linear: one job shape at every size from 2,048 to 65,536 ranks, the same bytes a rank (0.5 GB at 65,536 ranks),
#: so that the time a rank takes can be compared across sizes (what grows faster than the ranks shows there)
LINEAR_RANKS = (2048, 4096, 8192, 16384, 32768, 65536)
LINEAR_GB_AT_65536 = 0.5


def linear_jobs() -> list[str]:
    """The --linear jobs: submitit layout, CUDA OOM, the generator's default culprit, bytes in proportion to ranks."""
    return [f"{ranks}:{LINEAR_GB_AT_65536 * ranks / 65536:g}:submitit:oom:-1" for ranks in LINEAR_RANKS]


def growth(rows: list[dict]) -> str:
    """How analyze's wall time a rank changes from the smallest job to the largest of the same layout and scenario:
    one line (what linear growth means: about 1x), or "" where fewer than two sizes of one shape were measured."""
    shapes: dict[tuple, list[dict]] = {}
    for r in rows:
        shapes.setdefault((r["layout"], r["scenario"]), []).append(r)
    lines = []
    for (layout, scenario), same in shapes.items():
        if len({r["ranks"] for r in same}) < 2:
            continue
        small, big = min(same, key=lambda r: r["ranks"]), max(same, key=lambda r: r["ranks"])
        lines.append(f"{layout}/{scenario}: {per_rank_us(big):.0f} us a rank at {big['ranks']:,} ranks against "
                     f"{per_rank_us(small):.0f} at {small['ranks']:,}: {per_rank_us(big) / per_rank_us(small):.2f}x")
    return "\n".join(lines)


def per_rank_us(row: dict) -> float:
    """Analyze's wall time (median) a rank, in microseconds."""
    return row["wall"] / row["ranks"] * 1e6


def job_spec(text: str) -> str:
    """A --job value, checked (an argparse type: a bad one is one line and exit 2, not a generator's traceback)."""
    try:
        ranks, gb, layout, scenario, culprit = text.split(":")
        ok = int(ranks) > 0 and 0 < float(gb) < 1e4 and int(culprit) >= -1 and layout in make_big_job.LAYOUTS \
            and scenario in make_big_job.SCENARIOS
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not RANKS:GB:LAYOUT:SCENARIO:CULPRIT (layouts {', '.join(make_big_job.LAYOUTS)}; scenarios "
            f"{', '.join(make_big_job.SCENARIOS)}; culprit -1 for the generator's default)")
    return text


def positive(text: str) -> int:
    """A count of runs: a positive whole number (an argparse type)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def planted_answer(folder: Path) -> dict:
    """The answer the generator planted in a job (cause, rank, host), as `analyze --json` names it."""
    planted = json.loads((folder / "PLANTED.json").read_text())
    return {k: planted[k] for k in ("cause", "first_failing_rank", "first_failing_host")}


def grep_argv(folder: Path) -> list[str]:
    """The grep every analyze run is compared with: the benchmarks' pattern over the folder, line numbers and names."""
    return ["grep", "-E", "-n", "-H", "-r", throughput.GREP_PATTERN, str(folder)]


def job_folder(root: Path, spec: str) -> Path:
    ranks, gb, layout, scenario, culprit = spec.split(":")
    folder = root / f"r{ranks}_{layout}_{scenario}_c{culprit}_gb{gb}"
    if not (folder / "PLANTED.json").is_file():
        argv = [sys.executable, str(HERE / "make_big_job.py"), "--ranks", ranks, "--gb", gb, "--out", str(folder),
                "--layout", layout, "--scenario", scenario]
        if int(culprit) >= 0:
            argv += ["--culprit", culprit]
        made = subprocess.run(argv, stderr=subprocess.PIPE, text=True)
        if made.returncode:  # a job the generator cannot write (a scenario its layout cannot hold): its own line
            raise SystemExit(made.stderr.strip().splitlines()[-1] if made.stderr.strip() else
                             f"make_big_job.py could not write {spec} (exit {made.returncode})")
    return folder


def log_files(folder: Path) -> list[Path]:
    """The job's logs, of any layout (torchrun --log-dir's are in a folder per worker)."""
    return sorted(p for p in folder.rglob("*") if p.name.endswith(("_log.out", "_log.err", "stdout.log", "stderr.log"))
                  or (p.name.startswith("slurm-") and p.name.endswith(".out")))


def drop_page_cache() -> None:
    """Write dirty pages back and drop the page cache (root, Linux): the next reads come from the disk."""
    os.sync()
    DROP_CACHES.write_text("3\n")


def measure_job(folder: Path, runs: int, jobs: int | None, cold: bool = False) -> dict:
    files = log_files(folder)
    planted = json.loads((folder / "PLANTED.json").read_text())
    wanted = planted_answer(folder)
    for path in () if cold else files:  # warm the page cache (65k names are too many for one `cat` command line)
        path.read_bytes()
    before = drop_page_cache if cold else (lambda: None)
    analyze_argv = [sys.executable, "-m", "ddpslurm.cli", "analyze", str(folder), "--json"]
    analyze_argv += ["--jobs", str(jobs)] if jobs else []
    analyze_runs, grep_runs, right = [], [], True
    for _ in range(runs):
        before()
        run = throughput.measure(analyze_argv)
        got = json.loads(run.stdout) if run.returncode == 0 else {}
        right = right and {k: got.get(k) for k in wanted} == wanted
        analyze_runs.append(run)
        before()
        grep_runs.append(throughput.measure(grep_argv(folder)))
    wall = statistics.median(r.seconds for r in analyze_runs)
    cpu = statistics.median(r.cpu_seconds for r in analyze_runs)
    gwall = statistics.median(r.seconds for r in grep_runs)
    gcpu = statistics.median(r.cpu_seconds for r in grep_runs)
    return {"ranks": planted["ranks"], "layout": planted.get("layout", "submitit"), "scenario": planted.get("scenario"),
            "culprit": planted["first_failing_rank"], "files": len(files),
            "bytes": sum(p.stat().st_size for p in files), "wall": wall, "cpu": cpu, "grep_wall": gwall,
            "grep_cpu": gcpu, "rss_max": max(r.max_rss_mb for r in analyze_runs),
            "rss_tree": max(r.tree_rss_mb for r in analyze_runs), "right": right,
            "walls": [round(r.seconds, 2) for r in analyze_runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(".bench/scale"))
    parser.add_argument("--runs", type=positive, default=3)
    parser.add_argument("--jobs", type=positive, default=None, help="passed to `ddpslurm analyze --jobs`")
    parser.add_argument("--job", type=job_spec, action="append", help="RANKS:GB:LAYOUT:SCENARIO:CULPRIT (repeatable)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before every run (root, Linux)")
    parser.add_argument("--linear", action="store_true",
                        help=f"one job shape at {', '.join(f'{r:,}' for r in LINEAR_RANKS)} ranks, the same bytes "
                             "a rank (added to any --job), and how the time a rank grows")
    args = parser.parse_args()
    if args.cold:
        try:
            drop_page_cache()
        except OSError as error:
            parser.error(f"--cold cannot drop the page cache ({DROP_CACHES}: {error.strerror or error}): run it as "
                         "root on Linux, or leave --cold out")
    args.root = args.root.resolve()  # the timed commands run in the measured tree (analyze_throughput.TREE)
    print(throughput.measured_tree())
    throughput.compile_package()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start, python "
          f"{sys.version.split()[0]}, medians of {args.runs} alternating runs, "
          f"{'page cache dropped before each run' if args.cold else 'warm page cache'}")
    print("| ranks | layout | scenario | culprit | files | GB | analyze wall s | us a rank | analyze CPU s | "
          "grep wall s | grep CPU s | ratio wall | ratio CPU | RSS MB max proc / tree | diagnosis |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    specs = [*(args.job or ([] if args.linear else DEFAULT_JOBS)), *(linear_jobs() if args.linear else [])]
    rows = []
    for spec in specs:
        r = measure_job(job_folder(args.root, spec), args.runs, args.jobs, args.cold)
        rows.append(r)
        culprit = "its node" if r["culprit"] is None else r["culprit"]
        print(f"| {r['ranks']:,} | {r['layout']} | {r['scenario']} | {culprit} | {r['files']:,} | "
              f"{r['bytes'] / 1e9:.2f} | "
              f"{r['wall']:.2f} | {per_rank_us(r):.0f} | {r['cpu']:.2f} | {r['grep_wall']:.2f} | {r['grep_cpu']:.2f} | "
              f"{r['wall'] / r['grep_wall']:.1f}x | {r['cpu'] / max(r['grep_cpu'], 1e-3):.1f}x | "
              f"{r['rss_max']:.0f} / {r['rss_tree']:.0f} | {'RIGHT' if r['right'] else 'WRONG'} |", flush=True)
    grown = growth(rows)
    if grown:
        print(grown)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
