"""The pre-flight's sparse graph (ring + rank-0 host + k random peers, seeded from the job id) and the judge on the
observations it gives: the bad node or the bad link is still named when each node sees only its planned peers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from ddpslurm.doctor import graph, judge, probe
from tests.unit.test_doctor import _free_port, cut_off

K = graph.RANDOM_PEERS


def names(count: int) -> list[str]:
    return [f"gpu{i:04d}" for i in range(1, count + 1)]


def test_1024_nodes_make_o_n_k_connections_with_bounded_in_degree() -> None:
    nodes = names(1024)
    plan = graph.probe_plan(nodes, "4242")
    into = graph.inbound(plan)
    # pinned: the draw is blake2b over the job id, the same on every node and every Python
    assert graph.connection_count(plan) == 5113
    assert 1024 * (K + 1) <= graph.connection_count(plan) <= 1024 * (K + 2) - 2 < 1024 * 1023 // 200
    assert max(len(peers) for peers in plan.values()) <= K + 2
    assert len(into[nodes[0]]) == 1023  # everyone tests its link to the rank-0 host
    assert max(len(sources) for node, sources in into.items() if node != nodes[0]) <= K + 1
    assert min(len(set(sources)) for sources in into.values()) >= K


@pytest.mark.parametrize("count", [3, 4, 5, 6, 7, 8, 11, 64, 257])
@pytest.mark.parametrize("job_id", ["1", "77", "4242", "123456_7"])
def test_every_node_is_tested_by_two_distinct_peers(count: int, job_id: str) -> None:
    nodes = names(count)
    plan = graph.probe_plan(nodes, job_id)
    into = graph.inbound(plan)
    assert all(node not in peers and len(set(peers)) == len(peers) for node, peers in plan.items())
    assert all(len(set(into[node])) >= 2 for node in nodes)
    for rank, node in enumerate(nodes):
        assert plan[node][0] == nodes[(rank + 1) % count]  # the ring successor first
        assert rank == 0 or nodes[0] in plan[node]  # every node tests its link to the rank-0 host
    assert sorted((src, dst) for dst, srcs in into.items() for src in srcs) == \
        sorted((src, dst) for src, dsts in plan.items() for dst in dsts)


@pytest.mark.parametrize("count", [1, 2, 3, K + 2])
def test_small_jobs_stay_all_to_all(count: int) -> None:
    nodes = names(count)
    plan = graph.probe_plan(nodes, "9")
    assert {node: set(peers) for node, peers in plan.items()} == {node: set(nodes) - {node} for node in nodes}
    assert graph.all_to_all(count) and not graph.all_to_all(K + 3)
    assert graph.connection_count(plan) == count * (count - 1)


def test_the_plan_depends_on_the_job_id_and_refuses_odd_input() -> None:
    nodes = names(50)
    assert graph.probe_plan(nodes, "1") != graph.probe_plan(nodes, "2")
    with pytest.raises(ValueError):
        graph.probe_plan(nodes, "1", k=1)
    with pytest.raises(ValueError):
        graph.probe_plan(["a", "b", "a", "c", "d", "e", "f"], "1")


PLAN_ON_A_NODE = """
import json, sys
from ddpslurm.doctor.graph import inbound, probe_plan
from ddpslurm.doctor.probe import allocation
import os
job_id, nodes, rank, node = allocation(os.environ)
plan = probe_plan(nodes, job_id)
print(json.dumps({"node": node, "plan": plan, "in": inbound(plan)[node]}))
"""


def test_every_node_computes_the_same_plan_alone() -> None:
    """Each node's probe derives the plan from its own Slurm variables, in its own interpreter (another hash seed)."""
    seen = []
    for rank in (0, 5, 199):
        env = {**os.environ, "SLURM_JOB_ID": "31337", "SLURM_JOB_NODELIST": "gpu[0001-0200]",
               "SLURM_NODEID": str(rank), "PYTHONHASHSEED": str(rank + 1)}
        env.pop("SLURMD_NODENAME", None)
        done = subprocess.run([sys.executable, "-c", PLAN_ON_A_NODE], env=env, capture_output=True, text=True,
                              timeout=60, check=True)
        seen.append(json.loads(done.stdout))
    assert seen[0]["plan"] == seen[1]["plan"] == seen[2]["plan"]
    assert json.loads(json.dumps(graph.probe_plan(names(200), "31337"))) == seen[0]["plan"]
    assert [s["node"] for s in seen] == ["gpu0001", "gpu0006", "gpu0200"]
    assert all(len(s["in"]) <= K + 1 for s in seen[1:]) and len(seen[0]["in"]) == 199


def sparse_healthy(nodes: list[str], job_id: str = "4242") -> dict[str, dict[str, Any]]:
    """Healthy records of a sparse pre-flight: each node tried only its planned peers, resolved only its lookups."""
    plan = graph.probe_plan(nodes, job_id)
    into = graph.inbound(plan)
    addrs = {node: f"10.{i // 250}.{i % 250}.1" for i, node in enumerate(nodes)}
    return {node: {
        "kind": "doctor", "node": node, "nodes": nodes, "port": 12345, "job_id": job_id,
        "interface": {"name": "eth0", "address": addrs[node], "requested": False},
        "resolution": {host: addrs[host] for host in graph.lookups(plan, nodes, node)},
        "port_bind": {"ok": True, "error": None},
        "peers": {peer: {"ok": True, "error": None, "offset_s": 0.01} for peer in plan[node]},
        "plan": {"k": K, "out": list(plan[node]), "in": list(into[node])}, "heard_from": list(into[node]),
        "versions": {"torch": "2.13.0", "cuda": "12.4", "nccl": "2.21.5"}, "gpus": 8,
        "shm_bytes": 64 << 30, "free_bytes": 500 << 30} for node in nodes}


@pytest.mark.parametrize("count", [6, 9, 40, 1024])
@pytest.mark.parametrize("bad_index", [0, 1, 2, -1])
def test_a_node_cut_off_in_a_sparse_preflight_is_the_only_one_named(count: int, bad_index: int) -> None:
    nodes = names(count)
    records = sparse_healthy(nodes)
    bad = nodes[bad_index]
    cut_off(records, bad)
    result = judge.verdict(judge.judge(nodes, records))
    assert result["failing_nodes"] == [bad]
    assert {c["name"] for c in result["checks"] if not c["ok"]} <= {"master_port", "peers"}
    assert not any("cannot tell" in c["detail"] for c in result["checks"])


@pytest.mark.parametrize("bad_index", [1, 17, -1])
def test_a_sparse_node_that_left_no_record_is_named_by_its_in_neighbours(bad_index: int) -> None:
    nodes = names(64)
    records = sparse_healthy(nodes)
    bad = nodes[bad_index]
    cut_off(records, bad)
    del records[bad]
    assert judge.failing_nodes(judge.judge(nodes, records)) == [bad]


def test_a_node_whose_inbound_is_dropped_is_named_alone() -> None:
    """Its own connections succeed; only its planned in-neighbours (ring predecessor, random peers) see it."""
    nodes = names(100)
    records = sparse_healthy(nodes)
    bad = nodes[40]
    for rec in records.values():
        if bad in rec["peers"]:
            rec["peers"][bad].update(ok=False, error="no answer (packets dropped?)")
    assert judge.failing_nodes(judge.judge(nodes, records)) == [bad]


def test_one_bad_link_in_a_sparse_preflight_names_its_two_ends() -> None:
    nodes = names(100)
    records = sparse_healthy(nodes)
    src = nodes[30]
    dst = next(peer for peer in records[src]["peers"] if peer != nodes[0])
    records[src]["peers"][dst].update(ok=False, error="no answer (packets dropped?)")
    checks = judge.judge(nodes, records)
    assert sorted(judge.failing_nodes(checks)) == sorted([src, dst])
    assert all("cannot tell which side" in c.detail for c in checks if not c.ok)


def test_two_nodes_cut_off_in_a_sparse_preflight_are_both_named() -> None:
    nodes = names(200)
    records = sparse_healthy(nodes)
    cut_off(records, nodes[10])
    cut_off(records, nodes[150])
    assert sorted(judge.failing_nodes(judge.judge(nodes, records))) == [nodes[10], nodes[150]]


def test_a_wrong_lookup_is_judged_by_the_nodes_that_made_the_same_lookup() -> None:
    nodes = names(50)
    records = sparse_healthy(nodes)
    healthy_checks = judge.judge(nodes, records)
    assert judge.failing_nodes(healthy_checks) == []
    odd = nodes[7]
    peer = next(host for host in records[odd]["resolution"] if host != odd)
    records[odd]["resolution"][peer] = "127.0.1.1"
    failed = [(c.name, c.node) for c in judge.judge(nodes, records) if not c.ok]
    assert failed == [("hostname", odd)]


def test_healthy_sparse_records_say_how_many_planned_links_were_tested() -> None:
    nodes = names(30)
    records = sparse_healthy(nodes)
    peers = {c.node: c.detail for c in judge.judge(nodes, records) if c.name == "peers"}
    assert peers[nodes[0]] == f"reached {len(records[nodes[0]]['peers'])} planned peer(s), reached by 29 of 29"


def test_the_listener_answers_a_burst_sized_to_its_plan() -> None:
    """More simultaneous peers than the old fixed backlog (64): every one is answered and heard."""
    port, burst = _free_port(), 300
    listener = probe.Listener("rank0", port, probe.backlog_for(burst))
    results: dict[int, dict[str, Any]] = {}

    def one(i: int) -> None:
        results[i] = probe.reach(f"peer{i}", "127.0.0.1", port, None, time.time() + 10)

    try:
        assert listener.error is None and listener.backlog == burst + probe.MIN_BACKLOG
        threads = [threading.Thread(target=one, args=(i,)) for i in range(burst)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert sorted(i for i, r in results.items() if r["ok"]) == list(range(burst))
        deadline = time.time() + 5
        while len(listener.heard) < burst and time.time() < deadline:
            time.sleep(0.01)
        assert listener.heard == {f"peer{i}" for i in range(burst)}
    finally:
        listener.close()
