"""Time of `ddpslurm analyze` on a job folder of pre-flight records (what `submit --preflight --retries` runs after a
failed pre-flight), by node count: the records are judged once per folder, so time grows with the records read.

    python benchmarks/doctor_records_analyze.py [--nodes 64 256 1024] [--runs 3]

Each size writes a doctor folder of sparse-plan records (ddpslurm.doctor.graph's plan; one node cut off from its
peers) with the project's own paths (jobfolder.doctor_record_path), then times `analyze_paths` on it in-process
(best of --runs) and prints seconds, seconds per node, and the node the diagnosis names.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_records(job_dir: Path, count: int) -> str:
    """Records of `count` nodes, the middle one unreachable; returns its name."""
    from ddpslurm.doctor.graph import probe_plan
    from ddpslurm.jobfolder import doctor_record_path

    nodes = [f"gpu-{i:04d}" for i in range(count)]
    bad = nodes[count // 2]
    plan = probe_plan(nodes, "bench")
    for i, node in enumerate(nodes):
        peers = {peer: {"ok": bad not in (node, peer), "error": None if bad not in (node, peer) else
                        "no answer (packets dropped?)", "offset_s": 0.01} for peer in plan.get(node, ())}
        record = {"kind": "doctor", "node": node, "nodes": nodes, "port": 12345,
                  "interface": {"name": "eth0", "address": f"10.0.{i // 250}.{i % 250 + 1}", "requested": False},
                  "resolution": {node: f"10.0.{i // 250}.{i % 250 + 1}"}, "port_bind": {"ok": True, "error": None},
                  "peers": peers, "versions": {"torch": "2.13.0", "cuda": "12.4", "nccl": "2.21.5"}, "gpus": 8,
                  "shm_bytes": 64 << 30, "free_bytes": 500 << 30}
        path = doctor_record_path(job_dir, node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from ddpslurm.analyze.api import analyze_paths
    from ddpslurm.analyze.parse import preflight_records

    print(f"{'nodes':>6} {'seconds':>8} {'ms/node':>8}  named")
    for count in args.nodes:
        with tempfile.TemporaryDirectory() as tmp:
            job_dir = Path(tmp) / "job_1"
            bad = write_records(job_dir, count)
            best, named = float("inf"), None
            for _ in range(args.runs):
                preflight_records._judged.cache_clear()
                start = time.perf_counter()
                result = analyze_paths([job_dir], workers=1).to_dict()
                best = min(best, time.perf_counter() - start)
                named = result.get("first_failing_host")
            print(f"{count:>6} {best:>8.2f} {best / count * 1000:>8.2f}  {named} (cut off: {bad})")


if __name__ == "__main__":
    main()
