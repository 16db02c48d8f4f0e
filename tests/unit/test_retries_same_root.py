"""`submit --retries` same-root budget: fingerprints, progress read from real job folders written by ddpslurm's own
writers (job record, exit records, heartbeat records, checkpoint names), and the chain stopping on a repeated root."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ddpslurm import jobfolder
from ddpslurm.launch import same_root
from ddpslurm.launch.heartbeat import progress_record
from ddpslurm.launch.node_live import node_record
from ddpslurm.launch.plan import plan as make_plan
from ddpslurm.launch.records import exit_record
from ddpslurm.launch.retries import chain_lines, chain_of_job, run_chain
from ddpslurm.launch.spec import make_spec
from ddpslurm.launch.submit import job_record
from ddpslurm.sanitize import terminal
from tests.unit.test_retries import FakeCluster

RANKS = 4


def write_job(job_dir: Path, script: Path, *, step: int | None = None, exception: str | None = None,
              failing_rank: int = 2, checkpoint: str | None = None, records_in: str = "node") -> None:
    """A job folder as a failed job leaves it: the job record, every rank's exit record (in its node's file, or with
    `records_in="rank"` in a file of its own as older job folders hold them), heartbeats, checkpoints."""
    spec = make_spec(script, nodes=2, max_requeues=0)
    jobfolder.write_json(jobfolder.job_record_path(job_dir), job_record(spec, make_plan(spec), job_dir.name[4:], 1e9))
    attempt = jobfolder.attempt_folder(job_dir, 0)
    states: dict[str, dict[int, dict]] = {}
    for rank in range(RANKS):
        host = f"n0{rank // 2 + 1}"
        raised = exception is not None and rank == failing_rank
        info = {"type": exception, "message": "boom", "traceback": "..."} if raised else None
        record = exit_record(rank=rank, host=host, pid=100 + rank, job_id=job_dir.name[4:], attempt=0,
                             status="exception" if raised else "signal", exit_code=1, unix=time.time(),
                             exception=info)
        beat = progress_record(collectives=3 * step + rank, step=step, unix=time.time()) if step is not None else None
        states.setdefault(host, {})[rank] = {"rank": rank, "progress": beat}
        if records_in == "rank":
            jobfolder.write_json(jobfolder.rank_paths(attempt, rank, host)["exit"], record)
        else:
            states[host][rank]["exit"] = record
    for host, ranks in states.items():  # what each node's agent leaves (ddpslurm.launch.node_live)
        jobfolder.write_json(jobfolder.node_file_path(attempt, host), node_record(host, ranks, 1, 5.0, time.time()))
    folder = jobfolder.checkpoints_folder(job_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if checkpoint:
        (folder / checkpoint).write_bytes(b"\0")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return path


class RecordingCluster(FakeCluster):
    """FakeCluster whose jobs leave real job folders: each submission writes the next folder's records."""

    def __init__(self, root: Path, script: Path, jobs: list[tuple[dict, dict]]) -> None:
        super().__init__(root, [("failed", False, ("n01", "n02"), diagnosis) for diagnosis, _ in jobs])
        self.script, self.folders = script, [how for _, how in jobs]

    def submit(self, exclude: str | None) -> tuple[str, str]:
        job_id, folder = super().submit(exclude)
        write_job(Path(folder), self.script, **self.folders[int(job_id) - 101])
        return job_id, folder


RDZV = {"cause": "rendezvous_timeout", "retry": "requeue", "exclude_nodes": [], "first_failing_rank": None,
        "first_failing_host": None, "summary": "a rank never arrived"}
PORT = {"cause": "port_in_use", "retry": "requeue", "exclude_nodes": [], "first_failing_rank": 0,
        "first_failing_host": "n01", "summary": "port taken"}
BUG = {"cause": "user_code_exception", "retry": "stop", "exclude_nodes": [], "first_failing_rank": 2,
       "first_failing_host": "n02", "summary": "ValueError"}


def test_a_repeated_root_without_progress_stops_after_the_budget(tmp_path: Path, script: Path) -> None:
    cluster = RecordingCluster(tmp_path, script, [(RDZV, {"step": 40})] * 6)
    record = run_chain(cluster.steps(), retries=10, exclude=None)
    assert len(record["attempts"]) == same_root.SAME_ROOT_BUDGET == 3
    assert [a["repeats"] for a in record["attempts"]] == [1, 2, 3]
    assert [a["decision"] for a in record["attempts"]][:2] == ["resubmitted", "resubmitted"]
    stop = record["stop"]
    assert (stop["reason"], stop["fingerprint"], stop["repeats"], stop["budget"]) == \
        ("same_root", "rendezvous_timeout|script train.py", 3, 3)
    assert record["attempts"][-1]["decision"] == stop["text"] and "without progress" in stop["text"]
    assert record["attempts"][0]["progress"] == {"step": 40, "collectives": 123, "checkpoint_step": None}


@pytest.mark.parametrize("how", [
    [{"step": 40}, {"step": 90}, {"step": 150}, {"step": 151}, {"step": 200}],  # heartbeats
    [{"checkpoint": "step_000100.pt"}, {"checkpoint": "iter_0000200"}, {"checkpoint": "checkpoint-300"},
     {"checkpoint": "epoch=3-step=400.ckpt"}, {"checkpoint": "global_step500"}],  # checkpoint names
])
def test_a_root_that_repeats_with_progress_keeps_its_budget(tmp_path: Path, script: Path, how: list[dict]) -> None:
    cluster = RecordingCluster(tmp_path, script, [(RDZV, folder) for folder in how])
    record = run_chain(cluster.steps(), retries=4, exclude=None)
    assert len(record["attempts"]) == 5 and all(a["progressed"] for a in record["attempts"])
    assert [a["repeats"] for a in record["attempts"]] == [1, 1, 1, 1, 1]
    assert record["stop"]["reason"] == "no_retries_left"


def test_progress_lost_again_counts_as_a_repeat(tmp_path: Path, script: Path) -> None:
    """Past the previous job's point means past every earlier job's furthest point: 100, 50, 100 is no progress."""
    cluster = RecordingCluster(tmp_path, script, [(RDZV, {"step": 100}), (RDZV, {"step": 50}), (RDZV, {"step": 100})])
    record = run_chain(cluster.steps(), retries=5, exclude=None)
    assert [a["progressed"] for a in record["attempts"]] == [True, False, False]
    assert record["stop"]["reason"] == "same_root"


def test_a_node_level_root_is_the_node_and_interleaved_roots_count_apart(tmp_path: Path, script: Path) -> None:
    jobs = [(PORT, {}), (RDZV, {}), (PORT, {}), (RDZV, {}), (PORT, {})]
    record = run_chain(RecordingCluster(tmp_path, script, jobs).steps(), retries=10, exclude=None)
    port, rdzv = "port_in_use|node n01", "rendezvous_timeout|script train.py"
    assert [a["fingerprint"] for a in record["attempts"]] == [port, rdzv, port, rdzv, port]
    assert [a["repeats"] for a in record["attempts"]] == [1, 1, 2, 2, 3]
    assert (record["stop"]["reason"], record["stop"]["fingerprint"]) == ("same_root", "port_in_use|node n01")


def test_a_deterministic_root_stops_at_once_and_names_the_exception(tmp_path: Path, script: Path) -> None:
    record = run_chain(RecordingCluster(tmp_path, script, [(BUG, {"exception": "ValueError"})]).steps(),
                       retries=5, exclude=None)
    assert len(record["attempts"]) == 1
    stop = record["stop"]
    assert (stop["reason"], stop["fingerprint"], stop["budget"]) == \
        ("deterministic", "user_code_exception|script train.py ValueError", same_root.DETERMINISTIC_BUDGET)
    assert "would fail again" in stop["text"]


def test_status_reads_the_stop_reason_from_every_job_folder_of_the_chain(tmp_path: Path, script: Path) -> None:
    record = run_chain(RecordingCluster(tmp_path, script, [(RDZV, {})] * 3).steps(), retries=10, exclude=None)
    for attempt in record["attempts"]:  # what `ddpslurm status <job>` reads: retries.json in the job's folder
        chain = chain_of_job(attempt["job_id"], attempt["folder"])
        assert chain is not None and chain["stop"] == record["stop"]
        lines = chain_lines(chain, terminal)
        assert lines[-1] == f"stopped (same_root): {record['stop']['text']}"
        assert "[root rendezvous_timeout|script train.py, 3x]" in lines[-2]


def test_a_completed_chain_has_no_stop(tmp_path: Path, script: Path) -> None:
    cluster = FakeCluster(tmp_path, [("failed", False, ("n01", "n02"), {**PORT, "exclude_nodes": ["n01"]}),
                                     ("completed", True, ("n02", "n03"), None)])
    record = run_chain(cluster.steps(), retries=3, exclude=None)
    assert record["ok"] and record["stop"] is None
    assert record["attempts"][0]["fingerprint"] == "port_in_use|node n01"
    assert not any(line.startswith("stopped") for line in chain_lines(record))


@pytest.mark.parametrize(("diagnosis", "node_level", "script_name", "exception", "key"), [
    ({"cause": "node_failure", "exclude_nodes": ["n03", "n02"]}, True, "t.py", None, "node_failure|node n[02-03]"),
    ({"cause": "gpu_hardware", "exclude_nodes": [], "first_failing_host": "g7"}, True, "t.py", None,
     "gpu_hardware|node g7"),
    ({"cause": "rendezvous_timeout", "first_failing_host": "g7", "first_failing_rank": 5}, False, "t.py", None,
     "rendezvous_timeout|script t.py"),  # not a node's cause: neither the host nor the rank
    ({"cause": "user_code_exception", "first_failing_rank": 9}, False, "t.py", "KeyError",
     "user_code_exception|script t.py KeyError"),
    ({"cause": "cuda_oom"}, False, None, None, "cuda_oom|script ?"),
    ({"cause": None}, False, "t.py", None, None),
])
def test_fingerprint(diagnosis: dict, node_level: bool, script_name: str | None, exception: str | None,
                     key: str | None) -> None:
    assert same_root.fingerprint(diagnosis, node_level, script_name, exception) == key


@pytest.mark.parametrize("records_in", ["node", "rank"])
def test_the_exception_type_is_the_failing_ranks_whatever_rank_it_was(tmp_path: Path, script: Path,
                                                                      records_in: str) -> None:
    write_job(tmp_path / "job_1", script, exception="ValueError", failing_rank=1, records_in=records_in)
    write_job(tmp_path / "job_2", script, exception="ValueError", failing_rank=3, records_in=records_in)
    assert same_root.exception_type(tmp_path / "job_1", 1) == same_root.exception_type(tmp_path / "job_2", None) == \
        "ValueError"
    assert same_root.exception_type(tmp_path / "job_1", 0) == "ValueError"  # the failing rank left none: the others'
    write_job(tmp_path / "job_3", script)
    assert same_root.exception_type(tmp_path / "job_3") is None


def test_progress_of_an_empty_or_odd_folder_is_nothing(tmp_path: Path) -> None:
    assert same_root.progress_of(tmp_path / "missing") == same_root.Progress()
    attempt = jobfolder.attempt_folder(tmp_path, 0)
    attempt.mkdir(parents=True)
    jobfolder.heartbeat_path(attempt, 0).write_text("{not json")
    jobfolder.heartbeat_path(attempt, 1).write_text('{"step": true, "collectives": -4}')
    assert same_root.progress_of(tmp_path) == same_root.Progress()


@pytest.mark.parametrize(("history", "count"), [
    ([], 0),
    ([("a", True)], 1),
    ([("a", True), ("a", False), ("a", False)], 3),
    ([("a", True), ("a", True), ("a", False)], 2),
    ([("a", True), ("b", False), ("a", False)], 2),
    ([("a", False), ("a", False), ("b", True)], 1),
    ([("a", True), (None, False)], 0),
])
def test_repeats(history: list[tuple[str | None, bool]], count: int) -> None:
    assert same_root.repeats(history) == count


def test_budget_follows_the_analyzers_retry_verdict() -> None:
    assert same_root.budget("requeue") == 3
    assert same_root.budget("stop") == same_root.budget("unknown") == same_root.budget(None) == 1
