"""Unit tests of the doctor: the judgement (pure), argv and spec building, the probe's sockets on loopback, and
`ddpslurm analyze` on a doctor folder (a failed pre-flight is the diagnosis, the node is excluded)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.parse.preflight_records import doctor_events
from ddpslurm.doctor import command, judge, probe
from ddpslurm.errors import UsageError

NAME_SETS = [["n01", "n02", "n03"], ["gpu-a17", "gpu-b03", "gpu-a02"], ["x", "y", "z", "w"]]


def healthy(nodes: list[str], **overrides: Any) -> dict[str, dict[str, Any]]:
    """Records of a healthy allocation (addresses 10.0.0.i), with per-node overrides {node: {field: value}}."""
    addrs = {node: f"10.0.0.{i + 1}" for i, node in enumerate(nodes)}
    records = {}
    for node in nodes:
        records[node] = {
            "kind": "doctor", "node": node, "nodes": nodes, "port": 12345,
            "interface": {"name": "eth0", "address": addrs[node], "requested": False},
            "resolution": dict(addrs), "port_bind": {"ok": True, "error": None},
            "peers": {peer: {"ok": True, "error": None, "offset_s": 0.01} for peer in nodes if peer != node},
            "versions": {"torch": "2.13.0", "cuda": "12.4", "nccl": "2.21.5"}, "gpus": 8,
            "shm_bytes": 64 << 30, "free_bytes": 500 << 30,
        }
        records[node].update(overrides.get(node, {}))
    return records


def cut_off(records: dict[str, dict[str, Any]], bad: str) -> None:
    """Make every connection to and from `bad` time out."""
    for node, rec in records.items():
        for peer, result in rec["peers"].items():
            if bad in (node, peer):
                result.update(ok=False, error="no answer (packets dropped?)", offset_s=None)


@pytest.mark.parametrize("nodes", NAME_SETS)
def test_healthy_allocation_passes_every_check(nodes: list[str]) -> None:
    checks = judge.judge(nodes, healthy(nodes), expected_gpus=8)
    assert [c for c in checks if not c.ok] == []
    assert {c.name for c in checks} >= {"probe", "interface", "hostname", "port_free", "master_port", "peers",
                                        "versions", "gpus", "shm", "disk", "clock"}


@pytest.mark.parametrize("nodes", NAME_SETS)
@pytest.mark.parametrize("bad_index", [0, 1, -1])
def test_a_node_cut_off_from_its_peers_is_the_only_one_named(nodes: list[str], bad_index: int) -> None:
    records = healthy(nodes)
    bad = nodes[bad_index]
    cut_off(records, bad)
    result = judge.verdict(judge.judge(nodes, records))
    assert result["ok"] is False
    assert result["failing_nodes"] == [bad]
    assert {c["name"] for c in result["checks"] if not c["ok"]} <= {"master_port", "peers"}


def test_two_nodes_with_one_bad_link_blame_both_sides() -> None:
    nodes = ["a", "b"]
    records = healthy(nodes)
    cut_off(records, "b")
    checks = judge.judge(nodes, records)
    assert set(judge.failing_nodes(checks)) == {"a", "b"}
    assert any("cannot tell which side" in c.detail for c in checks if not c.ok)


def test_two_nodes_one_of_which_cannot_reach_itself_blame_that_one() -> None:
    nodes = ["a", "b"]
    records = healthy(nodes, b={"self": {"ok": False, "error": "no answer"}}, a={"self": {"ok": True}})
    cut_off(records, "b")
    checks = judge.judge(nodes, records)
    assert judge.failing_nodes(checks) == ["b"]
    assert any("local firewall" in c.detail for c in checks if not c.ok)


@pytest.mark.parametrize(("pairs", "blamed"), [
    (set(), []),
    ({frozenset("ab"), frozenset("bc")}, ["b"]),
    ({frozenset("ab"), frozenset("cd")}, ["a", "b", "c", "d"]),
    ({frozenset("ab"), frozenset("ac"), frozenset("ad"), frozenset("bc")}, ["a", "b", "c"]),
])
def test_blamed_nodes(pairs: set[frozenset[str]], blamed: list[str]) -> None:
    assert judge.blamed_nodes(["a", "b", "c", "d"], pairs) == blamed


def test_a_suspect_breaks_a_tie_only() -> None:
    assert judge.blamed_nodes(["a", "b"], {frozenset("ab")}, frozenset("a")) == ["a"]
    assert judge.blamed_nodes(["a", "b", "c"], {frozenset("ab"), frozenset("bc")}, frozenset("a")) == ["b"]


def test_a_missing_record_names_the_node() -> None:
    nodes = ["n1", "n2", "n3"]
    records = healthy(nodes)
    cut_off(records, "n3")
    del records["n3"]
    result = judge.verdict(judge.judge(nodes, records))
    assert result["failing_nodes"] == ["n3"]
    assert any(c["name"] == "probe" and not c["ok"] for c in result["checks"])


@pytest.mark.parametrize(("override", "check"), [
    ({"interface": {"name": "eth1", "address": "10.0.0.2", "requested": False}}, "interface"),
    ({"interface": {"name": "ib0", "address": None, "requested": True}}, "interface"),
    ({"resolution": {"n1": "10.0.0.1", "n2": "127.0.1.1", "n3": "10.0.0.3"}}, "hostname"),
    ({"versions": {"torch": "2.12.0", "cuda": "12.4", "nccl": "2.20.5"}}, "versions"),
    ({"gpus": 7}, "gpus"),
    ({"shm_bytes": 64 << 20}, "shm"),
    ({"free_bytes": 10 << 20}, "disk"),
    ({"peers": {"n1": {"ok": True, "offset_s": 4.2}, "n3": {"ok": True}}}, "clock"),
])
def test_one_odd_node_fails_that_check_alone(override: dict[str, Any], check: str) -> None:
    nodes = ["n1", "n2", "n3"]
    checks = judge.judge(nodes, healthy(nodes, n2=override), expected_gpus=8)
    failed = [(c.name, c.node) for c in checks if not c.ok]
    assert failed == [(check, "n2")]
    assert all(c.advice for c in checks if not c.ok)
    assert judge.cause_of(check) in {"wrong_interface", "network_unreachable", "nccl_version_mismatch",
                                     "gpu_hardware", "shm_error", "unknown"}


def test_the_master_port_taken_on_the_rank0_host() -> None:
    nodes = ["n1", "n2", "n3"]
    records = healthy(nodes, n1={"port_bind": {"ok": False, "error": "Address already in use (errno 98)"}})
    cut_off(records, "n1")
    checks = judge.judge(nodes, records)
    assert judge.failing_nodes(checks) == ["n1"]
    assert next(c.name for c in checks if not c.ok) == "port_free"


@pytest.mark.parametrize(("name", "address", "bad"), [
    ("eth0", "10.1.2.3", False), ("ib0", "192.168.1.4", False), ("lo", "127.0.0.1", True),
    ("eth0", "169.254.3.4", True), ("docker0", "172.17.0.1", True), ("virbr0", "192.168.122.1", True),
    ("eth9", None, True), (None, None, True),
])
def test_interface_problem(name: str | None, address: str | None, bad: bool) -> None:
    assert (judge.interface_problem(name, address) is not None) is bad


def spec(**kwargs: Any) -> command.DoctorSpec:
    return command.make_doctor_spec(**{"nodes": 3, "folder": "/tmp/jobs", **kwargs})


def test_srun_argv_is_pinned() -> None:
    argv = command.srun_argv(spec(partition="debug", exclude="n[02-03]", sbatch_args=["reservation=r1"],
                                  gpus_per_node=2, master_port=29500, interface="ib0"), python="/py")
    assert argv == ["srun", "--nodes=3", "--ntasks-per-node=1", "--job-name=ddpslurm-doctor", "--time=5",
                    "--kill-on-bad-exit=0", "--gpus-per-node=2", "--partition=debug", "--exclude=n[02-03]",
                    "--reservation=r1", "/py", "-m", "ddpslurm.doctor.probe", "--folder", "/tmp/jobs",
                    "--window", "10", "--port", "29500", "--interface", "ib0"]


def test_nodelist_is_the_doctors_own_flag() -> None:
    argv = command.srun_argv(spec(nodelist="n[01-03]"), python="/py")
    assert "--nodelist=n[01-03]" in argv and argv.index("--nodelist=n[01-03]") < argv.index("/py")
    with pytest.raises(UsageError, match="nodelist=n01"):  # the hint names --nodelist
        spec(sbatch_args=["nodelist=n01"])


@pytest.mark.parametrize("kwargs", [
    {"nodes": 0}, {"partition": "a\nb"}, {"interface": "eth0; rm -rf /"}, {"master_port": 80},
    {"window": 0}, {"sbatch_args": ["nodes=4"]}, {"time": "soon"}, {"gpus_per_node": -1}, {"nodelist": "n[01-"},
])
def test_bad_flags_are_usage_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        spec(**kwargs)


def test_parse_probe_lines_skips_noise_and_odd_names() -> None:
    good = probe.RECORD_PREFIX + json.dumps({"job_id": "77", "nodes": ["n1", "n2"]})
    odd = probe.RECORD_PREFIX + json.dumps({"job_id": "78", "nodes": ["../etc"]})
    assert command.parse_probe_lines(f"noise\n{odd}\n{probe.RECORD_PREFIX}{{broken\n{good}\n") == ("77", ["n1", "n2"])
    assert command.parse_probe_lines("nothing here") == (None, [])


def test_allocation_from_slurm_variables() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu[01-02,07]", "SLURM_NODEID": "2"}
    assert probe.allocation(env) == ("5", ["gpu01", "gpu02", "gpu07"], 2, "gpu07")
    with pytest.raises(SystemExit):
        probe.allocation({"SLURM_JOB_ID": "5"})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_reach_talks_to_a_real_listener_and_measures_the_clock() -> None:
    port = _free_port()
    listener = probe.Listener("peer", port)
    try:
        result = probe.reach("me", "127.0.0.1", port, None, time.time() + 5)
        assert result["ok"] and result["answered_by"] == "peer" and abs(result["offset_s"]) < 0.5
        deadline = time.time() + 2
        while "me" not in listener.heard and time.time() < deadline:
            time.sleep(0.01)
        assert "me" in listener.heard
        second = probe.Listener("other", port)
        assert second.error is not None and "in use" in second.error.lower()
    finally:
        listener.close()


def test_reach_gives_up_at_the_deadline_on_a_closed_port() -> None:
    started = time.time()
    result = probe.reach("me", "127.0.0.1", _free_port(), None, started + 1)
    assert not result["ok"] and "refused" in result["error"].lower()
    assert time.time() - started < 3


def test_load_records_reads_only_doctor_records(tmp_path: Path) -> None:
    folder = tmp_path / "doctor"
    folder.mkdir()
    (folder / "node_n1.json").write_text(json.dumps({"kind": "doctor", "node": "n1"}))
    (folder / "node_n2.json").write_text("[1, 2]")
    (folder / "node_n3.json").write_text(json.dumps({"kind": "job"}))
    assert list(command.load_records(tmp_path, ["n1", "n2", "n3", "n4"])) == ["n1"]


def test_cli_usage_error_is_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "doctor", "--nodes", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--nodes 0" in done.stderr and "Traceback" not in done.stderr

def write(job_dir: Path, records: dict[str, dict[str, Any]]) -> None:
    folder = job_dir / "doctor"
    folder.mkdir(parents=True)
    for node, record in records.items():
        (folder / f"node_{node}.json").write_text(json.dumps({**record, "finished": 1.8e9}))


@pytest.mark.parametrize("nodes", [["n01", "n02", "n03"], ["gpu-b7", "gpu-a1", "gpu-c3", "gpu-d9"]])
def test_a_node_cut_off_is_the_failing_host_and_excluded(tmp_path: Path, nodes: list[str]) -> None:
    records = healthy(nodes)
    cut_off(records, nodes[1])
    write(tmp_path / "job_9", records)
    result = analyze_paths([tmp_path / "job_9"]).to_dict()
    assert (result["cause"], result["first_failing_host"], result["first_failing_rank"]) == \
        ("network_unreachable", nodes[1], None)
    assert result["exclude_nodes"] == [nodes[1]] and result["retry"] == "requeue"
    assert "pre-flight check" in result["evidence"][0]["text"]


def test_a_missing_interface_is_wrong_interface(tmp_path: Path) -> None:
    nodes = ["n01", "n02", "n03"]
    write(tmp_path / "job_9", healthy(nodes, n03={"interface": {"name": "ib0", "address": None, "requested": True}}))
    result = analyze_paths([tmp_path / "job_9"]).to_dict()
    assert (result["cause"], result["first_failing_host"], result["exclude_nodes"]) == \
        ("wrong_interface", "n03", ["n03"])


def test_a_node_without_a_record_is_reported_by_the_first_record(tmp_path: Path) -> None:
    nodes = ["n01", "n02", "n03"]
    records = healthy(nodes)
    cut_off(records, "n03")
    del records["n03"]
    write(tmp_path / "job_9", records)
    first = doctor_events(str(tmp_path / "job_9/doctor/node_n01.json"), "node_n01.json")
    second = doctor_events(str(tmp_path / "job_9/doctor/node_n02.json"), "node_n02.json")
    assert {e.host for e in first} == {"n03"} and second == []
    assert {e.cause for e in first} >= {"node_failure"}


def test_a_healthy_doctor_folder_yields_no_failure_and_odd_names_are_refused(tmp_path: Path) -> None:
    nodes = ["n01", "n02"]
    write(tmp_path / "job_9", healthy(nodes))
    assert doctor_events(str(tmp_path / "job_9/doctor/node_n01.json"), "x") == []
    bad = healthy(["../x", "n02"])
    cut_off(bad, "n02")
    write(tmp_path / "job_8", {"n02": bad["n02"]})
    assert doctor_events(str(tmp_path / "job_8/doctor/node_n02.json"), "x") == []


SLURM_JOB = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "c[1-3]"}


def test_preflight_probes_the_port_the_training_step_will_get() -> None:
    from ddpslurm.doctor.preflight import preflight_argv, training_port
    from ddpslurm.env import derive_dist_env

    training_env = {**SLURM_JOB, "SLURM_STEP_ID": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                    "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "1(x3)", "SLURM_STEP_NODELIST": "c[1-3]",
                    "SLURM_STEP_NUM_NODES": "3"}
    assert training_port(SLURM_JOB) == derive_dist_env(training_env).master_port
    assert training_port({**SLURM_JOB, "MASTER_PORT": "29500"}) == 29500
    assert preflight_argv(SLURM_JOB, "/jobs", python="/py") == [
        "srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
        "--job-name=ddpslurm-preflight", "/py", "-m", "ddpslurm.doctor.probe", "--folder", "/jobs", "--window", "10",
        "--port", str(training_port(SLURM_JOB))]


def test_submit_preflight_runs_under_the_batch_supervisor(tmp_path: Path) -> None:
    from ddpslurm.launch.plan import batch_setup
    from ddpslurm.launch.spec import make_spec

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    with_check = batch_setup(make_spec(script, nodes=2, max_requeues=0, preflight=True), "/py")
    without = batch_setup(make_spec(script, nodes=2, max_requeues=0), "/py")
    assert any("ddpslurm.launch.batch" in line and "--preflight" in line for line in with_check)
    assert not any("--preflight" in line for line in without)
    with pytest.raises(UsageError, match="--preflight"):
        make_spec(script, nodes=1, local=True, preflight=True)
