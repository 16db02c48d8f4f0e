"""Year-less times (glog, syslog) are given a year the logs tell, never a year to come."""

from __future__ import annotations

import calendar
import os
import time
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import Event
from ddpslurm.analyze.parse.timestamps import parse_time
from ddpslurm.analyze.parse.years import settle_years

WATCHDOG = ("[rank{r}]:[E{md} 13:23:05.{frac:06d} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            "ran for 600045 milliseconds before timing out.\n")


def _utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> float:
    return float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)))


def _glog(md: str, year: int, file: str = "a.log") -> Event:
    text = f"[E{md} 13:23:05.000000 x.cpp:1] boom"
    found = parse_time(text, year)
    assert found is not None
    return Event(file=file, line=1, kind="watchdog_timeout", text=text, time=found[0], time_family=found[1])


def _dated(y: int, mo: int, d: int, file: str = "a.log") -> Event:
    return Event(file=file, line=2, kind="rank_info", text="x", time=_utc(y, mo, d), time_family="iso")


def _year(e: Event) -> int:
    assert e.time is not None
    return time.gmtime(e.time).tm_year


def test_a_time_that_would_come_after_the_log_was_written_is_last_year() -> None:
    written = _utc(2027, 1, 5, 12)  # a log of the turn of the year, written on 5 January
    got = settle_years([_glog("1224", 2027), _glog("0104", 2027)], 2027, written)
    assert [_year(e) for e in got] == [2026, 2027]


def test_the_files_own_full_dates_win_over_the_jobs_and_the_guess() -> None:
    events = [_glog("0601", 2026, "a.log"), _dated(2023, 6, 1, "a.log"),
              _glog("0601", 2026, "b.log"), _dated(2024, 6, 1, "c.log"), _dated(2024, 6, 2, "c.log")]
    got = settle_years(events, 2026, _utc(2026, 12, 1))
    assert _year(got[0]) == 2023  # its own file's date
    assert _year(got[2]) == 2024  # no date of its own: the job's


@pytest.mark.parametrize("assumed", [2025, 2026, 2030])
def test_without_any_date_the_guess_stands_unless_it_lies_ahead(assumed: int) -> None:
    written = _utc(assumed, 3, 1)
    got = settle_years([_glog("0201", assumed), _glog("0401", assumed)], assumed, written)
    assert [_year(e) for e in got] == [assumed, assumed - 1]


def test_a_turn_of_the_year_job_read_from_files_is_ordered_as_it_ran(tmp_path: Path) -> None:
    """Rank 1 timed out on 31 December, rank 0 on 1 January: with the logs written on 1 January and no full date
    anywhere, 31 December is last year's, so rank 1's timeout came first."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.log").write_text(WATCHDOG.format(r=0, md="0101", frac=0))
    (job / "rank1.log").write_text(WATCHDOG.format(r=1, md="1231", frac=0))
    for p in job.iterdir():
        os.utime(p, (_utc(2027, 1, 1, 14), _utc(2027, 1, 1, 14)))
    rows = {row.rank: row for row in analyze_paths([job], workers=1).timeline}
    assert rows[1].first_failure_time is not None and rows[0].first_failure_time is not None
    assert rows[1].first_failure_time < rows[0].first_failure_time
