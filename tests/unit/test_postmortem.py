"""ddpslurm.postmortem: the one-line diagnosis for Slurm's Comment, when to analyze, the epilog's bounded reading,
the argv builders, the sacct triage rows, and a real analysis into diagnosis.json/.md (no Slurm needed)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from ddpslurm.errors import UsageError
from ddpslurm.postmortem import comment as c
from ddpslurm.postmortem.analysis import run_analysis
from ddpslurm.postmortem.epilog import run_epilog, single_node
from ddpslurm.postmortem.job_output import (
    JobFacts,
    copy_as_user,
    copy_bounded,
    expand_pattern,
    facts_from_env,
    output_paths,
)
from ddpslurm.postmortem.jobend import at_job_end, budget_s, should_analyze
from ddpslurm.postmortem.lookup import job_folders
from ddpslurm.postmortem.sacct_triage import parse_rows, triage_rows
from ddpslurm.scheduler import commands
from ddpslurm.scheduler.status import diagnosis_lines

REPO = Path(__file__).resolve().parents[2]
ECC_CASE = REPO / "analyzer" / "cases" / "gpu-hardware-uncorrectable-ecc-rank10-torch21-submitit"
DIAG = {"cause": "cuda_oom", "first_failing_rank": 3, "first_failing_host": "gpu07", "confidence": "high"}


# ---------------------------------------------------------------- the one-line diagnosis
def test_line_round_trips_through_parse() -> None:
    line = c.diagnosis_line(DIAG, "/scratch/my jobs/job_12")
    assert line == "ddpslurm: cause=cuda_oom rank=3 node=gpu07 confidence=high where=/scratch/my jobs/job_12"
    assert c.parse_line(f"my note; {line}") == {"cause": "cuda_oom", "rank": 3, "node": "gpu07",
                                                "confidence": "high", "where": "/scratch/my jobs/job_12"}


@pytest.mark.parametrize("value", ["a|b", 'x"y', "x'y", "x\ny", "x\x1b[2Jy", "x\\y", "x`y"])
def test_line_holds_nothing_sacct_or_slurmdbd_would_mangle(value: str) -> None:
    line = c.diagnosis_line({**DIAG, "first_failing_host": value, "cause": value}, f"/w/{value}")
    assert not set(line) & set("|\"'`\\\n\x1b")


def test_no_rank_and_no_host_are_dashes_and_read_back_as_none() -> None:
    line = c.diagnosis_line({"cause": "collective_mismatch", "first_failing_rank": None, "confidence": "low"})
    assert "rank=- node=-" in line
    assert c.parse_line(line)["rank"] is None and c.parse_line(line)["node"] is None


@pytest.mark.parametrize(("existing", "expected"), [
    (None, "LINE"),
    ("", "LINE"),
    ("my run 7", "my run 7; LINE"),
    ("my run 7; ddpslurm: cause=old rank=1 node=n1 confidence=low", "my run 7; LINE"),  # an earlier attempt's
    ("ddpslurm: cause=old rank=1 node=n1 confidence=low", "LINE"),
])
def test_merge_keeps_the_users_comment_and_replaces_its_own(existing: str | None, expected: str) -> None:
    line = c.diagnosis_line(DIAG, "/w/job_1")
    assert c.merge_comment(existing, line) == expected.replace("LINE", line)


def test_merge_fits_slurms_limit_cutting_only_its_own_path() -> None:
    line = c.diagnosis_line(DIAG, "/very/" + "deep/" * 300 + "job_1")
    user = "u" * 700
    merged = c.merge_comment(user, line)
    assert merged is not None and len(merged) <= c.COMMENT_LIMIT
    assert merged.startswith(user + "; ddpslurm: cause=cuda_oom rank=3") and merged.endswith("job_1")
    assert c.merge_comment("u" * 1010, line) is None  # no room: the user's words are never cut


def test_a_comment_without_the_mark_is_no_diagnosis() -> None:
    assert c.parse_line("cause=cuda_oom rank=1") is None and c.parse_line(None) is None


# ---------------------------------------------------------------- at the job's end
@pytest.mark.parametrize(("code", "requeue", "wanted"), [
    (0, None, False),
    (1, None, True),
    (143, {"requeued": True}, False),
    (0, {"requeued": True}, False),
    (0, {"requeued": False, "why_not": "attempt 3 reached --max-requeues 3"}, True),
    (1, {"requeued": False, "why_not": "Slurm has the job CANCELLED"}, True),
])
def test_should_analyze(code: int, requeue: dict | None, wanted: bool) -> None:
    assert should_analyze(code, requeue)[0] is wanted


def test_budget_ends_before_the_time_limit() -> None:
    from datetime import datetime

    now = datetime(2026, 1, 1, 12, 0, 0).timestamp()
    assert budget_s({}, None, now) == 120
    assert budget_s({"DDPSLURM_ANALYZE_BUDGET": "30"}, None, now) == 30
    assert budget_s({}, "2026-01-01T12:01:00", now) == 50  # 60 s left, 10 s kept free
    assert budget_s({}, "2026-01-01T11:59:00", now) == 0
    assert budget_s({"DDPSLURM_ANALYZE_BUDGET": "soon"}, "Unknown", now) == 120


def test_at_job_end_writes_diagnosis_json_and_md(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no Slurm client: recording fails, the files are still written
    job = tmp_path / "job_403312"
    shutil.copytree(ECC_CASE, job, ignore=shutil.ignore_patterns("label.json"))
    at_job_end(str(tmp_path), {"SLURM_JOB_ID": "403312", "SLURM_RESTART_COUNT": "0"}, 1)
    found = json.loads((job / "diagnosis.json").read_text())
    label = json.loads((ECC_CASE / "label.json").read_text())
    assert (found["cause"], found["first_failing_rank"]) == (label["cause"], label["first_failing_rank"])
    assert "uncorrectable ECC" in (job / "diagnosis.md").read_text()
    err = capsys.readouterr().err
    assert f"cause=gpu_hardware rank=10 node=gpu-d03 confidence={found['confidence']} where={job}" in err
    assert "not recorded" in err
    # the analyzer never reads its own output back: the same answer again, diagnosis files skipped by name
    from ddpslurm.analyze.api import analyze_paths

    again = analyze_paths([job], workers=1)
    assert (again.cause, again.first_failing_rank) == (found["cause"], found["first_failing_rank"])
    assert {"diagnosis.json", "diagnosis.md"} <= {Path(s["path"]).name for s in again.skipped}


def test_at_job_end_skips_a_job_being_requeued_and_a_success(tmp_path: Path) -> None:
    job = tmp_path / "job_5"
    shutil.copytree(ECC_CASE, job)
    at_job_end(str(tmp_path), {"SLURM_JOB_ID": "5"}, 0)
    (job / "attempt_0").mkdir()
    (job / "attempt_0" / "requeue.json").write_text(json.dumps({"requeued": True}))
    at_job_end(str(tmp_path), {"SLURM_JOB_ID": "5"}, 143)
    assert not (job / "diagnosis.json").exists()


def test_the_analysis_is_stopped_at_its_budget(tmp_path: Path) -> None:
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    outcome = run_analysis([tmp_path], tmp_path, budget_s=1, python=str(slow))
    assert outcome.diagnosis is None and "budget of 1s" in outcome.why_not
    assert "no time left" in run_analysis([tmp_path], tmp_path, budget_s=0.5).why_not


def test_an_unreadable_folder_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    outcome = run_analysis([tmp_path / "missing"], tmp_path, budget_s=60)
    assert outcome.diagnosis is None and "missing" in outcome.why_not


# ---------------------------------------------------------------- the epilog's inputs
#: EpilogSlurmctld's variables as slurmctld 22.05 gave them for `sbatch -o /tmp/w/out-%j.txt --wrap 'exit 3'`.
EPILOG_ENV = {"SLURM_JOB_ID": "2870544", "SLURM_JOB_EXIT_CODE": "768", "SLURM_JOB_EXIT_CODE2": "3:0",
              "SLURM_JOB_DERIVED_EC": "0", "SLURM_JOB_STDOUT": "/tmp/w/out-%j.txt", "SLURM_JOB_STDERR":
              "/tmp/w/err-%j.txt", "SLURM_JOB_WORK_DIR": "/tmp/w", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
              "SLURM_JOB_USER": "root", "SLURM_JOB_NAME": "wrap", "SLURM_JOB_NODELIST": "h44-n01",
              "SLURM_JOB_COMMENT": "user note"}


def test_facts_from_epilog_env() -> None:
    facts = facts_from_env(EPILOG_ENV)
    assert facts is not None and facts.failed and facts.comment == "user note"
    assert [str(p) for p in output_paths(facts)] == ["/tmp/w/out-2870544.txt", "/tmp/w/err-2870544.txt"]
    ok = facts_from_env({**EPILOG_ENV, "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:0"})
    assert ok is not None and not ok.failed
    assert facts_from_env({**EPILOG_ENV, "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:9"}).failed
    assert facts_from_env({}) is None


def _facts(**kw: object) -> JobFacts:
    base = dict(job_id="77", failed=True, exit_text="1:0", stdout="", stderr="", work_dir="/home/u", uid=1000,
                gid=1000, user="alice", name="train", nodelist="gpu[07-08]", comment="")
    return JobFacts(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(("pattern", "expected"), [
    ("slurm-%j.out", "slurm-77.out"),
    ("%x-%u-%N-%n-%t-%s.log", "train-alice-gpu07-0-0-batch.log"),
    ("%6j.out", "000077.out"),
    ("100%%-%j", "100%-77"),
    ("lit\\%j", "lit%j"),
])
def test_expand_pattern(pattern: str, expected: str) -> None:
    assert expand_pattern(pattern, _facts()) == expected


def test_expand_pattern_array_task() -> None:
    facts = _facts(job_id="80", array_job_id="77", array_task_id="3")
    assert expand_pattern("slurm-%A_%a.out", facts) == "slurm-77_3.out"


def test_output_paths_relative_same_and_dev_null() -> None:
    assert output_paths(_facts(stdout="o-%j", stderr="o-%j")) == [Path("/home/u/o-77")]
    assert output_paths(_facts(stdout="/dev/null", stderr="")) == []


def test_copy_bounded_head_and_tail_of_a_large_sparse_file(tmp_path: Path) -> None:
    big = tmp_path / "big.out"
    with open(big, "wb") as out:
        out.write(b"NCCL INFO first line\n")
        last = b"\nRuntimeError: CUDA error: uncorrectable ECC error encountered\n"
        out.seek((1 << 30) - len(last))  # 1 GiB, sparse
        out.write(last)
    done = copy_bounded(big, tmp_path / "copy", max_bytes=1 << 16)
    text = (tmp_path / "copy").read_bytes()
    assert done == {"size": big.stat().st_size, "read": 1 << 16, "whole": False}
    assert text.startswith(b"NCCL INFO first line\n") and text.rstrip().endswith(b"ECC error encountered")
    assert b"bytes of the middle not read" in text and len(text) <= (1 << 16) + 100


def test_copy_bounded_refuses_symlinks_fifos_and_missing_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not the job's\n")
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "fifo", "missing"):
        with pytest.raises(OSError):
            copy_bounded(tmp_path / name, tmp_path / f"{name}.copy", 1 << 20)


@pytest.mark.skipif(os.geteuid() != 0, reason="reading as the job's user needs root")
def test_copy_as_user_reads_with_the_job_owners_permissions(tmp_path: Path) -> None:
    shared = Path("/tmp") / f"ddpslurm-pm-{os.getpid()}"
    shared.mkdir(mode=0o755)
    try:
        (shared / "open.out").write_text("ok\n")
        (shared / "open.out").chmod(0o644)
        (shared / "closed.out").write_text("root only\n")
        (shared / "closed.out").chmod(0o600)
        into = shared / "copies"
        into.mkdir(mode=0o700)
        (shared / "link.out").symlink_to(shared / "open.out")
        found = copy_as_user([shared / "open.out", shared / "closed.out", shared / "link.out"], into, 1 << 20,
                             65534, 65534, 10)
        assert found[0]["whole"] and (into / "0_open.out").read_text() == "ok\n"
        assert "Permission denied" in found[1]["error"] and "symlink" in found[2]["error"]
        assert into.stat().st_uid == 0 and sorted(p.name for p in into.iterdir()) == ["0_open.out"]
    finally:
        shutil.rmtree(shared)


def test_single_node_fills_the_host_only_for_a_one_node_job() -> None:
    diag = {"cause": "cuda_oom", "first_failing_host": None}
    assert single_node(diag, "gpu07")["first_failing_host"] == "gpu07"
    assert single_node(diag, "gpu[07-08]")["first_failing_host"] is None
    assert single_node({**diag, "first_failing_host": "gpu01"}, "gpu07")["first_failing_host"] == "gpu01"


def test_epilog_foreground_diagnoses_a_plain_job_and_logs_one_line(tmp_path: Path) -> None:
    out = tmp_path / "slurm-403312.out"
    out.write_text((ECC_CASE / "403312_10_log.err").read_text())
    env = {**EPILOG_ENV, "SLURM_JOB_ID": "403312", "SLURM_JOB_STDOUT": str(tmp_path / "slurm-%j.out"),
           "SLURM_JOB_STDERR": str(tmp_path / "slurm-%j.out"), "SLURM_JOB_UID": str(os.geteuid()),
           "SLURM_JOB_GID": str(os.getegid()), "SLURM_JOB_NODELIST": "gpu-d03", "SLURM_JOB_COMMENT": ""}
    log = tmp_path / "epilog.log"
    assert run_epilog(None, environ=env, log=str(log), foreground=True, record=False, store=str(tmp_path / "s")) == 0
    entry = json.loads(log.read_text())
    assert entry["outcome"] == "diagnosed" and "cause=gpu_hardware" in entry["line"] and "node=gpu-d03" in entry["line"]
    stored = json.loads((tmp_path / "s" / "403312.json").read_text())
    assert all(e["file"] == str(out) for e in stored["evidence"])  # the job's own path, not the hook's copy


def test_epilog_is_silent_for_a_success_and_logs_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "epilog.log"
    ok = {**EPILOG_ENV, "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:0"}
    assert run_epilog(None, environ=ok, log=str(log), foreground=True, record=False) == 0
    assert not log.exists()
    missing = {**EPILOG_ENV, "SLURM_JOB_STDOUT": str(tmp_path / "gone.out"), "SLURM_JOB_STDERR": "/dev/null",
               "SLURM_JOB_UID": str(os.geteuid())}
    assert run_epilog(None, environ=missing, log=str(log), foreground=True, record=False) == 0
    entry = json.loads(log.read_text())
    assert entry["outcome"] == "unreadable" and "No such file" in entry["files"][0]["error"]
    already = {**EPILOG_ENV, "SLURM_JOB_COMMENT": "x; ddpslurm: cause=cuda_oom rank=1 node=a confidence=high"}
    assert run_epilog(None, environ=already, log=str(log), foreground=True, record=False) == 0
    assert json.loads(log.read_text().splitlines()[-1])["why"] == "already diagnosed (Comment)"


# ---------------------------------------------------------------- argv builders and sacct rows
def test_comment_argv_is_one_word_per_value() -> None:
    assert commands.scontrol_update_comment_argv("12", "a b; ddpslurm: x") == [
        "scontrol", "update", "JobId=12", "Comment=a b; ddpslurm: x"]
    assert commands.scontrol_update_comment_argv("12", "x", admin=True)[-1] == "AdminComment=x"
    assert commands.sacctmgr_modify_job_argv("12", comment="c", admin_comment="a") == [
        "sacctmgr", "--immediate", "modify", "job", "where", "JobID=12", "set", "Comment=c", "AdminComment=a"]
    with pytest.raises(UsageError):
        commands.scontrol_update_comment_argv("12", "two\nlines")
    with pytest.raises(UsageError):
        commands.sacctmgr_modify_job_argv("12")
    with pytest.raises(UsageError):
        commands.scontrol_update_comment_argv("12; rm", "x")


def test_sacct_comments_argv_checks_its_values() -> None:
    argv = commands.sacct_comments_argv("now-7days", user="alice")
    assert "--user=alice" in argv and "--starttime=now-7days" in argv and "-X" in argv
    assert "--allusers" in commands.sacct_comments_argv("2026-01-31T08:00")
    for bad in ({"since": "x;y"}, {"since": "now", "user": "a b"}):
        with pytest.raises(UsageError):
            commands.sacct_comments_argv(**bad)  # type: ignore[arg-type]


def test_triage_rows_from_sacct_prefer_the_admin_comment() -> None:
    sep = commands.SACCT_COMMENT_DELIMITER
    line = "ddpslurm: cause=gpu_hardware rank=10 node=n03 confidence=high where=/o/slurm-1.out"
    forged = "ddpslurm: cause=gpu_hardware rank=0 node=n01 confidence=high"
    text = "\n".join([
        sep.join(["1", "FAILED", "1:0", "n[01-03]", "alice", "debug", "2026-01-01T00:00:00", line, forged]),
        sep.join(["2", "FAILED", "1:0", "n01", "bob", "debug", "2026-01-01T00:00:00", "", "a|b; " + forged]),
        sep.join(["3", "TIMEOUT", "0:0", "n02", "bob", "debug", "2026-01-01T00:00:00", "", "just a note"]),
        "garbage",
    ])
    rows, undiagnosed = triage_rows(parse_rows(text))
    assert [(r["job_id"], r["first_failing_host"], r["recorded_in"]) for r in rows] == [
        ("1", "n03", "AdminComment"), ("2", "n01", "Comment")]
    assert rows[0]["nodes"] == ["n01", "n02", "n03"] and rows[0]["path"] == "/o/slurm-1.out"
    assert dict(undiagnosed) == {"TIMEOUT": 1}


def test_status_lines_and_where_the_job_folder_may_be() -> None:
    lines = diagnosis_lines({"cause": "cuda_oom", "rank": 3, "node": "gpu07", "confidence": "high",
                             "source": "diagnosis.json", "summary": "Rank 3 ran out.", "report": "/j/diagnosis.md"})
    assert lines[0] == "diagnosis: cuda_oom  culprit rank 3 on gpu07  confidence high  (from diagnosis.json)"
    assert diagnosis_lines({"cause": "x", "rank": None, "confidence": "low", "source": "Comment"})[0].startswith(
        "diagnosis: x  culprit no single rank")
    assert job_folders("12", None, "/r/jobs/job_12/12_0_log.out") == [Path("/r/jobs/job_12"),
                                                                       Path("ddpslurm_jobs/job_12")]
    assert job_folders("12", "/f/job_12", "/home/slurm-12.out") == [Path("/f/job_12"), Path("ddpslurm_jobs/job_12")]


def test_child_usage_error_exits_2() -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "ddpslurm.postmortem.child"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2


def test_no_analyze_reaches_the_batch_step(tmp_path: Path) -> None:
    from ddpslurm.launch.plan import batch_setup
    from ddpslurm.launch.spec import make_spec

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    on = next(line for line in batch_setup(make_spec(script, nodes=2), "/py") if line.startswith("srun() {"))
    off = next(line for line in batch_setup(make_spec(script, nodes=2, analyze=False), "/py")
               if line.startswith("srun() {"))
    assert "--no-analyze" not in on and "--no-analyze --" in off


def test_batch_main_runs_the_post_mortem_unless_told_not_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpslurm.launch import batch

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(batch, "supervise", lambda *a, **k: 7)
    monkeypatch.setattr(batch, "at_job_end", lambda folder, environ, code: calls.append((folder, code)))
    common = ["--folder", str(tmp_path), "--world-size", "2", "--grace", "5", "--max-requeues", "1"]
    assert batch.main([*common, "--", "srun", "true"]) == 7
    assert batch.main([*common, "--no-analyze", "--", "srun", "true"]) == 7
    assert calls == [(str(tmp_path), 7)]
