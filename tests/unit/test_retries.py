"""`submit --retries`: which verdicts resubmit, how the exclude list grows, the chain file, and the chain's loop
driven through plain functions in place of sbatch, sacct and analyze (the real chain: tests/integration/test_doctor)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.errors import SubmitError
from ddpslurm.jobfolder import CHAIN_FILE
from ddpslurm.launch.retries import (
    ChainSteps,
    chain_lines,
    job_folder_from_submit_line,
    merged_exclude,
    read_chain,
    run_chain,
    why_not_resubmit,
)
from ddpslurm.sanitize import terminal
from tests.unit.test_hardening_cli import one_clean_error_line, run_cli

CAUSES = load_signatures(use_env=False).causes


@pytest.mark.parametrize("cause", sorted(c for c, info in CAUSES.items() if info.retry != "requeue"))
def test_a_cause_whose_retry_is_not_requeue_is_never_resubmitted(cause: str) -> None:
    assert why_not_resubmit(cause, CAUSES[cause].retry) is not None


@pytest.mark.parametrize("cause", ["node_failure", "gpu_hardware", "infiniband_error", "port_in_use"])
def test_infrastructure_causes_are_resubmitted(cause: str) -> None:
    assert CAUSES[cause].retry == "requeue" and why_not_resubmit(cause, "requeue") is None


def test_a_failed_preflight_is_resubmitted_whatever_its_causes_default() -> None:
    """analyze turns a pre-flight's network_unreachable (retry stop by default) into retry requeue."""
    assert CAUSES["network_unreachable"].retry == "stop"
    assert why_not_resubmit("network_unreachable", "requeue") is None


@pytest.mark.parametrize(("cause", "retry", "words"), [
    (None, None, "no post-mortem"),
    ("user_code_exception", "stop", "would fail again"),
    ("collective_timeout", "unknown", "cannot tell"),
    ("slurm_time_limit", "requeue", "requeues itself"),  # --max-requeues covers it inside the job
    ("preempted", "requeue", "requeues itself"),
])
def test_why_not(cause: str | None, retry: str | None, words: str) -> None:
    assert words in (why_not_resubmit(cause, retry) or "")


@pytest.mark.parametrize(("current", "nodes", "merged"), [
    (None, ["n02"], "n02"),
    (None, [], None),
    ("n[01-02]", ["n03"], "n[01-03]"),
    ("n01", ["n01"], "n01"),
    ("gpu07,n01", ["n02"], "gpu07,n[01-02]"),
    ("weird[", ["n02"], "weird[,n02"),  # an expression ddpslurm cannot expand is kept for Slurm to read
])
def test_merged_exclude(current: str | None, nodes: list[str], merged: str | None) -> None:
    assert merged_exclude(current, nodes) == merged


@pytest.mark.parametrize(("line", "folder"), [
    ("sbatch /home/u/runs/.submission_file_6f001b0f7ea744f6.sh", "/home/u/runs/job_77"),
    ("sbatch --exclude=n02 '/scratch/my runs/.submission_file_abc123.sh'", "/scratch/my runs/job_77"),
    ("sbatch job.sbatch", None),  # not a job ddpslurm submitted
    ("", None),
    ("sbatch 'unterminated /x/.submission_file_ab.sh", "/x/job_77"),
])
def test_job_folder_from_submit_line(line: str, folder: str | None) -> None:
    assert job_folder_from_submit_line(line, "77") == folder


class FakeCluster:
    """Jobs that end as scripted: each submission takes the next (state, ok, nodes, diagnosis)."""

    def __init__(self, root: Path, outcomes: list[tuple[str, bool, tuple[str, ...], dict | None]],
                 refuse_after: int | None = None) -> None:
        self.root, self.outcomes, self.refuse_after = root, list(outcomes), refuse_after
        self.excludes: list[str | None] = []
        self.said: list[str] = []

    def submit(self, exclude: str | None) -> tuple[str, str]:
        if self.refuse_after is not None and len(self.excludes) >= self.refuse_after:
            raise SubmitError("sbatch refused the job: Requested node configuration is not available", "fewer nodes")
        self.excludes.append(exclude)
        job_id = str(100 + len(self.excludes))
        folder = self.root / f"job_{job_id}"
        folder.mkdir()
        return job_id, str(folder)

    def wait(self, job_id: str) -> tuple[str, bool, tuple[str, ...]]:
        state, ok, nodes, _ = self.outcomes[int(job_id) - 101]
        return state, ok, nodes

    def analyze(self, job_id: str, folder: str) -> dict | None:
        return self.outcomes[int(job_id) - 101][3]

    def steps(self) -> ChainSteps:
        return ChainSteps(self.submit, self.wait, self.analyze, self.said.append)


PREFLIGHT_N02 = {"cause": "network_unreachable", "retry": "requeue", "exclude_nodes": ["n02"], "summary": "pre-flight"}


def test_an_infrastructure_fault_resubmits_away_from_the_blamed_node(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, [("failed", False, ("n01", "n02"), PREFLIGHT_N02),
                                     ("completed", True, ("n01", "n03"), None)])
    record = run_chain(cluster.steps(), retries=2, exclude="n09")
    assert cluster.excludes == ["n09", "n[02,09]"]
    assert (record["ok"], record["job_id"]) == (True, "102")
    assert [(a["decision"], a["excluded"]) for a in record["attempts"]] == \
        [("resubmitted", ["n09"]), ("completed", ["n02", "n09"])]
    assert cluster.said == ["Job 101 failed (network_unreachable): resubmitting excluding n[02,09] (retry 1 of 2)."]
    for folder in ("job_101", "job_102"):  # every job of the chain knows the whole chain
        assert read_chain(tmp_path / folder) == {"schema": 1, "kind": "retry_chain", **record}


def test_a_bug_in_the_script_is_not_retried(tmp_path: Path) -> None:
    bug = {"cause": "user_code_exception", "retry": "stop", "exclude_nodes": [], "summary": "ValueError"}
    cluster = FakeCluster(tmp_path, [("failed", False, ("n01",), bug)])
    record = run_chain(cluster.steps(), retries=3, exclude=None)
    assert (record["ok"], len(record["attempts"]), cluster.said) == (False, 1, [])
    assert "would fail again" in record["attempts"][0]["decision"]


def test_the_chain_stops_after_n_retries(tmp_path: Path) -> None:
    node = {"cause": "node_failure", "retry": "requeue", "summary": "node died"}
    cluster = FakeCluster(tmp_path, [("node_fail", False, (f"n0{i}",), {**node, "exclude_nodes": [f"n0{i}"]})
                                     for i in (1, 2, 3)])
    record = run_chain(cluster.steps(), retries=2, exclude=None)
    assert [a["decision"] for a in record["attempts"]] == ["resubmitted", "resubmitted", "no retries left (2)"]
    assert cluster.excludes == [None, "n01", "n[01-02]"] and not record["ok"]


def test_a_refused_resubmission_ends_the_chain_and_is_recorded(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, [("failed", False, ("n01", "n02"), PREFLIGHT_N02)], refuse_after=1)
    record = run_chain(cluster.steps(), retries=2, exclude=None)
    assert not record["ok"] and len(record["attempts"]) == 1
    assert record["attempts"][0]["decision"].startswith("resubmission refused: sbatch refused the job")


def test_the_first_submission_error_is_the_users(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, [], refuse_after=0)
    with pytest.raises(SubmitError):
        run_chain(cluster.steps(), retries=2, exclude=None)


def test_no_post_mortem_is_not_retried(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, [("failed", False, (), None)])
    record = run_chain(cluster.steps(), retries=2, exclude=None)
    assert "no post-mortem" in record["attempts"][0]["decision"]


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"kind": "job", "attempts": []}',
                                  '{"kind": "retry_chain", "attempts": 3}'])
def test_read_chain_ignores_what_is_not_a_chain(tmp_path: Path, text: str) -> None:
    (tmp_path / CHAIN_FILE).write_text(text)
    assert read_chain(tmp_path) is None
    assert read_chain(None) is None


def test_chain_lines_never_let_file_text_drive_the_terminal() -> None:
    chain = {"retries": 1, "attempts": [{"job_id": "1\x1b[2J", "nodes": ["n01"], "state": "failed",
                                         "cause": "node_failure", "exclude_nodes": ["n01\x07"], "decision": "x"},
                                        "not a dict"]}
    lines = chain_lines(chain, terminal)
    assert len(lines) == 2 and not any("\x1b" in line or "\x07" in line for line in lines)
    assert json.dumps(lines)  # plain strings


@pytest.mark.parametrize(("args", "words"), [
    (("--retries", "-1"), "--retries -1 is negative"),
    (("--retries", "2", "--local"), "cannot run with --local"),
])
def test_retries_usage_errors_are_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    line = one_clean_error_line(run_cli("submit", "train.py", *args, cwd=tmp_path), 2)
    assert words in line and not (tmp_path / "ddpslurm_jobs").exists()
