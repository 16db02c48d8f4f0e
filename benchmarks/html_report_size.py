"""Size and render time of `analyze --html` for big jobs (target: <= 5 MB at 16,384 ranks).

Usage: python benchmarks/html_report_size.py [--ranks 16384] [--per-node 8] [--chromium]

Builds Diagnoses the way the engine fills them (ranks, evidence, per-rank timeline, a Slurm job event) for
three shapes of job and prints, per shape: ranks, timeline rows, runs drawn, HTML bytes, render seconds and,
with --chromium, the wall seconds headless Chromium takes to load the page and dump its DOM.
  alike:     one culprit (CUDA OOM) mid-job, every other rank a watchdog timeout (numbers differ only)
  scattered: as alike, with every 7th rank silent (role unknown, no time) and every 13th exited ok
  distinct:  the worst case: every rank a message of its own shape, so no two neighbours collapse
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpslurm.analyze.model import Diagnosis, Evidence, RankRow
from ddpslurm.analyze.report.html import render_html
from ddpslurm.analyze.report.html_timeline import build_model

T0 = 1_795_370_500.0
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett")


def _message(shape: str, rank: int, culprit: int) -> tuple[str, str, float | None]:
    if rank == culprit:
        return "culprit", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", T0 + 3.0
    if shape == "scattered" and rank % 7 == 0:
        return "unknown", "", None
    if shape == "scattered" and rank % 13 == 0:
        return "ok", "exited 0", T0 + 601.0
    if shape == "distinct":
        word = "".join(WORDS[int(d)] for d in str(rank))
        return "victim", f"[rank{rank}]: RuntimeError: {word} failed waiting for the collective", T0 + 600 + rank / 1e3
    return "victim", (f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: "
                      f"WorkNCCL(SeqNum={4000 + rank % 3}, OpType=ALLREDUCE) ran for 600044 milliseconds"), \
        T0 + 600 + random.random()


def diagnosis(shape: str, ranks: int, per_node: int) -> Diagnosis:
    culprit = ranks // 2 + 3
    rows, table, evidence = [], [], []
    for rank in range(ranks):
        host = f"gpu-{rank // per_node:05d}"
        role, text, when = _message(shape, rank, culprit)
        table.append(RankRow(rank, host, role, text or None))
        rows.append(SimpleNamespace(rank=rank, host=host, role=role, first_failure_time=when,
                                    first_failure_text=text, last_time=when, exit_status=None))
        if (text and rank % 64 == 0) or rank == culprit:
            evidence.append(Evidence(f"/scratch/job_1/1_{rank}_log.err", 100 + rank, rank, None, text))
    result = Diagnosis("cuda_oom", culprit, table[culprit].host, "high", "Rank ran out of GPU memory.",
                       ["Lower the batch size."], evidence[:40], table, "stop", [])
    result.timeline = rows
    result.job_events = [Evidence("/scratch/job_1/1_0_log.err", 9, None, "2026-11-22T18:18:50Z",
                                  "slurmstepd: error: *** STEP 1.0 ON gpu-00000 CANCELLED AT 2026-11-22T18:18:50 ***")]
    return result


def chromium_seconds(page: str) -> float | None:
    browser = shutil.which("chromium")
    if browser is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.html"
        path.write_text(page, encoding="utf-8")
        started = time.perf_counter()
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp}/p",
                        "--dump-dom", path.as_uri()], capture_output=True, check=True, timeout=300)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--chromium", action="store_true", help="also time headless Chromium loading the page")
    args = parser.parse_args()
    random.seed(7)
    print("| job | ranks | rows | runs | HTML bytes | render s | chromium load+dump s |")
    print("|---|---|---|---|---|---|---|")
    for shape in ("alike", "scattered", "distinct"):
        built = diagnosis(shape, args.ranks, args.per_node)
        started = time.perf_counter()
        page = render_html(built)
        seconds = time.perf_counter() - started
        model = build_model(built)
        runs = sum(len(row.runs) for row in model.rows)
        browser = chromium_seconds(page) if args.chromium else None
        shown = "-" if browser is None else f"{browser:.2f}"
        print(f"| {shape} | {args.ranks} | {len(model.rows)} | {runs} | {len(page.encode()):,} | {seconds:.2f} "
              f"| {shown} |")


if __name__ == "__main__":
    main()
