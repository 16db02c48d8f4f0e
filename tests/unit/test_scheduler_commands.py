"""argv builders: the exact command lines ddpslurm runs (pinned, torchx style)."""

from __future__ import annotations

import pytest

from ddpslurm.errors import UsageError
from ddpslurm.scheduler.commands import (
    SACCT_FIELDS,
    check_job_id,
    sacct_argv,
    scancel_argv,
    scontrol_requeue_argv,
    scontrol_show_job_argv,
    sinfo_argv,
    squeue_argv,
)

FORMAT = "--format=JobID,JobIDRaw,State,ExitCode,Elapsed,NNodes,NTasks,NodeList,Start,End,Submit,Partition,JobName"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: sacct_argv("123"), ["sacct", "--parsable2", "--noheader", FORMAT, "--jobs=123", "--duplicates"]),
        (lambda: sacct_argv(123), ["sacct", "--parsable2", "--noheader", FORMAT, "--jobs=123", "--duplicates"]),
        (lambda: sacct_argv(["1", "2_3"], duplicates=False),
         ["sacct", "--parsable2", "--noheader", FORMAT, "--jobs=1,2_3"]),
        (lambda: sacct_argv("9", fields=("JobID", "State")),
         ["sacct", "--parsable2", "--noheader", "--format=JobID,State", "--jobs=9", "--duplicates"]),
        (lambda: squeue_argv(), ["squeue", "--noheader", "--format=%i|%T|%r|%M|%D|%N|%j", "--states=all"]),
        (lambda: squeue_argv("77", user="alice"),
         ["squeue", "--noheader", "--format=%i|%T|%r|%M|%D|%N|%j", "--states=all", "--jobs=77", "--user=alice"]),
        (lambda: scontrol_show_job_argv(5), ["scontrol", "show", "job", "5"]),
        (lambda: scontrol_requeue_argv("5"), ["scontrol", "requeue", "5"]),
        (lambda: scontrol_requeue_argv("5", hold=True), ["scontrol", "requeuehold", "5"]),
        (lambda: scancel_argv("5"), ["scancel", "5"]),
        (lambda: scancel_argv("5", signal="usr2"), ["scancel", "--signal=USR2", "5"]),
        (lambda: scancel_argv("5", signal="SIGUSR2", batch=True), ["scancel", "--signal=SIGUSR2", "--full", "5"]),
        (lambda: scancel_argv("5", signal=15), ["scancel", "--signal=15", "5"]),
        (lambda: sinfo_argv(), ["sinfo", "--noheader", "--format=%P|%a|%D|%T|%N"]),
        (lambda: sinfo_argv("debug"), ["sinfo", "--noheader", "--format=%P|%a|%D|%T|%N", "--partition=debug"]),
    ],
)
def test_argv(call, expected: list[str]) -> None:
    assert call() == expected


def test_sacct_fields_end_with_the_job_name() -> None:
    """The job name may contain `|`; it must be last so the parser can split with a maximum count."""
    assert SACCT_FIELDS[-1] == "JobName"


@pytest.mark.parametrize("job_id", ["1", "123", "123_4", "123+1", "123.0", "123.batch", "123.extern", "12_[1-3]"])
def test_check_job_id_accepts_slurm_ids(job_id: str) -> None:
    assert check_job_id(job_id) == job_id


@pytest.mark.parametrize("job_id", ["", "abc", "12;rm -rf /", "-1", "12 13", "1.2.3", "$(id)"])
def test_check_job_id_rejects_everything_else(job_id: str) -> None:
    with pytest.raises(UsageError, match="is not a Slurm job id"):
        check_job_id(job_id)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sacct_argv([]), "no job id"),
        (lambda: scancel_argv("5", signal="USR2; reboot"), "not a signal"),
        (lambda: squeue_argv(["1", "x"]), "is not a Slurm job id"),
    ],
)
def test_bad_input_is_a_usage_error(call, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        call()
