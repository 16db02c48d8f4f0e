"""Timestamps in every common log form -> comparable epoch seconds (table-driven)."""

from __future__ import annotations

import calendar

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.model import Event
from ddpslurm.analyze.parse import timestamps
from ddpslurm.analyze.parse.timestamps import comparable, format_time, in_year, parse_record_time, parse_time
from ddpslurm.analyze.parse.years import settle_years


def utc(y: int, mo: int, d: int, h: int, mi: int, s: float) -> float:
    return calendar.timegm((y, mo, d, h, mi, int(s), 0, 0, 0)) + (s - int(s))


@pytest.mark.parametrize(("text", "year", "expected", "family"), [
    ("2024-05-08T08:47:31.261Z rank 3", None, utc(2024, 5, 8, 8, 47, 31.261), "iso-tz"),
    ("2024-05-08T10:47:31+02:00 x", None, utc(2024, 5, 8, 8, 47, 31), "iso-tz"),
    ("[2024-05-08 08:47:31,261] torch.distributed.elastic", None, utc(2024, 5, 8, 8, 47, 31.261), "iso"),
    ("slurmstepd: error: *** STEP 1.0 ON n1 CANCELLED AT 2023-09-01T02:09:45 ***", None,
     utc(2023, 9, 1, 2, 9, 45), "iso"),
    ("[2024-05-08 08:47:31] node1:1:2 [0] NCCL WARN x", None, utc(2024, 5, 8, 8, 47, 31), "iso"),
    ("E0217 08:19:10.679000 1234 torch/distributed/elastic/api.py:1] x", 2024, utc(2024, 2, 17, 8, 19, 10.679), "glog"),
    ("[rank3]:[E612 10:24:03.200000266 ProcessGroupNCCL.cpp:607] x", 2024, utc(2024, 6, 12, 10, 24, 3.2), "glog"),
    ("[W1122 18:04:41.836253510 socket.cpp:494] x", 2026, utc(2026, 11, 22, 18, 4, 41.836253), "glog"),
    ("Starting at Fri Jan  5 09:58:11 EST 2024 on cdr2596", None, utc(2024, 1, 5, 9, 58, 11), "ctime"),
    ("2025-11-09 15:39:31.043 +08:00 [2025-11-09 07:39:30] h100-28:238:1219 [0] x", None,
     utc(2025, 11, 9, 7, 39, 31.043), "iso-tz"),  # a collector's offset after a space
    ("May  8 08:47:31 node02 kernel: NVRM: Xid 79", 2024, utc(2024, 5, 8, 8, 47, 31), "syslog"),
])
def test_parse_time(text: str, year: int | None, expected: float, family: str) -> None:
    got = parse_time(text, year)
    assert got is not None
    assert got[0] == pytest.approx(expected, abs=1e-3)
    assert got[1] == family


@pytest.mark.parametrize("text", [
    "no time here",
    "step 100 loss 3.14",
    "[80746] RuntimeError: x",
    "E9999 99:99:99 not a time",
])
def test_no_time(text: str) -> None:
    assert parse_time(text, 2024) is None


@pytest.mark.parametrize(("value", "expected"), [
    (1715158051.5, 1715158051.5),
    ("1715158051", 1715158051.0),
    ("2024-05-08T08:47:31.261000+00:00", utc(2024, 5, 8, 8, 47, 31.261)),
    ("2024-05-08_08:47:31", utc(2024, 5, 8, 8, 47, 31)),  # torchelastic's failure block
    (True, None),
    ("garbage", None),
    (None, None),
])
def test_parse_record_time(value: object, expected: float | None) -> None:
    got = parse_record_time(value)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("iso-tz", "record", True),
    ("record", "epoch", True),
    ("iso", "glog", True),  # both the nodes' local time
    ("iso", "record", False),  # local vs UTC: the zone is unknown
    ("glog", None, False),
])
def test_comparable(a: str | None, b: str | None, expected: bool) -> None:
    assert comparable(a, b) is expected


def test_format_time_is_iso_utc() -> None:
    assert format_time(utc(2024, 5, 8, 8, 47, 31.261)) == "2024-05-08T08:47:31.261Z"
    assert format_time(None) is None


@pytest.mark.parametrize("line", ["[E314 22:55:01.005 x]", "[I1231 23:59:59.999999 x]", "Mar 14 22:55:01 host x",
                                  "[W0101 00:00:00.25 x]", "[I0229 01:02:03.5 x]", "[I0301 01:02:03.5 x]"])
@pytest.mark.parametrize(("guessed", "year"), [(2026, 2025), (2023, 2024), (2024, 2021)])
def test_a_year_less_time_moved_to_another_year_is_the_line_read_with_that_year(line: str, guessed: int,
                                                                               year: int) -> None:
    read_with_guess = parse_time(line, guessed)
    assert read_with_guess is not None
    moved = in_year(read_with_guess[0], year)
    if moved is None:  # around 29 February: the caller reads the line again
        assert "0229" in line or "0301" in line
    else:
        assert moved == pytest.approx(parse_time(line, year)[0], abs=1e-6)


two_digits = st.integers(0, 99).map(lambda n: f"{n:02d}")
#: the four forms with any two digits in each field (times out of range too), amid noise
clock_texts = st.builds(
    lambda form, noise, y, mo, d, h, mi, sec: noise + form.format(y=f"20{y}", mo=mo, d=d, h=h, mi=mi, s=sec) + noise,
    st.sampled_from(["{y}-{mo}-{d}T{h}:{mi}:{s}Z", "{y}-{mo}-{d} {h}:{mi}:{s},261", "E{mo}{d} {h}:{mi}:{s}.5",
                     "Fri Jan {d} {h}:{mi}:{s} EST {y}", "May {d} {h}:{mi}:{s} node", "{h}:{mi}:{s}", "{h}:{mi}"]),
    st.sampled_from(["", " ", "x ", "[", "9"]), two_digits, two_digits, two_digits, two_digits, two_digits, two_digits)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(clock_texts)
def test_the_clock_shortcut_changes_no_answer(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """A text without `d:dd:dd` is passed over before the four forms are searched: as if they had been."""
    fast = parse_time(text, 2024)
    with monkeypatch.context() as m:
        m.setattr(timestamps, "CLOCK", regex.compile(""))
        assert parse_time(text, 2024) == fast


@settings(max_examples=1500, deadline=None)
@given(clock_texts, clock_texts, st.text(alphabet="0123456789: -.ETZ[]", max_size=12), st.sampled_from([None, 2024]))
def test_a_planned_search_reads_what_the_full_search_reads(text: str, other: str, more: str, year: int | None) -> None:
    """A line recipe searches its lines for the time form, and from the place, that its shape allows
    (`time_plan`): whatever the digits of a line of that shape, it reads what the full search reads."""
    for line in (text, more + text, text + more, more, other + " " + text, text + " " + other):
        plan = timestamps.time_plan(regex.sub(r"\d", "0", line))
        assert timestamps.parse_planned(line, plan, year) == parse_time(line, year), (line, plan)
        if plan is None:
            assert parse_time(line, year) is None


@pytest.mark.parametrize("line", [
    "E0508 08:47:31.5 then 2024-05-08 08:47:32 x",  # the earlier form wins wherever it sits
    "2024-05-08 08:47:32 x E0508 08:47:31.5",
    "E1308 08:47:31 bad month, then W0508 08:47:33.25 x",  # the first place fails, a later one reads
    "2024-13-08 08:47:32 bad month, then E0508 08:47:31.5",  # the planned form fails: the full search reads
    "Fri Jan  5 09:58:11 EST 2024 E0105 09:58:12.1",
])
def test_a_planned_search_reads_lines_with_several_times(line: str) -> None:
    plan = timestamps.time_plan(regex.sub(r"\d", "0", line))
    assert timestamps.parse_planned(line, plan, 2024) == parse_time(line, 2024) is not None


def test_a_shape_tells_which_form_its_time_is_in() -> None:
    assert timestamps.time_plan("gpu-0000:000000:000000 [0] NCCL INFO Bootstrap : Using ib0:00.000.0.0<0>") is None
    assert timestamps.time_plan("[E000 00:00:00.000000000 ProcessGroupNCCL.cpp:000] x") == (1, 1)
    assert timestamps.time_plan("x [0000-00-00 00:00:00,000] y") == (0, 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["0228", "0229", "0301", "0314", "1231", "0101"]),
                          st.integers(0, 86399), st.integers(0, 999999)), min_size=1, max_size=12),
       st.sampled_from([2023, 2024, 2025]), st.sampled_from([2024, 2026]))
def test_year_less_times_move_by_day_as_each_line_would(lines: list[tuple[str, int, int]], guessed: int,
                                                         logs_year: int) -> None:
    """`settle_years` moves a day's year-less times by that day's shift: each time is what moving it alone gives
    (the line read again with the logs' year around 29 February), to the last bit."""
    texts = [f"[E{day} {sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}.{frac:06d} x]" for day, sec, frac in lines]
    events = [Event(file="f", line=i, kind="watchdog_timeout", text=text, time=found[0], time_family="glog")
              for i, text in enumerate(texts) if (found := parse_time(text, guessed))]
    events.append(Event(file="f", line=999, kind="rank_info", text="x",
                        time=calendar.timegm((logs_year, 6, 1, 0, 0, 0, 0, 0, 0)), time_family="iso"))
    got = settle_years(list(events), guessed)  # it updates the list it is given
    for before, after in zip(events, got, strict=True):
        if before.time_family != "glog" or logs_year == guessed:
            assert after.time == before.time
            continue
        moved = in_year(before.time, logs_year)
        assert after.time == (moved if moved is not None else parse_time(before.text, logs_year)[0])


@settings(max_examples=500, deadline=None)
@given(st.integers(-5, 12000), st.integers(-1, 14), st.integers(0, 40), st.integers(0, 29), st.integers(0, 59),
       st.integers(0, 69))
def test_epoch_is_what_calendar_timegm_says(y: int, mo: int, d: int, h: int, mi: int, s: int) -> None:
    """The month's first day is cached; the rest is timegm's own arithmetic, unchecked as it leaves it."""
    try:
        expected = float(calendar.timegm((y, mo, d, h, mi, min(s, 59), 0, 0, 0)))
    except (ValueError, OverflowError):
        expected = None
    assert timestamps.epoch(y, mo, d, h, mi, s) == expected
