"""Liveness and records per node (ddpslurm.launch.node_live): the ranks' node-local files, the node's agent and the
one file it writes per node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpslurm import jobfolder
from ddpslurm.launch import node_live
from ddpslurm.launch.node_files import NodeFiles
from ddpslurm.launch.node_live import NEWS_MIN_S, NodeAgent, RankLink, node_interval_s


@pytest.mark.parametrize(("nodes", "interval"), [(1, 5.0), (1024, 5.0), (5000, 5.0), (8192, 8.192), (20000, 20.0)])
def test_interval_grows_with_the_job_from_5_s(nodes: int, interval: float) -> None:
    assert node_interval_s(nodes) == pytest.approx(interval)
    assert nodes / node_interval_s(nodes) <= node_live.NODE_WRITES_PER_S  # node-file writes a second: bounded


def test_interval_can_be_set_within_bounds() -> None:
    assert node_interval_s(8, {"DDPSLURM_NODE_INTERVAL_S": "0.5"}) == 0.5
    assert node_interval_s(8, {"DDPSLURM_NODE_INTERVAL_S": "0"}) == 5.0
    assert node_interval_s(8, {"DDPSLURM_NODE_INTERVAL_S": "soon"}) == 5.0


def test_local_folder_is_private_and_node_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = f"test.{os.getpid()}.0.n1"
    folder = node_live.local_folder({"TMPDIR": str(tmp_path)}, key, tmp_path / "fallback")
    try:
        assert folder.is_dir() and folder.stat().st_mode & 0o077 == 0 and folder.parent.stat().st_mode & 0o077 == 0
        assert folder.name == key and str(folder).startswith(("/dev/shm/", str(tmp_path)))
    finally:
        folder.rmdir()


def test_local_folder_refuses_one_others_could_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_live, "_private", lambda folder: False)  # every base squatted by someone else
    folder = node_live.local_folder({"TMPDIR": str(tmp_path)}, "k", tmp_path / "fallback")
    assert folder == tmp_path / "fallback" and folder.is_dir()


def _agent(tmp_path: Path, local_ranks: int = 2, hang: Path | None = None, alive=lambda pid: True) -> NodeAgent:
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    attempt = tmp_path / "attempt_0"
    attempt.mkdir(exist_ok=True)
    return NodeAgent(local, jobfolder.node_file_path(attempt, "n1"), "n1", local_ranks, 5.0, hang, alive=alive)


def _node_file(agent: NodeAgent) -> dict:
    return json.loads(agent.node_file.read_text())


def test_agent_writes_news_at_once_and_progress_at_its_interval(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    links = [RankLink(agent.local, rank, rank) for rank in (4, 5)]
    for link in links:
        link.publish(progress=None)
    assert agent.tick(100.0) and _node_file(agent)["serial"] == 1  # the ranks are here: written at once
    links[0].publish(progress={"collectives": 3, "step": 1, "unix": 100.1})
    agent.tick(101.0)
    agent.tick(104.9)
    assert _node_file(agent)["serial"] == 1  # progress alone waits for the interval
    agent.tick(105.0)
    assert _node_file(agent)["ranks"]["4"]["progress"]["step"] == 1
    links[1].publish(signal={"signal": "SIGTERM", "unix": 105.2})
    agent.tick(105.0 + NEWS_MIN_S)
    assert _node_file(agent)["ranks"]["5"]["signal"]["signal"] == "SIGTERM"  # news: within a second
    files = NodeFiles(agent.node_file.parent)
    files.poll()
    assert files.signals() == {5: 105.2} and files.progress() == {4: (os.getpid(), 3, 1)}  # (its process, ...)


def test_agent_ends_once_every_rank_ended_and_was_written(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    links = [RankLink(agent.local, rank, rank) for rank in (0, 1)]
    for link in links:
        link.publish(exit={"status": "ok", "exit_code": 0, "signal": None, "unix": 1.0})
    assert agent.tick(10.0) is False  # written, then done
    assert links[0].wait_flushed(0.1) and links[1].wait_flushed(0.1)
    assert sorted(_node_file(agent)["ranks"]) == ["0", "1"]
    agent.cleanup()
    assert not agent.local.exists() and links[0].wait_flushed(0.1)  # gone: the agent had written every end
    links[0].publish(progress={"collectives": 9, "step": 9, "unix": 11.0})  # a heartbeat thread's last look
    links[0].publish(exit={"status": "ok", "exit_code": 0, "signal": None, "unix": 12.0})
    assert not agent.local.exists()  # never made again (nor private, were it made by a rank)
    assert "progress" not in links[0].state  # told after the end: dropped


def test_agent_waits_for_a_rank_that_has_not_ended_and_leaves_when_none_is_alive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alive = {"yes": True}
    agent = _agent(tmp_path, alive=lambda pid: alive["yes"])
    RankLink(agent.local, 0, 0).publish(exit={"status": "ok", "exit_code": 0, "signal": None, "unix": 1.0})
    RankLink(agent.local, 1, 1).publish(progress=None)
    assert agent.tick(10.0) and agent.tick(11.0)
    alive["yes"] = False  # rank 1 was SIGKILLed before it could say how it ended
    monkeypatch.setattr(node_live, "ORPHAN_S", 0.0)
    assert agent.tick(12.0) is False
    assert "exit" not in _node_file(agent)["ranks"]["1"]


def test_agent_copies_the_hang_request_node_locally_once_the_stack_signal_came(tmp_path: Path) -> None:
    hang = tmp_path / "attempt_0" / "hang.json"
    agent = _agent(tmp_path, hang=hang)
    link = RankLink(agent.local, 0, 0)
    link.publish(progress=None)
    agent.tick(1.0)  # a first look
    jobfolder.write_json(hang, {"timeout_s": 30, "stalled": [0]})
    agent.tick(2.0)
    assert link.hang_request() is None  # no stack signal yet: the next look is HANG_LOOK_S later
    agent.stack_signal_at = 2.5
    agent.tick(3.0)
    assert link.hang_request() == {"timeout_s": 30, "stalled": [0]}


def test_one_agent_per_node_holds_the_lock_and_outlives_the_rank_that_forked_it(tmp_path: Path) -> None:
    """Two real ranks (processes) of one node: the first forks the agent, the second finds it; the first leaves
    early, the agent still writes the second's end."""
    local = tmp_path / "local"
    local.mkdir()
    attempt = tmp_path / "attempt_0"
    attempt.mkdir()
    code = f"""
import sys, time
from pathlib import Path
from ddpslurm.launch.node_live import RankLink, start_agent
rank = int(sys.argv[1])
link = RankLink(Path({str(local)!r}), rank, rank)
link.publish(progress=None)
pid = start_agent(Path({str(local)!r}), Path({str(attempt / "node_n1.json")!r}), "n1", 2, 5.0, None)
print("agent" if pid else "none", flush=True)
time.sleep(float(sys.argv[2]))
link.publish(exit={{"status": "ok", "exit_code": 0, "signal": None, "unix": time.time()}})
print("flushed" if link.wait_flushed() else "not flushed", flush=True)
"""
    first = subprocess.Popen([sys.executable, "-c", code, "0", "0.3"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)
    second = subprocess.Popen([sys.executable, "-c", code, "1", "1.5"], stdout=subprocess.PIPE, text=True)
    out = [first.communicate(timeout=30)[0].split(), second.communicate(timeout=30)[0].split()]
    assert sorted(words[0] for words in out) == ["agent", "none"] and all(w[1] == "flushed" for w in out)
    ranks = json.loads((attempt / "node_n1.json").read_text())["ranks"]
    assert {r: s["exit"]["status"] for r, s in ranks.items()} == {"0": "ok", "1": "ok"}
    deadline = time.time() + 5  # the agent leaves by itself once both ended, and removes the node-local folder
    while time.time() < deadline and local.exists():
        time.sleep(0.1)
    assert not local.exists()
