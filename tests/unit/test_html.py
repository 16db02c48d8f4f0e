"""The HTML report: what the timeline model derives from a Diagnosis, and markup that log text cannot break."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest

from ddpslurm.analyze.model import Diagnosis, Evidence, RankRow
from ddpslurm.analyze.report.html import render_html, write_html
from ddpslurm.analyze.report.html_timeline import build_model, runs_of, unix_time
from ddpslurm.errors import AnalyzeInputError

T0 = 1_795_370_500.0


class Tags(HTMLParser):
    """Start tags with their attributes, as a browser's tokenizer sees them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def having(self, tag: str, cls: str | None = None, **attrs: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and (cls is None or cls in (a.get("class") or "").split())
                and all(a.get(k) == v for k, v in attrs.items())]


def job(nodes: int, per_node: int, culprit: int | None, *, times: bool = True, timeline: bool = True,
        error: str = "watchdog timeout after 600000 ms on rank {rank}") -> Diagnosis:
    """A job of `nodes` x `per_node` ranks where `culprit` failed first and the others timed out later."""
    ranks, rows, evidence = [], [], []
    for rank in range(nodes * per_node):
        host = f"gpu{rank // per_node + 1:04d}"
        role = "culprit" if rank == culprit else "victim"
        text = "torch.OutOfMemoryError: CUDA out of memory" if rank == culprit else error.replace("{rank}", str(rank))
        when = T0 + (1.0 if rank == culprit else 600.0 + rank * 1e-3)
        ranks.append(RankRow(rank, host, role, text))
        rows.append(timeline_row(rank, host, role, when if times else None, text, when + 0.5 if times else None))
        evidence.append(Evidence(f"logs/rank_{rank}.log", 10 + rank, rank, None, text))
    host = None if culprit is None else ranks[culprit].host
    diagnosis = Diagnosis("cuda_oom" if culprit is not None else "collective_timeout", culprit, host, "high",
                          "summary", ["advice"], evidence, ranks, "stop", [])
    diagnosis.timeline = rows if timeline else []  # the engine's contract (DESIGN.md, issue 15)
    diagnosis.job_events = [Evidence("slurm.err", 3, None, "2026-11-22T18:02:22Z",
                                     "*** STEP 1.0 ON gpu0001 CANCELLED AT 2026-11-22T18:02:22 ***")]
    return diagnosis


def timeline_row(rank: int, host: str, role: str, first: float | None, text: str, last: float | None):
    """One row of `Diagnosis.timeline` as the engine fills it."""
    return SimpleNamespace(rank=rank, host=host, role=role, first_failure_time=first, first_failure_text=text,
                           last_time=last, exit_status="exception")


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-22T18:02:19.747Z", 1795370539.747),
    ("2026-11-22T19:02:19.747+01:00", 1795370539.747),
    ("2026-11-22T18:02:19.747", 1795370539.747),
    (1795370539.5, 1795370539.5),
    ("18:02:19", None),
    ("", None),
    (None, None),
])
def test_unix_time_reads_iso_times_with_any_offset_and_refuses_the_rest(text, expected) -> None:
    assert unix_time(text) == (pytest.approx(expected) if expected is not None else None)


def test_each_node_is_one_group_and_the_culprit_is_marked_once() -> None:
    page = Tags(render_html(job(nodes=3, per_node=2, culprit=3)))
    nodes = page.having("g", "node")
    assert [n["data-host"] for n in nodes] == ["gpu0001", "gpu0002", "gpu0003"]
    (culprit,) = [a for _, a in page.tags if a.get("id") == "culprit"]
    assert "role-culprit" in culprit["class"].split()
    assert [r["data-ranks"] for r in page.having("g", "run")] == ["0-1", "2", "3", "4-5"]


def test_alike_neighbouring_ranks_are_one_run_whatever_their_numbers() -> None:
    diagnosis = job(nodes=1, per_node=8, culprit=None, error="rank {rank}: watchdog timeout, seq {rank}23")
    (row,) = build_model(diagnosis).rows
    assert [(run.ranks, run.role) for run in row.runs] == [("0-7", "victim")]
    marks = build_model(job(nodes=1, per_node=8, culprit=5)).rows[0].runs
    assert [run.ranks for run in runs_of(m for run in marks for m in run.marks)] == ["0-4", "5", "6-7"]


def test_a_big_job_draws_alike_nodes_as_one_row_and_keeps_the_culprit_node_apart() -> None:
    model = build_model(job(nodes=2048, per_node=8, culprit=8 * 700 + 3))
    labels = [(len(row.hosts), row.has_culprit) for row in model.rows]
    assert labels == [(700, False), (1, True), (1347, False)]
    culprit_row = model.rows[1]
    assert culprit_row.hosts == ("gpu0701",)
    assert [run.ranks for run in culprit_row.runs] == ["5600-5602", "5603", "5604-5607"]


@pytest.mark.parametrize("hostile", [
    "</title><script>alert(1)</script>",
    "\"><img src=x onerror=alert(1)>",
    "<svg onload=alert(1)>",
    "]]></text><foreignObject><iframe src=//evil/></foreignObject>",
    "\x1b]8;;http://evil/\x07click\x1b]8;;\x07 <style>*{display:none}</style>",
])
def test_log_text_and_host_names_cannot_inject_markup(hostile: str) -> None:
    diagnosis = job(nodes=2, per_node=2, culprit=1, error=hostile)
    diagnosis.ranks[0] = RankRow(0, hostile, "victim", hostile)
    diagnosis.advice.append(hostile)
    diagnosis.evidence.append(Evidence(hostile, 1, 0, hostile, hostile))
    out = render_html(diagnosis)
    page = Tags(out)
    assert {t for t, _ in page.tags} <= {"html", "head", "meta", "title", "style", "body", "section", "h1", "h2",
                                        "code", "p", "dl", "dt", "dd", "ul", "li", "span", "i", "svg", "text",
                                        "line", "g", "rect", "circle", "path", "table", "tr", "th", "td"}
    assert not [a for _, a in page.tags if any(k.startswith("on") for k in a)]
    assert "\x1b" not in out and "<script" not in out.lower()
    assert len(page.having("svg")) == 1


def test_the_page_fetches_nothing_and_forbids_scripts() -> None:
    out = render_html(job(nodes=2, per_node=2, culprit=0))
    (policy,) = Tags(out).having("meta", **{"http-equiv": "Content-Security-Policy"})
    assert "default-src 'none'" in policy["content"] and "script-src" not in policy["content"]
    assert not re.search(r"\b(?:src|href)=", out) and "http://" not in out.replace("http://www.w3.org/2000/svg", "")


def test_marks_are_placed_in_time_order_and_slurm_events_are_vertical_rules() -> None:
    page = Tags(render_html(job(nodes=2, per_node=2, culprit=2)))
    (culprit,) = [a for _, a in page.tags if a.get("id") == "culprit"]
    victims = [float(a.get("cx") or a["x"]) for a in page.having("rect", "role-victim")
               + page.having("circle", "role-victim")]
    assert victims and all(float(culprit["cx"]) < x for x in victims)
    (rule,) = page.having("line", "job-event")
    assert rule["x1"] == rule["x2"] and float(rule["y2"]) > float(rule["y1"])


def test_without_the_engine_timeline_times_come_from_the_evidence() -> None:
    diagnosis = job(nodes=2, per_node=1, culprit=1, timeline=False)
    diagnosis.evidence = [Evidence("a.log", 1, 0, "2026-11-22T18:10:00Z", "rank 0 timed out"),
                          Evidence("b.log", 7, 1, "2026-11-22T18:00:00Z", "CUDA out of memory")]
    model = build_model(diagnosis)
    times = {m.rank: m.time for row in model.rows for run in row.runs for m in run.marks}
    assert times == {0: unix_time("2026-11-22T18:10:00Z"), 1: unix_time("2026-11-22T18:00:00Z")}
    assert model.rows[1].runs[0].marks[0].where == "b.log:7"


def test_logs_without_times_are_drawn_in_the_no_time_band_and_say_so() -> None:
    diagnosis = job(nodes=2, per_node=2, culprit=1, times=False)
    diagnosis.job_events = []
    out = render_html(diagnosis)
    page = Tags(out)
    assert len(page.having("circle", "untimed")) == len(page.having("g", "run")) == 3
    assert "carry no timestamps" in out


def test_no_single_rank_is_shown_as_such() -> None:
    out = render_html(job(nodes=2, per_node=2, culprit=None))
    assert "none (no single rank)" in out and 'id="culprit"' not in out


def test_an_unwritable_target_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(AnalyzeInputError, match="cannot write the HTML report"):
        write_html(job(nodes=1, per_node=1, culprit=0), tmp_path / "missing" / "report.html")


def test_past_the_run_budget_a_nodes_ranks_are_grouped_by_role_whatever_their_messages() -> None:
    diagnosis = job(nodes=512, per_node=8, culprit=100)
    for row in diagnosis.timeline:  # every victim a message shape of its own: no two neighbours alike
        if row.role != "culprit":
            row.first_failure_text = "failed in " + "".join(chr(97 + int(d)) for d in str(row.rank))
    model = build_model(diagnosis)
    assert [(len(row.hosts), row.has_culprit) for row in model.rows] == [(12, False), (1, True), (499, False)]
    assert [sorted((run.role, len(run.marks)) for run in row.runs) for row in model.rows] == [
        [("victim", 8 * 12)], [("culprit", 1), ("victim", 7)], [("victim", 8 * 499)]]


def test_a_few_nodes_with_many_distinct_ranks_are_grouped_by_role_too() -> None:
    diagnosis = job(nodes=16, per_node=256, culprit=5)
    for row in diagnosis.timeline:
        if row.role != "culprit":
            row.first_failure_text = "failed in " + "".join(chr(97 + int(d)) for d in str(row.rank))
    model = build_model(diagnosis)
    assert len(model.rows) == 16
    assert sum(len(row.runs) for row in model.rows) == 17  # one run per node, the culprit's apart
