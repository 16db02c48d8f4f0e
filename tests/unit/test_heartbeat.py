"""The heartbeat (rank side) and the hang monitor (batch step) of `submit --hang-timeout`, without Slurm."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddpslurm import jobfolder
from ddpslurm.errors import UsageError
from ddpslurm.launch import hang_monitor, heartbeat
from ddpslurm.launch.hang_monitor import HangMonitor, Progress, stalled_ranks
from ddpslurm.launch.node_files import NodeFiles
from ddpslurm.launch.node_live import RankLink, node_record
from ddpslurm.launch.plan import batch_setup, plan
from ddpslurm.launch.spec import make_spec


@pytest.mark.parametrize("changes, now, timeout, finished, expected", [
    ({0: 0.0, 1: 0.0}, 29.0, 30, (), []),
    ({0: 0.0, 1: 0.0}, 30.0, 30, (), [0, 1]),
    ({0: 10.0, 1: 0.0, 2: 5.0}, 39.0, 30, (), [1, 2]),  # most stalled first
    ({0: 10.0, 1: 0.0}, 39.0, 30, (1,), []),  # an ended rank is not watched
])
def test_stalled_ranks(changes, now, timeout, finished, expected):
    progress = Progress(changed=dict(changes))
    assert stalled_ranks(progress, finished, now, timeout) == expected


def test_progress_is_a_changed_key_timed_by_the_monitor_clock():
    progress = Progress()
    progress.observe({0: (10, 5), 1: (20, 5)}, now=1.0)
    progress.observe({0: (10, 5), 1: (22, 6)}, now=5.0)  # rank 1 moved
    assert progress.changed == {0: 1.0, 1: 5.0}


def test_node_files_give_progress_and_ends_from_one_listing(tmp_path: Path):
    _node(tmp_path, "n1", {0: {"progress": {"collectives": 4, "step": 2, "unix": 1.0}},
                           3: {"progress": {"collectives": 4, "step": 2, "unix": 1.0}, "exit": {"status": "ok"}}})
    (tmp_path / "node_n2.json").write_text("not json at all")
    (tmp_path / ".node_n3.json.1.tmp").write_text("{}")
    (tmp_path / "rank_4.heartbeat.json").write_text("{}")  # the older layout's per-rank files are not listed for
    files = NodeFiles(tmp_path)
    assert files.poll() == 1
    assert files.progress() == {0: (None, 4, 2), 3: (None, 4, 2)} and sorted(files.exits()) == [3]
    assert NodeFiles(tmp_path / "missing").poll() == 0


def _node(folder: Path, host: str, ranks: dict[int, dict]) -> None:
    jobfolder.write_json(jobfolder.node_file_path(folder, host),
                         node_record(host, {r: {"rank": r, **st} for r, st in ranks.items()}, 1, 5.0, 0.0))


def _beat(folder: Path, steps: dict[int, int]) -> None:
    """Node n1's agent writes its ranks' last steps."""
    _node(folder, "n1", {rank: {"progress": {"collectives": step, "step": step, "unix": float(step)}}
                         for rank, step in steps.items()})


def test_monitor_signals_then_requests_then_kills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    sent: list[tuple[str, str]] = []
    monitor = HangMonitor(tmp_path, "77", 30, signal_job=lambda job, sig: sent.append((job, sig)))
    for t in range(0, 20):  # both ranks progress for 20 s
        _beat(tmp_path, {0: t, 1: t})
        monitor.poll(float(t))
    for t in range(20, 45):  # rank 0 goes on; rank 1 stops after t=19
        _beat(tmp_path, {0: t, 1: 19})
        monitor.poll(float(t))
    assert sent == [] and not (tmp_path / "hang.json").exists()
    _beat(tmp_path, {0: 49, 1: 19})
    monitor.poll(49.0)  # rank 1 silent since 19: 30 s
    assert sent == [("77", str(int(signal.SIGWINCH)))] and monitor.stalled == [1]
    monitor.poll(50.0)
    assert not (tmp_path / "hang.json").exists()  # the stacks get STACK_WAIT_S first
    monitor.poll(49.0 + hang_monitor.STACK_WAIT_S)
    request = json.loads((tmp_path / "hang.json").read_text())
    assert request["stalled"] == [1] and request["timeout_s"] == 30
    assert request["seconds_since_progress"]["1"] == pytest.approx(49.0 + hang_monitor.STACK_WAIT_S - 19, abs=0.2)
    monitor.poll(60.0)
    assert sent == [("77", str(int(signal.SIGWINCH)))]
    monitor.poll(49.0 + hang_monitor.STACK_WAIT_S + hang_monitor.KILL_AFTER_S)
    assert sent == [("77", str(int(signal.SIGWINCH))), ("77", "KILL")]


def test_hang_timeout_option(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    spec = make_spec(script, nodes=2, hang_timeout_s=30, max_requeues=0, folder=tmp_path)
    setup = "\n".join(batch_setup(spec, "/usr/bin/python3"))
    assert "--hang-timeout 30" in setup and "ddpslurm.launch.batch" in setup
    assert ("DDPSLURM_HEARTBEAT_S", "1") in plan(spec).worker.env_defaults
    off = make_spec(script, nodes=2, folder=tmp_path)
    assert "--hang-timeout" not in "\n".join(batch_setup(off, "python3"))
    assert all(name != "DDPSLURM_HEARTBEAT_S" for name, _ in plan(off).worker.env_defaults)
    with pytest.raises(UsageError, match="too short"):
        make_spec(script, hang_timeout_s=3, folder=tmp_path)
    with pytest.raises(UsageError, match="needs Slurm"):
        make_spec(script, hang_timeout_s=30, local=True, folder=tmp_path)


def test_heartbeat_counts_steps(tmp_path: Path):
    """A step the script names, then one more a call: what the thread tells the node's agent."""
    state, _ = _state(tmp_path)
    state.final_code = 0  # the script has ended: the hang request below only ends the thread
    thread = heartbeat.HeartbeatThread(state, 0.02, io.StringIO())
    heartbeat.heartbeat(step=41)
    heartbeat.heartbeat()
    thread.start()
    try:
        deadline = time.time() + 5
        while time.time() < deadline and '"step": 42' not in _read(tmp_path / "rank_3.json"):
            time.sleep(0.02)
    finally:
        _write_request(tmp_path / "hang.json", {})  # the agent's node-local copy of the monitor's request
        thread.join(5)
    assert json.loads(_read(tmp_path / "rank_3.json"))["progress"]["step"] == 42 and not thread.is_alive()


def _state(attempt_dir: Path, rank: int = 3):
    written: list[tuple[str, int, dict]] = []
    state = SimpleNamespace(dist=SimpleNamespace(rank=rank), paths={"exit": attempt_dir / f"rank_{rank}.exit.json"},
                            final_code=None, tee=SimpleNamespace(stop=lambda timeout: None),
                            link=RankLink(attempt_dir, rank, 0),
                            exit_record=lambda status, code, **fields: written.append((status, code, fields)))
    return state, written


def _write_request(path: Path, request: dict) -> None:
    """As the monitor writes hang.json: atomically (the thread acts as soon as the name exists)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(request))
    os.replace(tmp, path)


def _rank_state(attempt_dir: Path, rank: int = 3):
    """The worker's real per-rank state (its exit record lock and seal are part of what is tested)."""
    from ddpslurm.jobfolder import rank_paths
    from ddpslurm.launch.rank_state import RankState

    return RankState(SimpleNamespace(grace_s=30), SimpleNamespace(rank=rank, job_id="7"), 0,
                     rank_paths(attempt_dir, rank), SimpleNamespace(stop=lambda timeout: None),
                     RankLink(attempt_dir, rank, 0))


def test_thread_writes_progress_and_ends_on_request(tmp_path: Path):
    state = _rank_state(tmp_path)
    assert heartbeat.start({}, state) is None  # no DDPSLURM_HEARTBEAT_S: nothing runs
    stacks = open(tmp_path / "rank_3.stacks.txt", "a+", encoding="utf-8")  # noqa: SIM115 - the thread keeps it
    stacks.write("# header\n")
    stacks.flush()
    thread = heartbeat.HeartbeatThread(state, 0.05, stacks)
    exits: list[int] = []
    thread.exit = exits.append
    thread.start()
    heartbeat.heartbeat(step=7)
    deadline = time.time() + 5
    while time.time() < deadline and '"step": 7' not in _read(tmp_path / "rank_3.json"):
        time.sleep(0.05)
    assert json.loads(_read(tmp_path / "rank_3.json"))["progress"]["step"] == 7
    _write_request(tmp_path / "hang.json", {"timeout_s": 30, "stalled": [3]})  # the agent's node-local copy
    thread.join(8)
    assert exits == [heartbeat.HANG_EXIT_CODE]
    told = json.loads(_read(tmp_path / "rank_3.json"))["exit"]  # the node's agent is told how the rank ended
    assert (told["status"], told["exit_code"]) == ("hang", 124)
    record = json.loads((tmp_path / "rank_3.exit.json").read_text())
    assert (record["status"], record["exit_code"], record["reason"], record["hang_timeout_s"], record["stalled"]) == (
        "hang", 124, "hang_monitor", 30, [3])
    # the main thread failing afterwards (a peer left) changes nothing
    assert state.exit_record("exception", 1) is False
    assert json.loads((tmp_path / "rank_3.exit.json").read_text())["status"] == "hang"
    dump = _read(tmp_path / "rank_3.stacks.txt")  # no signal came: the thread dumped the stacks itself
    assert "test_thread_writes_progress_and_ends_on_request" in dump and "most recent call first" in dump


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


STUCK_RANK = """
import os, signal, sys, time
from pathlib import Path
from ddpslurm.launch import heartbeat
heartbeat.register_stack_dump(Path(sys.argv[1]), 5)
def stuck_in_a_function():
    print("ready", flush=True)
    time.sleep(60)
stuck_in_a_function()
"""


def test_stack_signal_dumps_every_thread_of_a_stuck_process(tmp_path: Path):
    path = tmp_path / "rank_5.stacks.txt"
    proc = subprocess.Popen([sys.executable, "-c", STUCK_RANK, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(heartbeat.STACK_SIGNAL)
        deadline = time.time() + 10
        while time.time() < deadline and "stuck_in_a_function" not in _read(path):
            time.sleep(0.05)
        assert proc.poll() is None  # the signal dumps; it does not end the process
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    text = _read(path)
    assert text.startswith("# ddpslurm stack dump file: rank 5 host ")
    assert re.search(r'File "<string>", line [78] in stuck_in_a_function\n  File "<string>", line 9 in <module>', text)


def test_collective_count_follows_real_gloo_collectives(tmp_path: Path):
    code = """
import os, sys
from ddpslurm.launch.heartbeat import collective_count
assert collective_count() is None
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
before = collective_count()
for _ in range(3):
    dist.all_reduce(torch.ones(2))
print(before, collective_count())
dist.destroy_process_group()  # a group left to interpreter shutdown may abort in gloo's threads (torch#179291)
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = map(int, out.stdout.split())
    assert after == before + 3


FR_PROBE = """
import json, os, sys, torch, torch.distributed as dist
from ddpslurm.launch.heartbeat import flight_recorder_json
flight_recorder_json()  # torch.distributed imported, no group yet: must not raise
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
dist.all_reduce(torch.ones(3))
dist.broadcast(torch.ones(2), 0)
text = flight_recorder_json()
entries = json.loads(text)["entries"]
print(json.dumps([(e["collective_seq_id"], e["profiling_name"], e["input_sizes"]) for e in entries]))
os._exit(0)
"""


def test_flight_recorder_json_is_text_torch_wrote_for_gloo(tmp_path: Path) -> None:
    """A real gloo process group: the dump is JSON text (torch returns bytes) with the collectives in order."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run([sys.executable, "-c", FR_PROBE, str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    issued = json.loads(done.stdout.strip().splitlines()[-1])
    assert [[seq, name] for seq, name, _ in issued][-2:] == [[1, "gloo:all_reduce"], [2, "gloo:broadcast"]]
    assert issued[-1][2] == [[2]]


def test_no_flight_recorder_without_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    assert heartbeat.flight_recorder_json() is None


def test_a_silence_shorter_than_two_node_intervals_is_never_a_hang(tmp_path: Path):
    """At 20,000 nodes a node file is rewritten every 20 s: a 10 s --hang-timeout would take every rank for hung."""
    assert hang_monitor.effective_timeout_s(30, 5.0) == 30
    assert hang_monitor.effective_timeout_s(10, 20.0) == 42
    sent: list[tuple[str, str]] = []
    monitor = HangMonitor(tmp_path, "77", 10, signal_job=lambda job, sig: sent.append((job, sig)))
    jobfolder.write_json(jobfolder.node_file_path(tmp_path, "n1"), node_record(
        "n1", {0: {"rank": 0, "progress": {"collectives": 1, "step": 1, "unix": 0.0}}}, 1, 20.0, 0.0))
    monitor.poll(0.0)
    monitor.poll(41.0)
    assert sent == []
    monitor.poll(42.0)
    assert sent and monitor.stalled == [0]


def test_a_rank_restarted_in_place_is_progress_before_its_first_step(tmp_path: Path):
    """torchrun's in-place restart: the failed and the stopped workers are silent from the failure until their new
    processes' first steps, longer than a short --hang-timeout; each new process's start is progress. A new process
    that then makes no progress is still a hang."""
    sent: list[tuple[str, str]] = []
    monitor = HangMonitor(tmp_path, "77", 10, signal_job=lambda job, sig: sent.append((job, sig)))

    def poll(t: int, pid: int, steps: dict[int, int | None]) -> None:
        states = {}
        for rank, step in steps.items():
            states[rank] = {"pid": pid + rank, "start": {"kind": "start"}}
            if step is not None:
                states[rank]["progress"] = {"collectives": step, "step": step, "unix": float(step)}
        _node(tmp_path, "n1", states)
        monitor.poll(float(t))

    for t in range(0, 20):
        poll(t, 100, {0: t, 1: t})
    for t in range(20, 29):  # rank 1's worker died at 20; torchrun stops rank 0's, rendezvous, starts new ones
        poll(t, 100, {0: 19, 1: 19})
    for t in range(29, 38):  # the new processes have started, and load the checkpoint
        poll(t, 200, {0: None, 1: None})
    for t in range(38, 45):  # their first steps: 19 s after the last ones
        poll(t, 200, {0: t, 1: t})
    assert sent == []
    for t in range(45, 60):  # rank 1's new process stops at its step 44
        poll(t, 200, {0: t, 1: 44})
    assert sent == [("77", str(int(signal.SIGWINCH)))] and monitor.stalled == [1]
