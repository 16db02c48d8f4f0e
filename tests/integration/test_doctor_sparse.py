"""`ddpslurm doctor` past the all-to-all size on a real cluster of its own (7 nodes > k+2): every node tests only its
planned links (ring successor, rank-0 host, k random peers), and a firewalled node is still the one node named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddpslurm.doctor.graph import RANDOM_PEERS, all_to_all
from tests.conftest import CLUSTER_SCRIPT
from tests.integration.test_doctor import DDP_PORTS

pytestmark = pytest.mark.slurm

NODES = 7


def doctor(cluster, folder: Path) -> dict:
    done = cluster.run([sys.executable, "-m", "ddpslurm.cli", "doctor", "--nodes", str(NODES), "--folder",
                        str(folder), "--json"], check=False, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def records(result: dict) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(result["folder"], "doctor").glob("node_*.json"))]


def test_a_sparse_preflight_names_the_firewalled_node(slurm_cluster, slurm_cluster_named, tmp_path: Path) -> None:
    assert not all_to_all(NODES)
    name = f"{slurm_cluster.name[:6]}sp"
    up = subprocess.run([str(CLUSTER_SCRIPT), "--name", name, "up", "--nodes", str(NODES)], capture_output=True,
                        text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        cluster = slurm_cluster_named(name)
        healthy = doctor(cluster, tmp_path / "healthy")
        assert (healthy["ok"], healthy["failing_nodes"]) == (True, []), healthy
        seen = records(healthy)
        assert len(seen) == NODES and all(not r["plan"]["all_to_all"] for r in seen)
        assert all(len(r["peers"]) <= RANDOM_PEERS + 2 for r in seen)
        assert sum(len(r["peers"]) for r in seen) < NODES * (NODES - 1)
        assert all(set(r["heard_from"]) == set(r["plan"]["in"]) for r in seen)  # every planned peer came
        bad = sorted(r["node"] for r in seen)[4]
        drop = f"tcp dport {DDP_PORTS} ct state new drop;"
        rules = (f"table inet dds_sparse_test {{\n chain input {{ type filter hook input priority 0; policy accept; "
                 f"{drop} }}\n chain output {{ type filter hook output priority 0; policy accept; {drop} }}\n}}\n")
        netns = ["nsenter", f"--net=/run/netns/dds-{bad}", "nft"]
        subprocess.run([*netns, "-f", "-"], input=rules, text=True, check=True, timeout=30)
        try:
            result = doctor(cluster, tmp_path / "firewalled")
        finally:
            subprocess.run([*netns, "delete", "table", "inet", "dds_sparse_test"], check=False, timeout=30)
        assert (result["ok"], result["failing_nodes"]) == (False, [bad]), result
        assert {c["name"] for c in result["checks"] if not c["ok"]} <= {"master_port", "peers"}
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "--name", name, "down"], capture_output=True, timeout=300)
