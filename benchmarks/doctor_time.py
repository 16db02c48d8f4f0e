"""Wall time of `ddpslurm doctor` on the local cluster: healthy at 2 and 3 nodes, and the time until a node
whose namespace drops TCP to its peers is named (the README's figures).

    sudo python benchmarks/doctor_time.py [--cluster NAME] [--runs N] [--window S ...]

The cluster (`slurm/cluster --name NAME up --nodes 3`, default `doc`) must be up and idle. The fault is an
nftables table in the second node's namespace that drops new TCP connections on ports 10000-29999 (ddpslurm's
MASTER_PORT range), in and out (Slurm's own ports stay open); it is removed at the end. Times are the whole
command (srun included) and, in brackets, first probe start to last record on the nodes.

With the fault on, it also times `submit --preflight --retries 2` of a 2-node examples/train.py run (it lands on
the first two nodes, the second firewalled): the whole chain, and the time until the job that avoids the node
was submitted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = "ddpslurm_doctor_bench"


def cluster_env(name: str) -> dict[str, str]:
    out = subprocess.run([str(REPO / "slurm" / "cluster"), "--name", name, "env"], capture_output=True, text=True,
                         check=True).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    return env


def doctor(env: dict[str, str], folder: str, nodes: int, *args: str) -> tuple[float, float, list[str]]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "doctor", "--nodes", str(nodes), "--folder", folder,
                           "--json", *args], capture_output=True, text=True, env=env, timeout=600)
    wall = time.monotonic() - started
    result = json.loads(done.stdout)
    recs = [json.loads(p.read_text()) for p in Path(result["folder"], "doctor").glob("node_*.json")]
    on_nodes = max(r["finished"] for r in recs) - min(r["started"] for r in recs)
    return wall, on_nodes, result["failing_nodes"]


def retry_chain(env: dict[str, str], folder: str) -> tuple[float, float, list[str]]:
    """`submit --preflight --retries 2` end to end: wall time, time to the resubmission, each job's decision."""
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "submit", str(REPO / "examples" / "train.py"),
                           "--nodes", "2", "--preflight", "--retries", "2", "--time", "5", "--folder", folder, "--json",
                           "--", "--epochs", "1", "--steps-per-epoch", "4", "--checkpoint-dir", f"{folder}/ckpt"],
                          capture_output=True, text=True, env=env, timeout=600)
    wall = time.time() - started
    chain = json.loads(done.stdout.splitlines()[-1])
    attempts = chain["attempts"]
    second = json.loads(Path(attempts[1]["folder"], "ddpslurm.json").read_text()) if len(attempts) > 1 else None
    to_resubmit = second["submit_unix"] - started if second else float("nan")
    return wall, to_resubmit, [f"{a['job_id']} on {','.join(a['nodes'])}: {a['decision']}" for a in attempts]


def firewall(node: str, on: bool) -> None:
    nft = ["nsenter", f"--net=/run/netns/dds-{node}", "nft"]
    if not on:
        subprocess.run([*nft, "delete", "table", "inet", TABLE], check=False)
        return
    drop = "tcp dport 10000-29999 ct state new drop;"
    rules = (f"table inet {TABLE} {{\n"
             f" chain input {{ type filter hook input priority 0; policy accept; {drop} }}\n"
             f" chain output {{ type filter hook output priority 0; policy accept; {drop} }}\n"
             "}\n")
    subprocess.run([*nft, "-f", "-"], input=rules, text=True, check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", default="doc")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", type=float, nargs="*", default=[10.0, 3.0])
    args = parser.parse_args()
    env = cluster_env(args.cluster)
    nodes = sorted(set(subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, env=env,
                                      check=True).stdout.split()))
    with tempfile.TemporaryDirectory() as folder:
        for count in (2, 3):
            runs = [doctor(env, folder, count) for _ in range(args.runs)]
            print(f"healthy, {count} nodes: " + ", ".join(f"{w:.1f} s ({n:.1f} s)" for w, n, _ in runs))
        firewall(nodes[1], on=True)
        try:
            for window in args.window:
                runs = [doctor(env, folder, 3, "--window", f"{window:g}") for _ in range(args.runs)]
                print(f"{nodes[1]} firewalled, 3 nodes, --window {window:g}: "
                      + ", ".join(f"{w:.1f} s ({n:.1f} s) -> {f}" for w, n, f in runs))
            for _ in range(args.runs):
                wall, to_resubmit, decisions = retry_chain(env, folder)
                print(f"{nodes[1]} firewalled, submit --preflight --retries 2 (2 nodes): done in {wall:.1f} s, "
                      f"resubmitted after {to_resubmit:.1f} s; " + "; ".join(decisions))
        finally:
            firewall(nodes[1], on=False)
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
