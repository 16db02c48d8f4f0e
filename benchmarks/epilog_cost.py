"""What `ddpslurm epilog` (the EpilogSlurmctld / `strigger --fini` hook) costs per job, and how it bounds itself.

    python benchmarks/epilog_cost.py [--runs 5] [--root /tmp/ddpslurm-bench-epilog] [--gb 10] [--max-bytes 33554432]

Runs the hook as slurmctld runs it, a fresh process with the EpilogSlurmctld variables slurmctld 22.05 sets,
without Slurm (`--no-record`: nothing is written to accounting), as root for a job of user `nobody` (so the
hook reads through a child that has become the job's user, as on a site; --root must be one it can traverse),
and prints one row per scenario: wall ms
(median of --runs) until the hook returns to its caller (what slurmctld waits for), and for the detached
analysis (`--foreground`) its wall ms, CPU ms, peak RSS and the outcome it logs:

- a job that succeeded (the common case: one look at the environment);
- a failed job with a small log (an OOM traceback): the detach, then the analysis;
- a failed job whose StdOut is a --gb GB file (sparse, the failure at its end): read within --max-bytes;
- a failed job whose output file is missing;
- a failed job whose output the job's user cannot read (as root: the file is root's, mode 0600, the job's user
  is nobody; the hook reads as the job's user);
- a failed job whose StdOut is a fifo (a reader would block) and one whose StdOut is a symlink to another file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

OOM = ("Traceback (most recent call last):\n  File \"/home/u/train.py\", line 40, in <module>\n"
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.15 GiB of which 1.06 GiB is free.\n")


NOBODY = 65534


def env_for(job_id: str, stdout: Path, failed: bool = True, uid: int | None = None) -> dict[str, str]:
    uid = (NOBODY if os.geteuid() == 0 else os.geteuid()) if uid is None else uid
    return {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_JOB_EXIT_CODE": "256" if failed else "0",
            "SLURM_JOB_EXIT_CODE2": "1:0" if failed else "0:0", "SLURM_JOB_DERIVED_EC": "0",
            "SLURM_JOB_STDOUT": str(stdout), "SLURM_JOB_STDERR": str(stdout), "SLURM_JOB_WORK_DIR": str(stdout.parent),
            "SLURM_JOB_UID": str(uid), "SLURM_JOB_GID": str(uid), "SLURM_JOB_USER": "nobody" if uid == NOBODY else "",
            "SLURM_JOB_NODELIST": "node07", "SLURM_JOB_NAME": "bench", "SLURM_JOB_COMMENT": "",
            "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld"}


def hook(env: dict[str, str], log: Path, *flags: str) -> tuple[float, float, int]:
    """Run `ddpslurm epilog` once: wall ms, CPU ms and peak RSS MB of its process tree (wait4: the process and
    the children it waited for, the analysis among them; a detached copy is not counted)."""
    argv = [sys.executable, "-m", "ddpslurm.cli", "epilog", "--no-record", "--log", str(log), *flags]
    start = time.perf_counter()
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"ddpslurm epilog exited {child.returncode}: it must always exit 0")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000, usage.ru_maxrss // 1024


def last_entry(log: Path, job_id: str) -> dict:
    lines = [json.loads(x) for x in log.read_text().splitlines() if f'"{job_id}"' in x] if log.exists() else []
    return lines[-1] if lines else {}


def scenario(name: str, env: dict[str, str], root: Path, runs: int, max_bytes: int) -> None:
    log = root / f"{name}.log"
    log.unlink(missing_ok=True)
    returns = [hook(env, log, "--max-bytes", str(max_bytes))[0] for _ in range(runs)]  # detached: returns at once
    time.sleep(0.5)
    fg = [hook(env, log, "--foreground", "--max-bytes", str(max_bytes)) for _ in range(runs)]
    entry = last_entry(log, env["SLURM_JOB_ID"])
    outcome = entry.get("outcome", "nothing logged (success: nothing to do)")
    files = entry.get("files") or [{}]
    detail = entry.get("line") or files[0].get("error") or entry.get("why") or ""
    read = files[0].get("size"), files[0].get("whole")
    print(f"| {name} | {statistics.median(returns):.0f} | {statistics.median(f[0] for f in fg):.0f} | "
          f"{statistics.median(f[1] for f in fg):.0f} | {max(f[2] for f in fg)} | {outcome} | "
          f"{'' if read[0] is None else f'{read[0]:,} B, whole={read[1]}'} | {detail[:90]} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--root", default="/tmp/ddpslurm-bench-epilog")
    parser.add_argument("--gb", type=float, default=10.0)
    parser.add_argument("--max-bytes", type=int, default=32 * 1024 * 1024)
    args = parser.parse_args()
    root = Path(args.root).absolute()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    root.chmod(0o755)
    small = root / "slurm-101.out"
    small.write_text("epoch 1 step 10 loss 2.3\n" * 200 + OOM)
    small.chmod(0o644)
    big = root / "slurm-102.out"
    with open(big, "wb") as out:
        out.write(b"NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>\n")
        out.seek(int(args.gb * 1e9) - len(OOM))
        out.write(OOM.encode())
    big.chmod(0o644)
    closed = root / "slurm-104.out"
    closed.write_text(OOM)
    closed.chmod(0o600)
    os.mkfifo(root / "slurm-105.out")
    (root / "slurm-106.out").symlink_to(small)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, runs={args.runs}, max-bytes={args.max_bytes:,}, "
          f"euid={os.geteuid()}, load {os.getloadavg()[0]:.1f}")
    print("| scenario | hook returns, ms | analysis wall ms | analysis CPU ms | peak RSS MB | outcome | StdOut | "
          "line or reason |")
    print("|---|---|---|---|---|---|---|---|")
    scenario("succeeded", env_for("100", small, failed=False), root, args.runs, args.max_bytes)
    scenario("failed, 5 KB log", env_for("101", small), root, args.runs, args.max_bytes)
    scenario(f"failed, {args.gb:g} GB sparse log", env_for("102", big), root, args.runs, args.max_bytes)
    scenario("failed, output missing", env_for("103", root / "slurm-103.out"), root, args.runs, args.max_bytes)
    if os.geteuid() == 0:
        scenario("failed, unreadable by the job's user", env_for("104", closed), root, args.runs, args.max_bytes)
    else:
        print("| failed, unreadable | - | - | - | - | needs root (the hook reads as the job's user) | | |")
    scenario("failed, StdOut a fifo", env_for("105", root / "slurm-105.out"), root, args.runs, args.max_bytes)
    scenario("failed, StdOut a symlink", env_for("106", root / "slurm-106.out"), root, args.runs, args.max_bytes)


if __name__ == "__main__":
    main()
