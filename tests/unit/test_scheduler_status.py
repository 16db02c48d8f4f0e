"""`ddpslurm status` library parts that need no Slurm: job references, record -> status, polling, text."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ddpslurm.errors import JobNotFoundError
from ddpslurm.scheduler.accounting import accounting_from_records
from ddpslurm.scheduler.parse import parse_sacct, parse_scontrol_show
from ddpslurm.scheduler.states import JobState
from ddpslurm.scheduler.status import (
    EXIT_JOB_FAILED,
    JobStatus,
    exit_code_for,
    merge,
    poll_until_terminal,
    render_text,
    resolve_job,
    status_from_accounting,
    status_from_scontrol,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm_out"
RECORDS = parse_sacct((DATA / "sacct_outcomes.txt").read_text())


@pytest.mark.parametrize(("ref", "job_id"), [("123", "123"), (" 42 ", "42"), ("7_3", "7_3")])
def test_resolve_job_ids(ref: str, job_id: str) -> None:
    assert resolve_job(ref) == (job_id, None)


def test_resolve_job_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ddpslurm_jobs" / "job_2815404"
    folder.mkdir(parents=True)
    assert resolve_job(str(folder) + "/") == ("2815404", str(folder))


def test_resolve_submitit_folder_by_its_submission_script(tmp_path: Path) -> None:
    (tmp_path / "991_submission.sh").write_text("#!/bin/bash\n")
    (tmp_path / "991_0_log.out").write_text("")
    assert resolve_job(str(tmp_path)) == ("991", str(tmp_path))


@pytest.mark.parametrize("ref", ["abc", "12x", "/no/such/folder", ""])
def test_resolve_job_rejects_unknown_references(ref: str) -> None:
    with pytest.raises(JobNotFoundError, match="job id"):
        resolve_job(ref)


def test_resolve_job_rejects_a_folder_without_a_job(tmp_path: Path) -> None:
    with pytest.raises(JobNotFoundError, match="cannot tell the job id"):
        resolve_job(str(tmp_path))


@pytest.mark.parametrize(
    ("job_id", "state", "exit_code", "requeues", "failed"),
    [("2815404", JobState.COMPLETED, 0, 0, False), ("2815405", JobState.FAILED, 15, 0, True),
     ("2815407", JobState.FAILED, 7, 0, True), ("2815408", JobState.CANCELLED, 0, 0, True),
     ("2815409", JobState.PENDING, 0, 1, False), ("2815410", JobState.RUNNING, 0, 0, False)],
)
def test_status_from_recorded_accounting(job_id: str, state: JobState, exit_code: int, requeues: int,
                                         failed: bool) -> None:
    acc = accounting_from_records(job_id, RECORDS)
    assert acc is not None
    status = status_from_accounting(acc, folder="/f")
    assert (status.state, status.exit_code, status.requeue_count, status.failed) == (
        state, exit_code, requeues, failed)
    assert status.folder == "/f" and status.source == "sacct"


def test_accounting_of_unknown_job_is_none() -> None:
    assert accounting_from_records("1", RECORDS) is None


def test_status_from_scontrol_recorded_requeued_pending() -> None:
    (record,) = parse_scontrol_show((DATA / "scontrol_requeued_pending.txt").read_text())
    status = status_from_scontrol("2815409", record)
    assert (status.state, status.terminal, status.requeue_count, status.reason, status.nodelist) == (
        JobState.PENDING, False, 1, "BeginTime", None)
    assert status.exit_code is None  # not meaningful before the end


def test_merge_takes_steps_from_sacct_and_state_requeues_reason_from_the_controller() -> None:
    acc = accounting_from_records("2815410", RECORDS)  # sacct: RUNNING
    assert acc is not None
    sacct = status_from_accounting(acc)
    live = status_from_scontrol("2815410", {"JobState": "RUNNING", "Restarts": "2", "Reason": "None"})
    merged = merge(sacct, live)
    assert (merged.state, merged.requeue_count, merged.steps, merged.source) == (
        JobState.RUNNING, 2, sacct.steps, "sacct+scontrol")
    assert not merged.accounting_lags


def test_merge_when_sacct_lags_behind_the_controller() -> None:
    acc = accounting_from_records("2815410", RECORDS)  # sacct still says RUNNING ...
    assert acc is not None
    live = status_from_scontrol("2815410", {"JobState": "TIMEOUT", "ExitCode": "0:15", "NodeList": "h3-n03"})
    merged = merge(status_from_accounting(acc), live)  # ... the controller says it ended
    assert (merged.state, merged.terminal, merged.signal, merged.accounting_lags) == (
        JobState.TIMEOUT, True, 15, True)


def _status(state: JobState, terminal: bool) -> JobStatus:
    return JobStatus(job_id="1", state=state, raw_state=state.value.upper(), terminal=terminal, exit_code=0,
                     signal=0, requeue_count=0, nodelist=None, reason=None, elapsed_s=None, source="test")


def test_poll_backs_off_and_stops_at_a_terminal_state() -> None:
    states = iter([_status(JobState.PENDING, False)] * 6 + [_status(JobState.COMPLETED, True)])
    slept: list[float] = []
    seen: list[JobState] = []
    final = poll_until_terminal(lambda: next(states), on_update=lambda s: seen.append(s.state),
                                sleep=slept.append, clock=lambda: 0.0, max_interval=4.0)
    assert final.state == JobState.COMPLETED
    assert slept == [1.0, 1.5, 2.25, 3.375, 4.0, 4.0]
    assert len(seen) == 7


def test_poll_gives_up_after_timeout() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    final = poll_until_terminal(lambda: _status(JobState.RUNNING, False), sleep=sleep, clock=lambda: now[0],
                                timeout=10)
    assert final.state == JobState.RUNNING and now[0] >= 10


@pytest.mark.parametrize(
    ("state", "terminal", "waited", "code"),
    [(JobState.COMPLETED, True, True, 0), (JobState.FAILED, True, True, EXIT_JOB_FAILED),
     (JobState.CANCELLED, True, True, EXIT_JOB_FAILED), (JobState.TIMEOUT, True, True, EXIT_JOB_FAILED),
     (JobState.FAILED, True, False, 0), (JobState.RUNNING, False, True, 0)],
)
def test_exit_code_for(state: JobState, terminal: bool, waited: bool, code: int) -> None:
    assert exit_code_for(_status(state, terminal), waited) == code


def test_render_text_shows_state_steps_exit_codes_and_nodes() -> None:
    acc = accounting_from_records("2815405", RECORDS)
    assert acc is not None
    text = render_text(status_from_accounting(acc, folder="/jobs/job_2815405"))
    lines = text.splitlines()
    assert lines[0].startswith("job 2815405 (wrap): FAILED  exit 15  requeued 0x  nodes h3-n[01-02]")
    assert lines[2].split() == ["batch", "FAILED", "15", "h3-n01"]
    assert lines[3].split() == ["0", "FAILED", "3", "h3-n[01-02]"]
    assert lines[-1] == "folder: /jobs/job_2815405"


def test_to_dict_is_json_ready() -> None:
    import json

    acc = accounting_from_records("2815406", RECORDS)
    assert acc is not None
    data = json.loads(json.dumps(status_from_accounting(acc).to_dict()))
    assert data["state"] == "failed" and data["exit_code"] == 9
    assert data["steps"][1] == {**data["steps"][1], "step": "0", "state": "cancelled", "signal": 9}


def test_requeued_then_completed_job_counts_one_requeue() -> None:
    records = parse_sacct((DATA / "sacct_requeued_and_timeout.txt").read_text())
    acc = accounting_from_records("2815409", records)
    assert acc is not None
    status = status_from_accounting(acc)
    assert (status.state, status.requeue_count, status.nodelist) == (JobState.COMPLETED, 1, "h3-n01")
    assert exit_code_for(status, waited=True) == 0


def test_status_without_slurm_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """No Slurm binary on PATH: one line naming the binary, exit 1, no traceback (nothing reaches Slurm)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "status", "123"], capture_output=True, text=True,
                          env={"PATH": str(tmp_path), "HOME": str(tmp_path)}, timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "not found on PATH" in done.stderr


def _st(state: JobState, terminal: bool, requeues: int = 0, source: str = "sacct") -> JobStatus:
    return JobStatus(job_id="1", state=state, raw_state=state.value.upper(), terminal=terminal, exit_code=0,
                     signal=0, requeue_count=requeues, nodelist=None, reason=None, elapsed_s=None, source=source)


P, R, C, F = JobState.PENDING, JobState.RUNNING, JobState.COMPLETED, JobState.FAILED


@pytest.mark.parametrize(
    ("sacct", "live", "asks_controller", "state", "source"),
    [
        (None, None, True, None, None),
        (None, _st(R, False, source="scontrol"), True, R, "scontrol"),
        (_st(C, True), None, False, C, "sacct"),
        (_st(F, True), _st(F, True, source="scontrol"), False, F, "sacct"),
        (_st(P, False), _st(R, False, source="scontrol"), True, R, "sacct+scontrol"),
        (_st(R, False), None, True, R, "sacct"),
        # preempted / node failure: the controller may already have the job pending again
        (_st(JobState.PREEMPTED, True), _st(P, False, 1, "scontrol"), True, P, "sacct+scontrol"),
        (_st(JobState.NODE_FAIL, True), _st(JobState.NODE_FAIL, True, 0, "scontrol"), True, JobState.NODE_FAIL,
         "sacct"),
    ],
)
def test_combine_sacct_and_controller(sacct, live, asks_controller: bool, state, source) -> None:
    from ddpslurm.scheduler.status import combine, needs_controller

    assert needs_controller(sacct) == asks_controller
    result = combine(sacct, live)
    assert (result.state if result else None, result.source if result else None) == (state, source)


def test_recorded_preemption_by_a_higher_tier_partition() -> None:
    """Job 2815444 (partition debug, --requeue) was preempted by 2815445 (partition urgent) and requeued."""
    records = parse_sacct((DATA / "sacct_preempted_requeued.txt").read_text())
    acc = accounting_from_records("2815444", records)
    assert acc is not None
    assert [a.state for a in acc.attempts] == [JobState.PREEMPTED, JobState.PENDING]
    assert [s.state for s in acc.attempts[0].steps] == [JobState.FAILED, JobState.CANCELLED]
    (record,) = parse_scontrol_show((DATA / "scontrol_preempted_pending.txt").read_text())
    live = status_from_scontrol("2815444", record)
    status = merge(status_from_accounting(acc), live)
    assert (status.state, status.terminal, status.requeue_count, status.reason) == (
        JobState.PENDING, False, 1, "BeginTime")
    # the window where sacct's newest record is still the PREEMPTED attempt
    first_only = accounting_from_records("2815444", records[:1])
    assert first_only is not None
    from ddpslurm.scheduler.status import combine

    combined = combine(status_from_accounting(first_only), live)
    assert combined is not None and (combined.state, combined.terminal) == (JobState.PENDING, False)


@pytest.mark.parametrize(
    ("query", "found", "tasks"),
    [("2815452_0", "2815452_0", []), ("2815452_1", "2815452_1", []), ("2815453", "2815452_0", []),
     ("2815452", None, ["2815452_0", "2815452_1"])],
)
def test_recorded_array_job_records(query: str, found: str | None, tasks: list[str]) -> None:
    """Array 2815452: task 1 has raw id 2815452, task 0 has 2815453. The array id alone is not one job."""
    from ddpslurm.scheduler.accounting import array_tasks

    records = parse_sacct((DATA / "sacct_array.txt").read_text())
    acc = accounting_from_records(query, records)
    assert (acc.current.job_id if acc else None) == found
    assert array_tasks(query, records) == tasks


def test_recorded_node_failure_requeue_names_the_previous_attempt() -> None:
    """Job 2815463 ran on h3-n[01-03]; `slurm/cluster crash-node h3-n03` made it NODE_FAIL, Slurm requeued
    it, and it was cancelled while pending (its nodes were down)."""
    from ddpslurm.scheduler.status import progress_line

    records = parse_sacct((DATA / "sacct_node_fail_requeued.txt").read_text())
    acc = accounting_from_records("2815463", records)
    assert acc is not None
    status = status_from_accounting(acc)
    assert (status.state, status.requeue_count, status.previous_state) == (JobState.CANCELLED, 1, "NODE_FAIL")
    assert progress_line(status) == (
        "job 2815463 (wrap): CANCELLED by 0  exit 0  requeued 1x (previous attempt NODE_FAIL)")
    assert [s.signal for s in acc.attempts[0].steps] == [15, 15]
    assert status.to_dict()["previous_state"] == "NODE_FAIL"


def test_progress_line_ignores_elapsed_time() -> None:
    from ddpslurm.scheduler.status import progress_line

    acc = accounting_from_records("2815410", RECORDS)
    assert acc is not None
    status = status_from_accounting(acc)
    assert "elapsed" in render_text(status).splitlines()[0]
    assert progress_line(status) == "job 2815410 (wrap): RUNNING  requeued 0x  nodes h3-n03"


def _fake_slurm(monkeypatch, sacct: str, scontrol: str | None) -> list[str]:
    """status.job_status against recorded output: sacct prints `sacct`; scontrol prints `scontrol`, or
    fails as with slurmctld down when None. Returns the commands run."""
    import subprocess

    from ddpslurm.errors import SlurmCommandError
    from ddpslurm.scheduler import accounting, status

    calls: list[str] = []

    def fake_run(argv, *, check: bool = True, **kw):
        calls.append(argv[0])
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 0, sacct, "")
        if scontrol is None:
            raise SlurmCommandError(argv, 1, "Unable to contact slurm controller")
        return subprocess.CompletedProcess(argv, 0, scontrol, "")

    monkeypatch.setattr(accounting, "run", fake_run)
    monkeypatch.setattr(status, "run", fake_run)
    return calls


def test_array_id_while_sacct_lags_is_refused_from_the_controller_records(monkeypatch) -> None:
    """Recorded: seconds after array 20477536's tasks ended, sacct listed task 1 (raw id 20477536) as a
    plain job `20477536` and task 0 not at all; the controller knew both tasks."""
    from ddpslurm.errors import UsageError
    from ddpslurm.scheduler.accounting import array_tasks
    from ddpslurm.scheduler.status import controller_array_tasks, job_status

    lagging = (DATA / "sacct_array_lagging.txt").read_text()
    records = parse_sacct(lagging)
    assert [r.job_id for r in records] == ["20477536"] and array_tasks("20477536", records) == []
    shown = parse_scontrol_show((DATA / "scontrol_array_completed.txt").read_text())
    assert controller_array_tasks("20477536", shown) == ["20477536_0", "20477536_1"]
    assert controller_array_tasks("20477537", shown[1:]) == []  # a task's own id is a job
    assert controller_array_tasks("7", [{"JobId": "7", "ArrayJobId": "7", "ArrayTaskId": "0-3"}]) == ["7_[0-3]"]
    assert controller_array_tasks("7", [{"JobId": "7", "JobState": "COMPLETED"}]) == []

    controller = (DATA / "scontrol_array_completed.txt").read_text()
    _fake_slurm(monkeypatch, lagging, controller)
    with pytest.raises(UsageError, match=r"job 20477536 is an array job with 2 tasks \(20477536_0, 20477536_1\)"):
        job_status("20477536")
    # a moment later sacct knows task 1 as `20477536_1` but still not task 0: the controller's list wins
    task_1_only = "\n".join(ln.replace("20477536|", "20477536_1|").replace("20477536.", "20477536_1.", 1)
                            for ln in lagging.splitlines())
    assert array_tasks("20477536", parse_sacct(task_1_only)) == ["20477536_1"]
    _fake_slurm(monkeypatch, task_1_only, controller)
    with pytest.raises(UsageError, match=r"2 tasks \(20477536_0, 20477536_1\)"):
        job_status("20477536")
    # the controller forgot the array (MinJobAge) or cannot be reached: sacct's list stands
    _fake_slurm(monkeypatch, task_1_only, None)
    with pytest.raises(UsageError, match=r"1 tasks \(20477536_1\)"):
        job_status("20477536")


def test_finished_plain_job_keeps_sacct_status_when_the_controller_cannot_answer(monkeypatch) -> None:
    from ddpslurm.scheduler.status import job_status

    text = (DATA / "sacct_array.txt").read_text().replace("2815452_1", "2815452")
    calls = _fake_slurm(monkeypatch, "\n".join(ln for ln in text.splitlines() if "2815452_0" not in ln), None)
    status = job_status("2815452")
    assert (status.job_id, status.state, status.source) == ("2815452", JobState.COMPLETED, "sacct")
    assert calls == ["sacct", "scontrol"]


def test_an_ended_job_sacct_has_not_heard_of_waits_for_its_steps(monkeypatch) -> None:
    """Seen in CI: `status --wait` returned the controller's FAILED without steps, because slurmdbd had not yet
    recorded the job at all. sacct answering without the job is accounting lagging; sacct failing is not."""
    from ddpslurm.errors import SlurmCommandError
    from ddpslurm.scheduler import accounting
    from ddpslurm.scheduler.status import job_status, wait_for_job

    failed = (DATA / "scontrol_failed.txt").read_text()
    _fake_slurm(monkeypatch, "", failed)
    lagging = job_status("2815405")
    assert (lagging.state, lagging.terminal, lagging.steps, lagging.accounting_lags) == ("failed", True, (), True)

    known = "\n".join(ln for ln in (DATA / "sacct_outcomes.txt").read_text().splitlines()
                      if ln.startswith("2815405"))
    answers = iter(["", "", known])
    real_run = accounting.run

    def later_run(argv, **kw):
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 0, next(answers), "")
        return real_run(argv, **kw)

    monkeypatch.setattr(accounting, "run", later_run)
    waited = wait_for_job("2815405", sleep=lambda seconds: None)
    assert {s.step_id: s.exit_code for s in waited.steps} == {"batch": 15, "0": 3}
    assert not waited.accounting_lags

    def no_accounting(argv, **kw):
        if argv[0] == "sacct":
            raise SlurmCommandError(argv, 1, "Slurm accounting storage is disabled")
        return real_run(argv, **kw)

    monkeypatch.setattr(accounting, "run", no_accounting)
    alone = job_status("2815405")
    assert (alone.state, alone.accounting_lags) == ("failed", False)  # nothing to wait for: accounting is off
