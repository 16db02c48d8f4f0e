"""Parsers of sacct / squeue / scontrol output, on outputs recorded from the local Slurm 22.05 cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.scheduler.parse import (
    SlurmOutputError,
    parse_elapsed,
    parse_exit_code,
    parse_sacct,
    parse_scontrol_show,
    parse_squeue,
)
from ddpslurm.scheduler.states import JobState

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm_out"


def read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("00:00:00", 0), ("00:00:03", 3), ("01:02:03", 3723), ("1-00:00:01", 86401), ("12:34", 754),
     ("0:03", 3), ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5), ("", None), ("INVALID", None),
     ("UNLIMITED", None)],
)
def test_parse_elapsed(text: str, seconds: int | None) -> None:
    assert parse_elapsed(text) == seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0:0", (0, 0)), ("3:0", (3, 0)), ("0:9", (0, 9)), ("0:15", (0, 15)), ("143:0", (143, 0)), ("7", (7, 0)),
     ("", (None, None)), ("x:1", (None, None)), ("1:x", (None, None))],
)
def test_parse_exit_code(text: str, expected: tuple) -> None:
    assert parse_exit_code(text) == expected


# Recorded: jobs 2815404..2815410 (completed, srun step exit 3, kill -9, batch exit 7, scancel, scontrol
# requeue, running) in tests/data/slurm_out/sacct_outcomes.txt.
OUTCOMES = {
    # job id: (state, raw state, exit, signal, step ids, nodes)
    "2815404": (JobState.COMPLETED, "COMPLETED", 0, 0, ("batch", "0"), ("h3-n01", "h3-n02")),
    "2815405": (JobState.FAILED, "FAILED", 15, 0, ("batch", "0"), ("h3-n01", "h3-n02")),
    "2815406": (JobState.FAILED, "FAILED", 9, 0, ("batch", "0"), ("h3-n01",)),
    "2815407": (JobState.FAILED, "FAILED", 7, 0, ("batch",), ("h3-n01",)),
    "2815408": (JobState.CANCELLED, "CANCELLED by 0", 0, 0, ("batch", "0"), ("h3-n02",)),
    "2815410": (JobState.RUNNING, "RUNNING", 0, 0, ("batch", "0"), ("h3-n03",)),
}


@pytest.mark.parametrize("job_id", sorted(OUTCOMES))
def test_parse_sacct_recorded_outcomes(job_id: str) -> None:
    jobs = [j for j in parse_sacct(read("sacct_outcomes.txt")) if j.job_id == job_id]
    assert len(jobs) == 1
    job = jobs[0]
    state, raw, code, sig, steps, nodes = OUTCOMES[job_id]
    assert (job.state, job.raw_state, job.exit_code, job.signal) == (state, raw, code, sig)
    assert tuple(s.step_id for s in job.steps) == steps
    assert job.nodes == nodes
    assert job.partition == "debug"
    assert job.name == "wrap"


def test_parse_sacct_step_details() -> None:
    jobs = {j.job_id: j for j in parse_sacct(read("sacct_outcomes.txt"))}
    failed_step = jobs["2815405"].steps[1]
    assert (failed_step.step_id, failed_step.state, failed_step.exit_code, failed_step.ntasks) == (
        "0", JobState.FAILED, 3, 2)
    assert failed_step.name == "bash"
    killed_step = jobs["2815406"].steps[1]
    assert (killed_step.state, killed_step.exit_code, killed_step.signal) == (JobState.CANCELLED, 0, 9)
    running = jobs["2815410"]
    assert running.end is None and running.start == "2026-11-22T17:50:40" and not running.terminal


def test_parse_sacct_keeps_requeued_attempts() -> None:
    attempts = [j for j in parse_sacct(read("sacct_outcomes.txt")) if j.job_id == "2815409"]
    assert [a.state for a in attempts] == [JobState.REQUEUED, JobState.PENDING]
    assert [len(a.steps) for a in attempts] == [2, 0]
    assert attempts[1].nodelist is None and attempts[1].start is None


def test_parse_sacct_job_name_with_pipe() -> None:
    line = "5|5|COMPLETED|0:0|00:00:01|1||n1|2026-01-01T00:00:00|2026-01-01T00:00:01|2026-01-01T00:00:00|debug|a|b"
    (job,) = parse_sacct(line)
    assert job.name == "a|b"


@pytest.mark.parametrize(
    ("text", "message"),
    [("5|COMPLETED|0:0", "expected 13"), ("5.0|5.0|COMPLETED|0:0|00:00:01|1|1|n1|x|x|x||step", "before any line")],
)
def test_parse_sacct_rejects_unexpected_lines(text: str, message: str) -> None:
    with pytest.raises(SlurmOutputError, match=message):
        parse_sacct(text)


def test_parse_sacct_empty_output_is_no_job() -> None:
    assert parse_sacct("") == []
    assert parse_sacct("\n\n") == []


def test_parse_squeue_recorded() -> None:
    records = {r.job_id: r for r in parse_squeue(read("squeue_all.txt"))}
    assert records["2815409"].state == JobState.PENDING
    assert records["2815409"].reason == "BeginTime"
    assert records["2815409"].nodes == ()
    assert records["2815405"].state == JobState.FAILED and records["2815405"].reason == "NonZeroExitCode"
    assert records["2815410"].state == JobState.RUNNING and records["2815410"].elapsed_s == 4
    assert records["2815402"].nodes == ("h3-n01", "h3-n02", "h3-n03")
    assert records["2815408"].terminal


def test_parse_squeue_rejects_other_formats() -> None:
    with pytest.raises(SlurmOutputError, match="squeue"):
        parse_squeue("JOBID PARTITION NAME")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("scontrol_requeued_pending.txt",
         {"JobId": "2815409", "JobState": "PENDING", "Reason": "BeginTime", "Restarts": "1", "Requeue": "1",
          "NodeList": "", "ExitCode": "0:0", "WorkDir": "/tmp/h3rec", "TRES": "cpu=1,mem=1000M,node=1,billing=1"}),
        ("scontrol_failed.txt",
         {"JobId": "2815405", "JobState": "FAILED", "Reason": "NonZeroExitCode", "Restarts": "0",
          "ExitCode": "143:0", "NodeList": "h3-n[01-02]"}),
    ],
)
def test_parse_scontrol_show_recorded(name: str, expected: dict[str, str]) -> None:
    (record,) = parse_scontrol_show(read(name))
    assert {key: record.get(key) for key in expected} == expected


def test_parse_scontrol_values_with_blanks_and_several_records() -> None:
    text = "JobId=1 JobName=a b\n   Reason=Resources Comment=two words\n\nJobId=2 JobName=c\n"
    assert parse_scontrol_show(text) == [
        {"JobId": "1", "JobName": "a b", "Reason": "Resources", "Comment": "two words"},
        {"JobId": "2", "JobName": "c"},
    ]


def test_parse_scontrol_rejects_error_text() -> None:
    with pytest.raises(SlurmOutputError, match="scontrol"):
        parse_scontrol_show("slurm_load_jobs error: Invalid job id specified")


def test_parse_sacct_recorded_requeue_then_completion_and_timeout() -> None:
    """Job 2815409 was requeued by `scontrol requeue` and then completed; 2815410 hit --time=1."""
    jobs = parse_sacct(read("sacct_requeued_and_timeout.txt"))
    attempts = [j for j in jobs if j.job_id == "2815409"]
    assert [(a.state, a.nodelist) for a in attempts] == [(JobState.REQUEUED, "h3-n02"), (JobState.COMPLETED, "h3-n01")]
    assert [s.state for s in attempts[0].steps] == [JobState.CANCELLED, JobState.CANCELLED]
    assert [s.signal for s in attempts[0].steps] == [15, 15]
    (timeout,) = [j for j in jobs if j.job_id == "2815410"]
    assert (timeout.state, timeout.terminal, timeout.elapsed_s) == (JobState.TIMEOUT, True, 84)
