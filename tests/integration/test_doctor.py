"""`ddpslurm doctor` on the real local cluster: a healthy allocation passes; a node whose namespace drops TCP
to its peers, or lacks the interface asked for, is the one node named, in seconds; `analyze` reads it too."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

#: TCP on ddpslurm's MASTER_PORT range (10000-29999), in and out; new connections only, so Slurm's own ports
#: (6817-6819, srun's ephemeral I/O ports: no SrunPortRange here) and its replies stay open.
DDP_PORTS = "10000-29999"


def nodes_of(cluster) -> list[str]:
    out = cluster.run(["sinfo", "--noheader", "--Node", "--format=%N"]).stdout.split()
    return sorted(set(out))


def doctor(cluster, folder: Path, *args: str, nodes: int = 3) -> tuple[int, dict]:
    done = cluster.run([sys.executable, "-m", "ddpslurm.cli", "doctor", "--nodes", str(nodes), "--folder", str(folder),
                        "--json", *args], check=False, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def run_seconds(result: dict) -> float:
    """How long the checks ran on the nodes, first start to last record (a queue wait excluded)."""
    records = [json.loads(p.read_text()) for p in Path(result["folder"], "doctor").glob("node_*.json")]
    return max(r["finished"] for r in records) - min(r["started"] for r in records)


def analyze(cluster, folder: str) -> dict:
    done = cluster.run([sys.executable, "-m", "ddpslurm.cli", "analyze", folder, "--json"], check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_healthy_nodes_pass(slurm_cluster, tmp_path: Path) -> None:
    code, result = doctor(slurm_cluster, tmp_path)
    assert (code, result["ok"], result["failing_nodes"]) == (0, True, []), result
    names = {c["name"] for c in result["checks"]}
    assert names >= {"probe", "interface", "hostname", "port_free", "master_port", "peers", "versions", "clock"}
    assert {c["node"] for c in result["checks"]} == set(nodes_of(slurm_cluster))
    assert run_seconds(result) <= 30


@pytest.fixture
def firewalled(slurm_cluster) -> Iterator[str]:
    """nftables in the second node's namespace drops new TCP connections on the DDP ports, in and out."""
    bad = nodes_of(slurm_cluster)[1]
    table = "ddpslurm_doctor_test"
    drop = f"tcp dport {DDP_PORTS} ct state new drop;"
    rules = (f"table inet {table} {{\n"
             f" chain input {{ type filter hook input priority 0; policy accept; {drop} }}\n"
             f" chain output {{ type filter hook output priority 0; policy accept; {drop} }}\n}}\n")
    netns = ["nsenter", f"--net=/run/netns/dds-{bad}", "nft"]
    subprocess.run([*netns, "-f", "-"], input=rules, text=True, check=True, timeout=30)
    try:
        yield bad
    finally:
        subprocess.run([*netns, "delete", "table", "inet", table], check=False, timeout=30)


def test_a_firewalled_node_is_named_within_60_s(slurm_cluster, firewalled: str, tmp_path: Path) -> None:
    code, result = doctor(slurm_cluster, tmp_path)
    assert (code, result["ok"], result["failing_nodes"]) == (1, False, [firewalled]), result
    failed = {c["name"] for c in result["checks"] if not c["ok"]}
    assert failed <= {"master_port", "peers"} and failed
    assert run_seconds(result) <= 60
    diagnosis = analyze(slurm_cluster, result["folder"])
    assert (diagnosis["cause"], diagnosis["first_failing_host"], diagnosis["exclude_nodes"]) == \
        ("network_unreachable", firewalled, [firewalled])


def test_two_nodes_the_firewalled_one_is_named(slurm_cluster, firewalled: str, tmp_path: Path) -> None:
    """Two nodes, one bad link: the node that cannot even connect to itself has the firewall."""
    first = nodes_of(slurm_cluster)[0]
    code, result = doctor(slurm_cluster, tmp_path, "--nodelist", f"{first},{firewalled}", nodes=2)
    assert (code, result["failing_nodes"]) == (1, [firewalled]), result


@pytest.fixture
def renamed_interface(slurm_cluster) -> Iterator[str]:
    """The third node's eth0 is called ddalt0 for the test (slurmd listens on every address: it keeps working)."""
    node = nodes_of(slurm_cluster)[2]
    ip = ["ip", "-n", f"dds-{node}", "link", "set"]

    def rename(old: str, new: str) -> None:
        for argv in ([*ip, old, "down"], [*ip, old, "name", new], [*ip, new, "up"]):
            subprocess.run(argv, check=True, timeout=30)

    rename("eth0", "ddalt0")
    try:
        yield node
    finally:
        rename("ddalt0", "eth0")


def test_a_missing_interface_names_its_node(slurm_cluster, renamed_interface: str, tmp_path: Path) -> None:
    code, result = doctor(slurm_cluster, tmp_path, "--interface", "eth0")
    assert (code, result["failing_nodes"]) == (1, [renamed_interface]), result
    assert [c["name"] for c in result["checks"] if not c["ok"]] == ["interface"]
    assert "eth0 does not exist" in next(c["detail"] for c in result["checks"] if not c["ok"])
    diagnosis = analyze(slurm_cluster, result["folder"])
    assert (diagnosis["cause"], diagnosis["first_failing_host"]) == ("wrong_interface", renamed_interface)


def test_submit_preflight_stops_the_attempt_and_analyze_names_the_node(slurm_cluster, firewalled: str,
                                                                      tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "examples" / "train.py"
    done = slurm_cluster.run([sys.executable, "-m", "ddpslurm.cli", "submit", str(script), "--nodes", "3",
                              "--preflight", "--time", "5", "--folder", str(tmp_path), "--wait", "--json"],
                             check=False, timeout=300)
    assert done.returncode == 3, done.stderr
    folder = json.loads(done.stdout.splitlines()[-1])["folder"]
    assert not Path(folder, "attempt_0").exists()  # the training step never started
    diagnosis = analyze(slurm_cluster, folder)
    assert (diagnosis["cause"], diagnosis["first_failing_host"], diagnosis["exclude_nodes"], diagnosis["retry"]) == \
        ("network_unreachable", firewalled, [firewalled], "requeue")


def submit_json(cluster, *args: str) -> tuple[int, dict, str]:
    """`ddpslurm submit ... --json` (it waits): exit status, its one JSON object, stderr."""
    cut = args.index("--") if "--" in args else len(args)  # --json is submit's, before the script's arguments
    done = cluster.run([sys.executable, "-m", "ddpslurm.cli", "submit", *args[:cut], "--json", *args[cut:]],
                       check=False, timeout=540)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_retries_resubmit_away_from_the_node_the_preflight_named(slurm_cluster, firewalled: str,
                                                                  tmp_path: Path) -> None:
    """A 2-node job lands on the first two nodes (Slurm's default order on an idle cluster), the second of them
    firewalled: its pre-flight fails in seconds, the chain resubmits excluding that node, and the job completes."""
    script = Path(__file__).resolve().parents[2] / "examples" / "train.py"
    code, chain, stderr = submit_json(slurm_cluster, str(script), "--nodes", "2", "--preflight", "--retries", "2",
                                      "--time", "5", "--folder", str(tmp_path), "--", "--epochs", "1",
                                      "--steps-per-epoch", "4", "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert (code, chain["ok"], len(chain["attempts"])) == (0, True, 2), (chain, stderr)
    first, second = chain["attempts"]
    assert firewalled in first["nodes"] and not Path(first["folder"], "attempt_0").exists()  # training never began
    assert (first["cause"], first["exclude_nodes"], first["decision"], first["fingerprint"]) == \
        ("network_unreachable", [firewalled], "resubmitted", f"network_unreachable|node {firewalled}")
    assert chain["stop"] is None
    assert second["excluded"] == [firewalled] and firewalled not in second["nodes"] and len(second["nodes"]) == 2
    assert (second["state"], second["decision"]) == ("completed", "completed")
    assert (chain["job_id"], chain["folder"]) == (second["job_id"], second["folder"])
    assert f"resubmitting excluding {firewalled}" in stderr
    # `ddpslurm status` shows the chain for either job id, and for a job folder
    for ref in (first["job_id"], second["job_id"], first["folder"]):
        done = slurm_cluster.run([sys.executable, "-m", "ddpslurm.cli", "status", ref, "--json"], check=False)
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)["retry_chain"]
        assert [a["job_id"] for a in shown["attempts"]] == [first["job_id"], second["job_id"]]


def test_retries_never_resubmit_a_python_error(slurm_cluster, tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("raise ValueError('the learning rate schedule has no steps')\n")
    code, chain, _ = submit_json(slurm_cluster, str(script), "--nodes", "2", "--retries", "2", "--time", "5",
                                 "--folder", str(tmp_path / "jobs"))
    assert (code, chain["ok"], len(chain["attempts"])) == (3, False, 1), chain
    only = chain["attempts"][0]
    assert (only["state"], only["cause"], only["retry"]) == ("failed", "user_code_exception", "stop"), only
    assert "would fail again" in only["decision"]
    stop = chain["stop"]
    assert (stop["reason"], stop["fingerprint"], stop["budget"]) == \
        ("deterministic", "user_code_exception|script broken.py ValueError", 1), stop
    shown = slurm_cluster.run([sys.executable, "-m", "ddpslurm.cli", "status", only["job_id"]], check=False)
    assert f"stopped (deterministic): {stop['text']}" in shown.stdout, shown.stderr
