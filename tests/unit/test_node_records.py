"""Records per node (issue 43): a rank's start and exit records reach the node's one file through its agent, the
rank writes its own files only where the agent did not confirm them, and stack dumps reach the shared file system
only on a hang."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from ddpslurm import jobfolder
from ddpslurm.launch import records
from ddpslurm.launch.node_live import NEWS_MIN_S, STACK_COPY_S, NodeAgent, RankLink
from ddpslurm.launch.rank_state import RankState


def _agent(tmp_path: Path, local_ranks: int = 2) -> NodeAgent:
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    attempt = tmp_path / "attempt_0"
    jobfolder.host_folder(attempt, "n1").mkdir(parents=True, exist_ok=True)
    return NodeAgent(local, jobfolder.node_file_path(attempt, "n1"), "n1", local_ranks, 5.0, None,
                     alive=lambda pid: True)


def _start(rank: int) -> dict:
    return records.start_record(rank=rank, local_rank=rank, node_rank=0, world_size=2, local_world_size=2,
                                host="n1", pid=100 + rank, job_id="7", step_id="0", attempt=0, launcher="srun",
                                master_addr="n1", master_port=29500, unix=1.78e9, versions={"torch": "2.13.0"},
                                env={"NCCL_DEBUG": "INFO"})


def _state(attempt: Path, rank: int, link: RankLink | None) -> RankState:
    return RankState(SimpleNamespace(grace_s=30), SimpleNamespace(rank=rank, job_id="7"), 0,
                     jobfolder.rank_paths(attempt, rank, "n1"), SimpleNamespace(stop=lambda timeout: None), link)


def test_a_start_record_is_news_and_reaches_the_node_file_whole(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    attempt = agent.node_file.parent
    states = [_state(attempt, rank, RankLink(agent.local, rank, rank)) for rank in (0, 1)]
    for state in states:
        state.link.publish(progress=None)
    agent.tick(100.0)
    states[0].start_record(_start(0))
    agent.tick(100.0 + NEWS_MIN_S / 2)
    assert jobfolder.read_rank_records(attempt, "start") == {}  # news waits NEWS_MIN_S after the last write
    agent.tick(100.0 + NEWS_MIN_S)  # progress alone would wait the 5 s interval: a start is written within a second
    assert jobfolder.read_rank_records(attempt, "start") == {0: _start(0)}
    states[1].start_record(_start(1))
    states[0].exit_record("exception", 1, exception={"type": "ValueError", "message": "bad", "traceback": "tb"})
    states[1].exit_record("ok", 0)
    assert agent.tick(100.0 + 2 * NEWS_MIN_S) is False  # every end written: the agent leaves
    assert all(state.link.wait_flushed(0.1) for state in states)
    for state in states:
        state.flush()
    exits = jobfolder.read_rank_records(attempt, "exit")
    assert {r: (e["kind"], e["status"], e["exit_code"], e["job_id"]) for r, e in exits.items()} == {
        0: ("exit", "exception", 1, "7"), 1: ("exit", "ok", 0, "7")}
    assert exits[0]["exception"]["type"] == "ValueError"
    assert sorted(jobfolder.read_rank_records(attempt, "start")) == [0, 1]
    assert list(jobfolder.host_folder(attempt, "n1").iterdir()) == []  # confirmed: no file of the rank's own


def test_a_rank_whose_agent_does_not_confirm_writes_its_own_records(tmp_path: Path) -> None:
    """The agent killed (or stuck): the rank's wait for it runs out, and its records go into its host folder."""
    attempt = tmp_path / "attempt_0"
    local = tmp_path / "local"
    local.mkdir()
    state = _state(attempt, 3, RankLink(local, 3, 0))
    state.start_record(_start(3))
    state.exit_record("signal", 143, final=True, signal="SIGTERM")
    assert not jobfolder.rank_paths(attempt, 3, "n1")["exit"].exists()  # told the agent only, so far
    assert state.link.wait_flushed(0.05) is False  # no agent answers
    state.link.wait_flushed = lambda timeout_s=0.0: False  # (the rank's wait, FLUSH_WAIT_S, runs out alike)
    state.flush()
    exits, starts = jobfolder.read_rank_records(attempt, "exit"), jobfolder.read_rank_records(attempt, "start")
    assert (exits[3]["status"], exits[3]["exit_code"], exits[3]["signal"]) == ("signal", 143, "SIGTERM")
    assert starts[3] == _start(3)


def test_a_rank_without_a_link_writes_its_own_records_at_once(tmp_path: Path) -> None:
    attempt = tmp_path / "attempt_0"
    state = _state(attempt, 2, None)
    state.start_record(_start(2))
    state.exit_record("ok", 0)
    assert jobfolder.read_rank_records(attempt, "exit")[2]["status"] == "ok"
    assert jobfolder.read_rank_records(attempt, "start") == {2: _start(2)}


def test_the_agent_copies_stack_dumps_to_the_shared_folder_only_after_the_stack_signal(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    link = RankLink(agent.local, 0, 0)
    link.publish(progress=None)
    header = "# ddpslurm stack dump file: rank 0 host n1 pid 100\n"
    (agent.local / "rank_0.stacks.txt").write_text(header + 'Thread 0x1 (most recent call first):\n  File "t.py"\n')
    (agent.local / "rank_1.stacks.txt").write_text(header.replace("rank 0", "rank 1"))  # no dump: header only
    host_dir = jobfolder.host_folder(agent.node_file.parent, "n1")
    agent.tick(1.0)
    assert list(host_dir.iterdir()) == []  # no hang: nothing on the shared file system
    agent.stack_signal_at = time.time() - STACK_COPY_S
    agent.tick(2.0)
    assert [p.name for p in host_dir.iterdir()] == ["rank_0.stacks.txt"]
    assert (host_dir / "rank_0.stacks.txt").read_text() == (agent.local / "rank_0.stacks.txt").read_text()
    assert agent.copy_stacks() == 0  # unchanged since: not copied again
    with open(agent.local / "rank_1.stacks.txt", "a") as handle:
        handle.write("Thread 0x2 (most recent call first):\n")
    assert agent.copy_stacks() == 1


def test_node_files_stay_small_with_the_records(tmp_path: Path) -> None:
    """8 local ranks' start and exit records (environment and versions included) in one node file: a few kB, far
    under the readers' caps."""
    agent = _agent(tmp_path, local_ranks=8)
    for rank in range(8):
        state = _state(agent.node_file.parent, rank, RankLink(agent.local, rank, rank))
        state.start_record(_start(rank))
        state.exit_record("ok", 0)
    agent.tick(1.0)
    size = agent.node_file.stat().st_size
    assert size < jobfolder.MAX_RECORDS_BYTES // 1000
    assert len(json.loads(agent.node_file.read_text())["ranks"]) == 8


def test_a_hung_ranks_stacks_reach_its_host_folder_from_the_node_local_dump(tmp_path: Path) -> None:
    """The heartbeat thread dumps node-locally (no stack signal came), then copies the dump into the host folder
    before it records `hang` and leaves."""
    from ddpslurm.launch import heartbeat

    attempt, local = tmp_path / "attempt_0", tmp_path / "local"
    local.mkdir()
    state = _state(attempt, 3, RankLink(local, 3, 0))
    stacks = open(local / "rank_3.stacks.txt", "a", encoding="utf-8")  # noqa: SIM115 - as register_stack_dump's
    stacks.write("# ddpslurm stack dump file: rank 3\n")
    stacks.flush()
    thread = heartbeat.HeartbeatThread(state, 0.05, stacks)
    exits: list[int] = []
    thread.exit = exits.append
    state.link.wait_flushed = lambda timeout_s=0.0: False  # no agent: the rank's own files
    thread.end_for_hang({"timeout_s": 30, "stalled": [3]})
    assert exits == [heartbeat.HANG_EXIT_CODE]
    shared = jobfolder.host_folder(attempt, "n1") / "rank_3.stacks.txt"
    assert "most recent call first" in shared.read_text() and "end_for_hang" in shared.read_text()
    assert jobfolder.read_rank_records(attempt, "exit")[3]["status"] == "hang"
