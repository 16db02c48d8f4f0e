"""The HTML timeline's axis and placement: human tick labels, breaks over idle spans, each rank's first failure where
it happened (not at its exit), host events on the axis."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import Diagnosis, Event
from ddpslurm.analyze.report.html import render_html
from ddpslurm.analyze.report.html_axis import Axis, bursts, human
from ddpslurm.analyze.report.html_timeline import build_model
from ddpslurm.analyze.report.timeline_rows import placed, syslog_host

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "analyzer" / "cases"
#: a label in raw seconds past a minute (`+60000s`, `+600.0 s`): what a human axis never shows
RAW_SECONDS = re.compile(r"\+\d{3,}(?:\.\d+)? ?s\b")


@cache
def diagnosis_of(name: str) -> Diagnosis:
    return analyze_paths([CASES / name])


@pytest.mark.parametrize(("seconds", "step", "said"), [
    (0.25, 0.05, "250 ms"), (1.5, 0.5, "1.5 s"), (12, 5, "12 s"), (150, 30, "2 min 30 s"), (150.5, 0.5, "2 min 30.5 s"),
    (602.45, 0.05, "10 min 02.45 s"), (600, 60, "10 min"), (3900, 600, "1 h 05 min"), (3905, 5, "1 h 05 min 05 s"),
    (60000, 3600, "16 h 40 min"), (90000, 3600, "1 d 1 h"),
])
def test_durations_read_in_human_units(seconds: float, step: float, said: str) -> None:
    assert human(seconds, step) == said


def test_a_long_idle_span_is_cut_out_and_short_ones_are_not() -> None:
    assert bursts([0, 0.5, 1, 600, 601, 602.5, 660]) == [(0, 1), (600, 602.5), (660, 660)]
    assert bursts([0, 1, 2, 3, 4]) == [(0, 4)]
    assert bursts([5.0]) == [(5.0, 5.0)]
    assert bursts([0, 0.002, 0.018]) == [(0, 0.018)]  # milliseconds apart: in proportion
    assert bursts([0, 20, 20.1]) == [(0, 20.1)]  # a straggler 20 s before the timeouts: in proportion too


@pytest.mark.parametrize("times", [[0, 0.2, 0.4], [0, 1, 60000], [0, 30, 60, 90, 3600 * 5], [0, 0.001, 600, 600.5]])
def test_ticks_are_human_in_order_within_the_plot_and_times_map_in_order(times: list[float]) -> None:
    axis = Axis([1.8e9 + t for t in times], 170, 650)
    ticks = axis.ticks()
    assert [x for x, _ in ticks] == sorted(x for x, _ in ticks) and all(170 <= x <= 650 for x, _ in ticks)
    assert not [label for _, label in ticks if RAW_SECONDS.search(label)], ticks
    xs = [axis.x(1.8e9 + t) for t in times]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    assert len(axis.breaks()) == len(bursts(times)) - 1


def event(line: int, time: float | None, role: str = "culprit", kind: str = "exception", file: str = "r.log") -> Event:
    return Event(file=file, line=line, kind=kind, text="x", rank=3, time=time, role=role)


def test_an_untimed_failure_is_placed_by_the_lines_around_it() -> None:
    from ddpslurm.analyze.diagnose.timeline import RankTimeline

    untimed = event(20, None)
    lines = ({"r.log": [(5, 100.0), (19, 140.0), (30, 150.0)]}, {3: [(-1, 100.0), (-1, 140.0), (-1, 150.0)]})
    rt = RankTimeline(rank=3, failures=[untimed])
    assert placed(rt, untimed, lines, False) == (140.0, "the line has no time: after the last timed line before it")
    record = event(1, 141.5, file="rank_3.exit.json")
    rt = RankTimeline(rank=3, failures=[untimed, record])
    assert placed(rt, untimed, lines, False)[0] == 141.5  # the exit record written as the exception left
    assert placed(rt, untimed, ({}, {}), False)[0] == 141.5
    assert placed(RankTimeline(rank=3, failures=[untimed]), untimed, ({}, {}), False) == (None, None)


def test_a_culprit_killed_in_the_teardown_is_placed_where_it_fell_silent() -> None:
    from ddpslurm.analyze.diagnose.timeline import RankTimeline

    kill = event(1, 200.0, role="victim", kind="exit_signal", file="rank_3.exit.json")
    rt = RankTimeline(rank=3, failures=[kill])
    lines = ({}, {3: [(-1, 100.0), (-1, 120.0)]})
    assert placed(rt, kill, lines, True)[0] == 120.0
    assert placed(rt, kill, lines, False) == (200.0, None)  # a victim is drawn at its own line


def test_a_straggler_culprit_is_drawn_before_the_ranks_that_timed_out_waiting_for_it() -> None:
    """lab-collective_timeout-1: rank 4 sleeps in a collective; the others' gloo timeouts fire; the teardown's SIGTERM
    is the only line rank 4 has. Drawn at its exit, it was the last mark on the axis."""
    d = diagnosis_of("lab-collective_timeout-1")
    rows = {row.rank: row for row in d.timeline}
    culprit = rows[d.first_failing_rank]
    assert culprit.placed and "silent" in culprit.placed
    others = [row.first_failure_time for row in d.timeline if row.role == "victim" and row.first_failure_time]
    assert others and culprit.first_failure_time < min(others)
    svg = render_html(d)
    culprit_x = float(re.search(r'id="culprit"[^>]*cx="([\d.]+)"', svg)[1])
    victim_xs = [float(x) for x in re.findall(r'class="mark role-victim[^"]*"[^>]*\s(?:cx|x)="([\d.]+)"', svg)]
    assert victim_xs and culprit_x < min(victim_xs)


def test_an_xid_ten_minutes_earlier_is_on_the_axis_of_its_node_with_a_break_before_the_ranks_fail() -> None:
    d = diagnosis_of("gpu-hardware-xid79-fell-off-bus-rank12-journal-srun-label")
    assert {e.host for e in d.host_events} == {d.first_failing_host}
    model = build_model(d)
    assert model.host_events and min(e.time for e in model.host_events) == model.start
    out = render_html(d)
    assert re.search(r'class="host-event kind-gpu"[^>]*data-host="' + re.escape(d.first_failing_host), out)
    (idle,) = re.findall(r'class="axis-break" data-idle="([\d.]+)"', out)
    assert float(idle) > 600 and ">10 min 02 s<" in out
    assert not RAW_SECONDS.search(" ".join(re.findall(r'<text class="tick"[^>]*>([^<]*)<', out)))


def test_syslog_and_journal_lines_name_their_host() -> None:
    assert syslog_host("Mar 02 03:14:07 gpu-d07 kernel: NVRM: Xid (PCI:0000:9a:00): 79") == "gpu-d07"
    assert syslog_host("2026-03-02T03:14:07+0100 gpu-d07.cluster kernel: NVRM: Xid") == "gpu-d07.cluster"
    assert syslog_host("[ 1907.888001] Memory cgroup out of memory: Killed process 25272") is None
