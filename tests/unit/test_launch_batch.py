"""The batch-step supervisor's requeue rule (pure) and its reading of an attempt folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ddpslurm import jobfolder, preemption
from ddpslurm.launch.batch import NONE, REQUEUE, WAIT, AttemptReader, decide, main, read_attempt
from ddpslurm.launch.node_live import node_record

SIG = 1000.0


def rec(status: str, unix: float) -> dict:
    return {"status": status, "unix": unix}


@pytest.mark.parametrize(("exits", "signal_unix", "running", "now", "attempt", "action", "why"), [
    ({}, None, True, SIG, 0, WAIT, "no preemption"),
    ({0: rec("ok", 5.0), 1: rec("ok", 5.0)}, None, False, SIG, 0, NONE, "no preemption"),
    ({0: rec("preempted", SIG + 3), 1: rec("preempted", SIG + 3)}, SIG, False, SIG + 4, 0, REQUEUE, "ended after"),
    ({0: rec("preempted", SIG + 3)}, SIG, True, SIG + 4, 0, WAIT, "[1] still stopping"),
    ({0: rec("preempted", SIG + 3), 1: rec("preempted", SIG + 3)}, SIG, True, SIG + 4, 0, WAIT, "srun is ending"),
    ({1: rec("preempted", SIG + 3)}, SIG, True, SIG + 30, 0, REQUEUE, "ran out with rank(s) [0]"),
    ({}, SIG, True, SIG + 30, 0, REQUEUE, "ran out with rank(s) [0, 1]"),
    ({1: rec("exception", SIG - 2), 0: rec("preempted", SIG + 1)}, SIG, False, SIG + 4, 0, NONE, "[1] failed before"),
    ({1: rec("exception", SIG + 2), 0: rec("preempted", SIG + 1)}, SIG, False, SIG + 4, 0, REQUEUE, "ended after"),
    ({0: rec("preempted", SIG + 3), 1: rec("preempted", SIG + 3)}, SIG, False, SIG + 4, 3, NONE, "--max-requeues 3"),
    ({}, SIG, False, SIG + 4, 0, REQUEUE, "ended after"),  # killed after the signal: restart from the checkpoint
])
def test_decide(exits: dict, signal_unix: float | None, running: bool, now: float, attempt: int, action: str,
                why: str) -> None:
    got = decide(exits=exits, signal_unix=signal_unix, world_size=2, srun_running=running, now=now, grace_s=20,
                 attempt=attempt, max_requeues=3)
    assert got.action == action and why in got.reason, got


def _node(attempt: Path, host: str, ranks: dict[int, dict]) -> None:
    """A node file as the node's agent writes it (ddpslurm.launch.node_live)."""
    jobfolder.write_json(jobfolder.node_file_path(attempt, host),
                         node_record(host, {r: {"rank": r, **s} for r, s in ranks.items()}, 1, 5.0, 0.0))


def test_read_attempt_takes_the_earliest_signal_and_skips_bad_files(tmp_path: Path) -> None:
    _node(tmp_path, "n1", {0: {"signal": {"unix": 12.5}}, 1: {"signal": {"unix": 11.0},
                                                           "exit": {"status": "preempted", "unix": 13.0}}})
    (tmp_path / "node_n2.json").write_text("{half a rec")
    (tmp_path / "node_n3.json").write_text(json.dumps(["not", "a", "record"]))
    (tmp_path / "rank_5.signal.json").write_text(json.dumps({"rank": 5, "unix": 1.0}))  # no per-rank signal files
    exits, first = read_attempt(tmp_path)
    assert first == 11.0 and list(exits) == [1] and exits[1]["status"] == "preempted"
    assert read_attempt(tmp_path / "missing") == ({}, None)


def test_read_attempt_at_the_end_takes_the_exit_records_no_node_file_has(tmp_path: Path) -> None:
    """The agent of node n2 was killed with its node: its rank's own exit record (host folder) still counts."""
    _node(tmp_path, "n1", {0: {"signal": {"unix": 3.0}, "exit": {"status": "preempted", "unix": 4.0}}})
    jobfolder.write_json(jobfolder.rank_paths(tmp_path, 1, "n2")["exit"],
                         {"rank": 1, "status": "preempted", "unix": 5.0, "signal_unix": 2.5})
    reader = AttemptReader(tmp_path, world_size=2)
    exits, first = reader.poll()
    assert first == 3.0 and list(exits) == [0]
    exits, first = reader.poll(final=True)
    assert first == 2.5 and sorted(exits) == [0, 1] and exits[1]["status"] == "preempted"


def test_main_needs_a_command_after_the_separator(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--folder", "x", "--world-size", "2", "--grace", "5", "--max-requeues", "1", "--"])
    assert done.value.code == 2 and "srun command" in capsys.readouterr().err


def test_the_flag_is_seen_only_once_asked_after_the_signal() -> None:
    preemption.reset()
    try:
        assert not preemption.preemption_requested() and not preemption.flag_seen()
        preemption.request(15)
        assert not preemption.flag_seen()
        assert preemption.preemption_requested() and preemption.flag_seen()
    finally:
        preemption.reset()


def test_reader_reads_only_node_files_that_changed_and_needs_a_signal(tmp_path: Path) -> None:
    reader = AttemptReader(tmp_path)
    _node(tmp_path, "n1", {0: {"exit": {"status": "exception", "unix": 5.0}}})
    assert reader.poll() == ({}, None)
    assert reader.files.poll() == 0  # unchanged: listed, not read
    _node(tmp_path, "n2", {1: {"signal": {"unix": 9.0}}})
    exits, first = reader.poll()
    assert first == 9.0 and list(exits) == [0] and reader.signalled == {1}
    _node(tmp_path, "n2", {1: {"signal": {"unix": 9.0}, "exit": {"status": "preempted", "unix": 10.0}}})
    exits, _ = reader.poll()
    assert sorted(exits) == [0, 1]


def test_a_rank_killed_without_a_signal_is_no_preemption() -> None:
    """Rank 1 SIGKILLed from outside: srun's kill-on-bad-exit SIGTERMs rank 0, which takes it as the flag.
    Rank 1 left neither a record nor a signal: the job failed, it is not requeued."""
    exits = {0: rec("preempted", SIG + 1)}
    args = dict(exits=exits, signal_unix=SIG, world_size=2, srun_running=False, now=SIG + 2, grace_s=20,
                attempt=0, max_requeues=3)
    got = decide(**args, signalled=frozenset({0}))
    assert got.action == NONE and "[1]" in got.reason and "killed" in got.reason
    assert decide(**args, signalled=frozenset({0, 1})).action == REQUEUE  # killed after its signal


def test_supervise_returns_srun_status_and_records_why_it_did_not_requeue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for srun: rank 0 took a SIGTERM and left its record, rank 1 vanished (SIGKILLed)."""
    from ddpslurm.launch.batch import supervise

    conf = tmp_path / "slurm.conf"
    conf.write_text("# stand-in\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    attempt = tmp_path / "job_77" / "attempt_0"
    monkeypatch.delenv("DDPSLURM_FOLDERS_MADE", raising=False)
    # records stamped now, and the stand-in lives on 1.5 s: the supervisor's polls (every second) while it runs must
    # find the 20 s grace time running, not over. Its node file is what node n1's agent writes.
    fake_srun = ("now=$(date +%s) && printf '{\"ranks\": {\"0\": {\"signal\": {\"unix\": %s}, \"exit\": "
                 "{\"status\": \"preempted\", \"unix\": %s}}}}' \"$now\" \"$now\" > node_n1.json && "
                 "test -d n1 && test -d n2 && test -d ../checkpoints && sleep 1.5 && exit 9")
    code = supervise(["sh", "-c", f"cd {attempt} && {fake_srun}"], folder=str(tmp_path), world_size=2, grace_s=20,
                     max_requeues=3, environ={"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert code == 9  # the folders were there before srun (else `test -d` exits 1)
    assert os.environ.pop("DDPSLURM_FOLDERS_MADE") == str(attempt)
    record = json.loads((attempt / "requeue.json").read_text())
    assert record["requeued"] is False and "[1]" in record["why_not"]


@pytest.mark.parametrize("refused", [False, True])
def test_the_requeue_is_recorded_before_slurm_is_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: bool) -> None:
    """Slurm's requeue ends the batch step that asked for it, maybe before its next line: `requeue.json` must
    already say so when `scontrol requeue` runs; a refused requeue rewrites it with why."""
    from ddpslurm.launch import batch, requeue

    seen: list[dict] = []

    def ask_slurm(job_id: str) -> None:
        seen.append(json.loads(jobfolder.requeue_path(tmp_path).read_text()))
        if refused:
            raise RuntimeError("scontrol: error: Job is not requeueable\nmore")

    monkeypatch.setattr(batch, "job_state", lambda job_id: "RUNNING")
    monkeypatch.setattr(requeue, "requeue_job", ask_slurm)
    assert batch.requeue_if_running("5", tmp_path, "preempted") is not refused
    assert seen and seen[0]["requeued"] is True and seen[0]["job_id"] == "5"
    final = json.loads(jobfolder.requeue_path(tmp_path).read_text())
    assert final["requeued"] is not refused
    assert final.get("why_not") == ("scontrol: error: Job is not requeueable" if refused else None)


def test_a_job_slurm_no_longer_runs_is_not_requeued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpslurm.launch import batch, requeue

    monkeypatch.setattr(batch, "job_state", lambda job_id: "CANCELLED")
    monkeypatch.setattr(requeue, "requeue_job", lambda job_id: pytest.fail("Slurm asked to requeue"))
    assert batch.requeue_if_running("5", tmp_path, "preempted") is False
    final = json.loads(jobfolder.requeue_path(tmp_path).read_text())
    assert final["requeued"] is False and "CANCELLED" in final["why_not"]
