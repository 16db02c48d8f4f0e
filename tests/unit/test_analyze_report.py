"""The terminal report: one line per evidence header and text, short paths, a table that never wraps."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ddpslurm.analyze.model import Diagnosis, Evidence, RankRow
from ddpslurm.analyze.report.text import evidence_root, one_line, render_text

GLOO = ("RuntimeError: \n[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [10.0.0.12]:2728. This is typically caused by a remote worker crashing.")


@pytest.mark.parametrize(("text", "short"), [
    (GLOO, "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.12]:2728. This is typically caused by "
           "a remote worker crashing."),
    ("[E217 07:43:09.365200139 ProcessGroupNCCL.cpp:629] [Rank 11] Watchdog caught",
     "[Rank 11] Watchdog caught"),
    ("E0217 08:19:10.679000 1234 torch/distributed/elastic/multiprocessing/api.py:882] failed", "failed"),
    ("plain \x1b[31mred\x1b[0m   text", "plain red text"),
])
def test_one_line(text: str, short: str) -> None:
    assert one_line(text) == short


@pytest.mark.parametrize(("files", "root"), [
    (["/j/job_1/attempt_0/rank_3.log", "/j/job_1/1_0_log.err"], "/j/job_1"),
    (["/j/a.log"], "/j"),
    (["/a/x.log", "/b/y.log"], ""),
    (["rel/x.log", "/abs/y.log"], ""),
])
def test_evidence_root(files: list[str], root: str) -> None:
    assert evidence_root(files) == root


def test_report_lines_fit_the_width_and_name_the_culprit() -> None:
    diagnosis = Diagnosis(
        cause="user_code_exception", first_failing_rank=3, first_failing_host="node02", confidence="high",
        summary="Rank 3 raised ValueError in the training script.",
        advice=["Read the traceback of rank 3 in the evidence: fix the error and resubmit. " * 3],
        evidence=[Evidence("/jobs/job_7/attempt_0/rank_3.exit.json", 1, 3, "2026-11-22T18:02:19.747Z",
                           "ValueError: bad batch"),
                  Evidence("/jobs/job_7/attempt_0/rank_2.log", 40, 2, None, GLOO)],
        ranks=[RankRow(r, f"node0{1 + r // 2}", "culprit" if r == 3 else "victim",
                       "ValueError: bad batch" if r == 3 else GLOO) for r in range(6)],
        retry="stop")
    out = io.StringIO()
    render_text(diagnosis, Console(file=out, width=80, highlight=False, color_system=None))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines if not line.startswith("  in ")), lines
    assert "  rank_3.exit.json:1  rank 3  2026-11-22T18:02:19.747Z" in lines
    assert "  in /jobs/job_7/attempt_0/" in lines
    assert any(line.startswith("    RuntimeError: [pair.cc:553] Connection closed by peer") for line in lines)
    culprit_rows = [line for line in lines if " culprit " in line]
    assert len(culprit_rows) == 1 and culprit_rows[0].startswith("│ 3 ") and "ValueError: bad batch" in culprit_rows[0]
