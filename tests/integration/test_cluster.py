"""The local Slurm cluster of slurm/: real daemons, real namespaces, real accounting.

Argument and root checks run without a cluster. The rest use the session cluster (`slurm_cluster`),
except the `down` test, which brings up and tears down a short-lived cluster of its own (`downtest`).
The crash-node test runs last in this file and brings its node back before it ends.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.integration.layout import wait_for

CLUSTER_SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "cluster"
TEST_NODES = int(os.environ.get("DDPSLURM_TEST_NODES", "3"))
DOWNTEST = "downtest"
USABLE = {"idle", "allocated", "mixed", "completing"}


def cluster_cmd(*args: str, user: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    argv = [str(CLUSTER_SCRIPT), *args]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def node_states(cluster) -> dict[str, str]:
    out = cluster.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def sacct_state(cluster, job_id: str) -> tuple[str, str] | None:
    """(State, ExitCode) of the job allocation as sacct reports it, or None before it is recorded."""
    out = cluster.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State,ExitCode"]).stdout
    for line in out.splitlines():
        jid, state, code = line.split("|")
        if jid == job_id:
            return state.split()[0], code
    return None


# ---------------------------------------------------------------- no cluster needed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "missing command"),
        (["bogus"], "unknown command: bogus"),
        (["--frob", "up"], "unknown option: --frob"),
        (["up", "--nodes", "0"], "bad --nodes '0'"),
        (["up", "--nodes", "x"], "bad --nodes 'x'"),
        (["status", "--nodes", "2"], "--nodes only goes with 'up'"),
        (["status", "--preempt-user-signal"], "--preempt-user-signal only goes with 'up'"),
        (["--name", "Bad_Name", "status"], "bad cluster name 'Bad_Name'"),
        (["--name", "waytoolongname", "status"], "bad cluster name"),
        (["crash-node"], "crash-node needs a NODE"),
        (["status", "extra"], "unexpected argument: extra"),
    ],
)
def test_usage_errors_give_one_line_and_usage_exit_2(args: list[str], message: str) -> None:
    result = cluster_cmd(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert message in lines[0]
    assert lines[1].startswith("usage: slurm/cluster")
    assert "Traceback" not in result.stderr


def test_needs_root_one_line() -> None:
    if os.geteuid() == 0:
        result = cluster_cmd("--name", "h1", "status", user="nobody")
    else:
        result = cluster_cmd("--name", "h1", "status")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "needs root" in result.stderr


# ---------------------------------------------------------------- the session cluster


@pytest.mark.slurm
def test_up_gives_idle_nodes(slurm_cluster) -> None:
    states = node_states(slurm_cluster)
    expected = {f"{slurm_cluster.name}-n{i:02d}" for i in range(1, TEST_NODES + 1)}
    assert set(states) == expected
    assert set(states.values()) <= USABLE, states
    # `up` on a cluster that is already up is idempotent and quick.
    again = slurm_cluster.cluster("up", "--nodes", str(TEST_NODES))
    assert f"{TEST_NODES} nodes idle" in again.stderr


@pytest.mark.slurm
def test_status_reports_up(slurm_cluster) -> None:
    result = slurm_cluster.cluster("status")
    assert result.returncode == 0
    assert f"cluster '{slurm_cluster.name}' is up: {TEST_NODES} nodes" in result.stdout


@pytest.mark.slurm
def test_srun_runs_on_distinct_hosts(slurm_cluster) -> None:
    out = slurm_cluster.run(["srun", f"-N{TEST_NODES}", "--ntasks-per-node=1", "hostname"], timeout=60).stdout
    hosts = out.split()
    assert len(hosts) == TEST_NODES
    assert set(hosts) == set(node_states(slurm_cluster))


@pytest.mark.slurm
def test_node_hostnames_resolve_to_their_namespace_ip(slurm_cluster) -> None:
    """Jobs reach every node by name; each node's own address is the one its name resolves to."""
    script = "python3 -c \"import socket; print(socket.gethostname(), socket.gethostbyname(socket.gethostname()))\""
    out = slurm_cluster.run(["srun", f"-N{TEST_NODES}", "--ntasks-per-node=1", "bash", "-c",
                             script + "; hostname -I"], timeout=60).stdout.splitlines()
    pairs = [line.split() for line in out if not re.fullmatch(r"[\d. ]+", line.strip())]
    own_ips = [line.strip() for line in out if re.fullmatch(r"[\d. ]+", line.strip())]
    assert len(pairs) == TEST_NODES
    assert sorted(ip for _, ip in pairs) == sorted(own_ips)
    assert len({ip for _, ip in pairs}) == TEST_NODES


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("command", "state", "exit_code"),
    [("true", "COMPLETED", "0:0"), ("exit 3", "FAILED", "3:0")],
)
def test_sacct_lists_finished_job(slurm_cluster, tmp_path: Path, command: str, state: str,
                                  exit_code: str) -> None:
    job_id = slurm_cluster.run(["sbatch", "--parsable", "--wait", "-N1", "-o", str(tmp_path / "%j.out"),
                                "--wrap", command], check=False, timeout=120).stdout.strip().split(";")[0]
    assert job_id.isdigit()
    recorded = wait_for(lambda: sacct_state(slurm_cluster, job_id), 30, f"sacct to record job {job_id}")
    assert recorded == (state, exit_code)


@pytest.mark.slurm
def test_env_output_is_usable_from_a_clean_shell(slurm_cluster) -> None:
    out = slurm_cluster.cluster("env").stdout
    exports = {}
    for line in out.splitlines():
        words = shlex.split(line)
        assert words[0] == "export" and len(words) == 2, line
        key, _, value = words[1].partition("=")
        exports[key] = value
    assert exports["DDPSLURM_CLUSTER"] == slurm_cluster.name
    assert Path(exports["SLURM_CONF"]).is_file()
    shell = (f"eval \"$({shlex.quote(str(CLUSTER_SCRIPT))} --name {slurm_cluster.name} env)\" && "
             "sinfo -h -o %R && scontrol show config | grep -i '^ClusterName'")
    result = subprocess.run(["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "bash", "-c", shell],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "debug" in result.stdout.split()
    assert re.search(rf"ClusterName\s*=\s*{slurm_cluster.name}\b", result.stdout)


@pytest.mark.slurm
def test_clusters_do_not_share_hostnames_or_subnets(slurm_cluster) -> None:
    """Every cluster's /etc/hosts lines are tagged with its name; no address appears twice."""
    lines = [ln for ln in Path("/etc/hosts").read_text().splitlines() if "# ddpslurm-cluster:" in ln]
    ours = [ln for ln in lines if ln.endswith(f"# ddpslurm-cluster:{slurm_cluster.name}")]
    assert len(ours) == TEST_NODES + 1  # the nodes and the controller
    addresses = [ln.split()[0] for ln in lines]
    names = [ln.split()[1] for ln in lines]
    assert len(set(addresses)) == len(addresses)
    assert len(set(names)) == len(names)


@pytest.mark.slurm
def test_step_over_its_memory_is_killed(slurm_cluster, tmp_path: Path) -> None:
    """OverMemoryKill: Slurm's accounting kills a step that outgrows --mem (the host_oom failure class)."""
    hog = "x = bytearray(400 * 2**20); import time; time.sleep(10)"
    result = slurm_cluster.run(["srun", "-N1", "--mem=150M", "python3", "-c", hog], check=False, timeout=120)
    assert result.returncode != 0
    assert re.search(r"StepId=\d+\.0 exceeded memory limit \(\d+ > 157286400\), being killed", result.stderr)


@pytest.mark.slurm
@pytest.mark.slow
def test_urgent_partition_preempts_and_requeues_debug_jobs(slurm_cluster, tmp_path: Path) -> None:
    node = f"{slurm_cluster.name}-n01"
    victim = slurm_cluster.run(["sbatch", "--parsable", "-N1", "-w", node, "--exclusive", "-o",
                                str(tmp_path / "victim_%j.out"), "--wrap", "sleep 300"]).stdout.strip()
    try:
        wait_for(lambda: sacct_state(slurm_cluster, victim) == ("RUNNING", "0:0"), 30, "the debug job to run")
        urgent = slurm_cluster.run(["sbatch", "--parsable", "-p", "urgent", "-N1", "-w", node, "--exclusive",
                                    "-o", "/dev/null", "--wrap", "true"]).stdout.strip()
        wait_for(lambda: sacct_state(slurm_cluster, urgent) == ("COMPLETED", "0:0"), 120, "the urgent job to run")
        history = slurm_cluster.run(["sacct", "-n", "-X", "-D", "-P", "-j", victim, "-o", "State"]).stdout.split()
        assert history[0] == "PREEMPTED"
        assert "DUE TO PREEMPTION" in (tmp_path / f"victim_{victim}.out").read_text()
        requeued = slurm_cluster.run(["squeue", "-h", "-j", victim, "-o", "%T"], check=False).stdout.strip()
        assert requeued in ("PENDING", "RUNNING", "CONFIGURING")
    finally:
        slurm_cluster.run(["scancel", victim], check=False)


# ---------------------------------------------------------------- a cluster of its own: down


def _leftovers(name: str, marker: str) -> list[str]:
    """Everything of cluster `name` still on the machine; empty when down cleaned up."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X") and (f"/ddpslurm/{name}/" in cmdline or marker in cmdline):
            found.append(f"process {proc.name}: {cmdline.strip()}")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {ln.split()[0]}" for ln in netns.splitlines() if ln.startswith(f"dds-{name}-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {ln.split(':')[1].strip()}" for ln in links.splitlines() if f"dds-{name}" in ln]
    found += [f"/etc/hosts: {ln}" for ln in Path("/etc/hosts").read_text().splitlines()
              if f"ddpslurm-cluster:{name}" in ln or re.search(rf"\s{name}-(n\d+|ctl)\b", ln)]
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    found += [f"nft {ln}" for ln in tables.splitlines() if f"ddpslurm_{name}" in ln]
    if Path(f"/run/ddpslurm/{name}").exists():
        found.append(f"/run/ddpslurm/{name}")
    return found


@pytest.mark.slurm
@pytest.mark.slow
def test_down_leaves_nothing_behind(slurm_cluster_named, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    marker = f"ddpslurm-downtest-marker-{os.getpid()}"
    up = cluster_cmd("--name", DOWNTEST, "up", "--nodes", "2")
    try:
        assert up.returncode == 0, up.stderr
        assert _leftovers(DOWNTEST, marker), "a cluster that is up must show up in the leftover check"
        downtest = slurm_cluster_named(DOWNTEST)
        # A running job leaves slurmstepd and a job process in a node's namespace for down to clean up.
        old_job = downtest.run(["sbatch", "--parsable", "-N2", "-o", str(tmp_path / "%j.out"), "--wrap",
                                f"srun bash -c 'exec -a {marker} sleep 300'"]).stdout.strip()
        wait_for(lambda: marker in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout,
                 30, "the job's process to start")
    finally:
        down = cluster_cmd("--name", DOWNTEST, "down")
    assert down.returncode == 0, down.stderr
    assert _leftovers(DOWNTEST, marker) == []
    assert cluster_cmd("--name", DOWNTEST, "status").returncode != 0
    # The next up starts with an empty queue and free nodes: the job running at `down` does not come back
    # ("requeued due to node failure") holding its nodes, and new job ids do not reuse the old ones.
    try:
        again = cluster_cmd("--name", DOWNTEST, "up", "--nodes", "2")
        assert again.returncode == 0, again.stderr
        assert downtest.run(["squeue", "-h", "-o", "%i %T"]).stdout.strip() == ""
        new_job = downtest.run(["sbatch", "--parsable", "-N2", "-o", "/dev/null", "--wrap", "true"]).stdout
        assert int(new_job) > int(old_job)
    finally:
        assert cluster_cmd("--name", DOWNTEST, "down").returncode == 0


# ---------------------------------------------------------------- crash-node (last: it takes a node away)


@pytest.mark.slurm
@pytest.mark.slow
def test_crash_node_fails_its_job_and_restart_brings_it_back(slurm_cluster, tmp_path: Path) -> None:
    """A 2-node job whose batch script runs on the first node: the crash of the other one is a node failure
    that the surviving node's output reports, as on a real cluster."""
    if TEST_NODES < 2:
        pytest.skip("needs a cluster of at least 2 nodes")
    first, node = f"{slurm_cluster.name}-n01", f"{slurm_cluster.name}-n{TEST_NODES:02d}"
    # --no-requeue: with JobRequeue=1 Slurm would requeue the job after the node failure.
    job_id = slurm_cluster.run(["sbatch", "--parsable", "--no-requeue", "-N2", "-w", f"{first},{node}", "-o",
                                str(tmp_path / "%j.out"), "--wrap", "srun sleep 300"]).stdout.strip().split(";")[0]
    try:
        wait_for(lambda: sacct_state(slurm_cluster, job_id) == ("RUNNING", "0:0"), 30, f"job {job_id} to run")
        crash = slurm_cluster.cluster("crash-node", node)
        assert f"crashed {node}" in crash.stderr
        wait_for(lambda: node_states(slurm_cluster)[node].startswith(("down", "not_responding", "idle*",
                                                                         "allocated*")),
                 60, f"{node} to stop responding")
        state = wait_for(lambda: (s := sacct_state(slurm_cluster, job_id)) and s[0] != "RUNNING" and s, 90,
                         f"job {job_id} to end")
        assert state[0] == "NODE_FAIL"
        assert node_states(slurm_cluster)[node].startswith("down")
        output = wait_for(lambda: "DUE TO NODE FAILURE" in (text := (tmp_path / f"{job_id}.out").read_text()) and text,
                          30, "the batch output to report the node failure")
        assert f"Node failure on {node}" in output
    finally:
        slurm_cluster.cluster("restart-node", node, check=False)
        slurm_cluster.run(["scancel", job_id], check=False)
    wait_for(lambda: node_states(slurm_cluster)[node] == "idle", 60, f"{node} to come back idle")
