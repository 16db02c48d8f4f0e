"""`ddpslurm mailprog`: the diagnosis in a failed job's mail, and the mail never lost.

The pure parts (argv, which mails, where the diagnosis comes from, the message) are tested directly; the hook
itself runs as a process with a real program as the mail program (a script that writes what it got), as
slurmctld would run it. The local cluster's MailProg is tested in tests/integration/test_postmortem_mail.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpslurm.postmortem.mail import (
    SLURM_MAIL_TIMEOUT_S,
    Mail,
    find_diagnosis,
    parse_mail_argv,
    wants_diagnosis,
    with_diagnosis,
)

LINE = "ddpslurm: cause=cuda_oom rank=3 node=gpu07 confidence=high where=/scratch/u/ddpslurm_jobs/job_123"
FAILED = {"SLURM_JOB_ID": "123", "SLURM_JOB_STATE": "FAILED", "SLURM_JOB_MAIL_TYPE": "Failed"}


class Clock:
    """A clock that only moves when slept on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_slurmctlds_argv_is_a_subject_and_recipients() -> None:
    assert parse_mail_argv(["-s", "Slurm Job_id=1 Name=x Failed, Run time 00:00:05, FAILED, ExitCode 1", "ana"]) \
        == Mail("Slurm Job_id=1 Name=x Failed, Run time 00:00:05, FAILED, ExitCode 1", ("ana",))
    assert parse_mail_argv(["ana"]) is None
    assert parse_mail_argv(["-s", "subject"]) is None
    assert parse_mail_argv(["-x", "subject", "ana"]) is None


@pytest.mark.parametrize(("env", "wanted"), [
    (FAILED, True),
    ({**FAILED, "SLURM_JOB_STATE": "TIMEOUT", "SLURM_JOB_MAIL_TYPE": "Ended"}, True),
    ({**FAILED, "SLURM_JOB_STATE": "NODE_FAIL"}, True),
    ({**FAILED, "SLURM_JOB_STATE": "COMPLETED", "SLURM_JOB_MAIL_TYPE": "Ended"}, False),
    ({**FAILED, "SLURM_JOB_STATE": "RUNNING", "SLURM_JOB_MAIL_TYPE": "Began"}, False),
    ({**FAILED, "SLURM_JOB_MAIL_TYPE": "Reached 90% of time limit", "SLURM_JOB_STATE": "RUNNING"}, False),
    ({"SLURM_JOB_STATE": "FAILED", "SLURM_JOB_MAIL_TYPE": "Failed"}, False),
])
def test_only_a_job_that_ended_without_completing_has_a_diagnosis(env: dict[str, str], wanted: bool) -> None:
    assert wants_diagnosis(env) is wanted


def test_the_jobs_own_comment_is_read_first_and_nothing_is_waited_for() -> None:
    clock = Clock()
    found, where = find_diagnosis("123", {**FAILED, "SLURM_JOB_COMMENT": f"my run; {LINE}"},
                                  lambda _: pytest.fail("accounting asked"), 60, clock.sleep, clock)
    assert found is not None and (found["cause"], found["rank"], found["node"]) == ("cuda_oom", 3, "gpu07")
    assert where == "the job's Comment" and clock.slept == []


def test_the_epilogs_line_is_waited_for_in_accounting_admin_comment_first() -> None:
    clock = Clock()
    answers = iter([None, ("FAILED", "", "user words"), ("FAILED", LINE.replace("rank=3", "rank=5"), LINE)])
    found, where = find_diagnosis("123", FAILED, lambda _: next(answers), 60, clock.sleep, clock)
    assert found is not None and found["rank"] == 5 and where == "accounting (AdminComment)"
    assert 0 < clock.now < 60


def test_a_diagnosis_that_never_comes_ends_the_wait_at_its_deadline() -> None:
    clock = Clock()
    found, why = find_diagnosis("123", FAILED, lambda _: ("FAILED", "", "a user's own words"), 20,
                                clock.sleep, clock)
    assert found is None and "20 s" in why
    assert 20 <= clock.now < 24


def test_the_message_names_the_cause_and_culprit_and_keeps_slurms_subject() -> None:
    found, _ = find_diagnosis("123", {**FAILED, "SLURM_JOB_COMMENT": LINE}, lambda _: None, 0)
    mail = with_diagnosis(Mail("Slurm Job_id=123 Name=train Failed", ("ana",)), "123", found, "")
    assert mail.subject == "Slurm Job_id=123 Name=train Failed [ddpslurm: cuda_oom]"
    assert "cuda_oom, rank 3 on gpu07 (confidence high)" in mail.body
    assert "ddpslurm analyze /scratch/u/ddpslurm_jobs/job_123" in mail.body and mail.recipients == ("ana",)


def test_no_single_rank_is_said_as_such() -> None:
    found, _ = find_diagnosis("9", {**FAILED, "SLURM_JOB_COMMENT": "ddpslurm: cause=collective_timeout rank=- "
                                    "node=- confidence=medium"}, lambda _: None, 0)
    assert "collective_timeout, no single rank (confidence medium)" in with_diagnosis(Mail("s", ("a",)), "9",
                                                                                     found, "").body


def test_without_a_diagnosis_the_mail_says_where_to_look_later() -> None:
    mail = with_diagnosis(Mail("Slurm Job_id=7 Failed", ("ana",), "slurm's body\n"), "7", None,
                          "no diagnosis was recorded within 60 s of the job's end")
    assert mail.subject == "Slurm Job_id=7 Failed"
    assert mail.body.startswith("slurm's body\n") and "ddpslurm status 7" in mail.body


def test_hostile_comment_text_reaches_the_mail_cleaned() -> None:
    hostile = "ddpslurm: cause=cuda_oom\x1b[31m rank=1 node=n1 confidence=high where=/x\x07/y"
    found, _ = find_diagnosis("1", {**FAILED, "SLURM_JOB_COMMENT": hostile}, lambda _: None, 0)
    body = with_diagnosis(Mail("s", ("a",)), "1", found, "").body
    assert "\x1b" not in body and "\x07" not in body


def _spool_program(tmp_path: Path, code: int = 0) -> tuple[Path, Path]:
    spool = tmp_path / "spool.txt"
    program = tmp_path / "mail"
    program.write_text(f'#!/bin/sh\n{{ printf "ARGS:"; printf " [%s]" "$@"; echo; cat; }} >> {spool}\n'
                       f"exit {code}\n")
    program.chmod(0o755)
    return program, spool


def _hook(program: Path, env: dict[str, str], *args: str, body: str = "") -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", "mailprog", "--deliver", str(program),
                           "--wait", "0", "--", *args], input=body, capture_output=True, text=True,
                          env={**base, **env}, timeout=SLURM_MAIL_TIMEOUT_S)


def test_the_hook_hands_a_failed_jobs_mail_on_with_its_diagnosis(tmp_path: Path) -> None:
    program, spool = _spool_program(tmp_path)
    done = _hook(program, {**FAILED, "SLURM_JOB_COMMENT": LINE}, "-s", "Slurm Job_id=123 Failed", "ana")
    assert done.returncode == 0, done.stderr
    text = spool.read_text()
    assert "ARGS: [-s] [Slurm Job_id=123 Failed [ddpslurm: cuda_oom]] [ana]" in text
    assert "rank 3 on gpu07" in text


def test_other_mails_pass_untouched_and_the_mail_programs_status_is_the_hooks(tmp_path: Path) -> None:
    program, spool = _spool_program(tmp_path, code=3)
    done = _hook(program, {"SLURM_JOB_ID": "5", "SLURM_JOB_STATE": "RUNNING", "SLURM_JOB_MAIL_TYPE": "Began"},
                 "-s", "Slurm Job_id=5 Began", "ana", body="hello\n")
    assert done.returncode == 3
    assert spool.read_text() == "ARGS: [-s] [Slurm Job_id=5 Began] [ana]\nhello\n"


def test_a_call_that_is_not_slurmctlds_goes_to_the_mail_program_as_it_came(tmp_path: Path) -> None:
    program, spool = _spool_program(tmp_path)
    assert _hook(program, {}, "ana@example.org", body="x\n").returncode == 0
    assert spool.read_text() == "ARGS: [ana@example.org]\nx\n"


def test_a_missing_mail_program_is_a_non_zero_exit_and_no_traceback(tmp_path: Path) -> None:
    done = _hook(tmp_path / "no-such-mail", FAILED, "-s", "s", "ana")
    assert done.returncode == 1 and "Traceback" not in done.stderr
