"""The year of times that carry none (glog's `E1224 13:23:05`, syslog's `Dec 24 13:23:05`): never invented.

In: every event of the job, the year the scan read year-less times in (`assumed_year`), and when the newest log was
written. Out: the same events, each year-less time moved to the year its own file's full dates give, else the year
the job's other full dates give, else kept in the assumed year (a record's, or the newest log's modification year)
unless that puts it after the log was written: a log cannot tell of a time to come, so such a time is read a year
earlier. Where no full date, record or file time tells the year, the caller leaves the times in the current year and
never later than now.
"""

from __future__ import annotations

import datetime as _dt
import os
import time as _time
from collections import Counter
from collections.abc import Sequence

from ddpslurm.analyze.model import Event, SourceFile, evolve
from ddpslurm.analyze.parse.timestamps import in_year, parse_time

#: families of times that carry their own year
DATED_FAMILIES = ("iso", "iso-tz", "record", "ctime")
#: families whose year the scan had to assume
YEARLESS_FAMILIES = ("glog", "syslog")
#: a year-less time later than this after its log's last write is in the past year (clocks and zones differ by hours)
FUTURE_SLACK_S = 2 * 86400.0
#: the logs whose modification times tell when the job's logs were last written (the newest of them)
MTIME_SAMPLE = 200


def assumed_year(events: Sequence[Event], logs: Sequence[SourceFile]) -> tuple[int | None, float | None]:
    """The year to read year-less times in, and when the logs were last written (None: nothing tells): the year of
    a record's time, else of the newest log's modification time."""
    written = newest_write(logs)
    for e in events:
        if e.time is not None and e.time_family == "record":
            return _year_of(e.time), written
    return (_year_of(written) if written is not None else None), written


def newest_write(logs: Sequence[SourceFile]) -> float | None:
    """The newest modification time of the first logs (a sample: a 65k-rank job is not stat-ed twice)."""
    mtimes = []
    for s in logs[:MTIME_SAMPLE]:
        try:
            mtimes.append(os.stat(s.path).st_mtime)
        except OSError:
            continue
    return max(mtimes) if mtimes else None


def settle_years(events: list[Event], assumed: int | None, written: float | None = None) -> list[Event]:
    """Year-less times moved to the year their file's full dates give, else the job's, else left in `assumed`
    (the year the scan read them in; None: the current year) but never later than `written` (else now) plus
    FUTURE_SLACK_S. The list is updated in place and returned."""
    by_file, overall = _dated_years(events)
    job_year = overall.most_common(1)[0][0] if overall else None
    read_in = assumed if assumed is not None else _year_of(_time.time())
    latest = (written if written is not None else _time.time()) + FUTURE_SLACK_S
    shifts: dict[tuple[int, int], float | None] = {}  # (day, year) -> what moving that day to the year adds
    for i, e in enumerate(events):
        if e.time is None or e.time_family not in YEARLESS_FAMILIES:
            continue
        year = by_file.get(e.file, job_year)
        if year is None:
            year = read_in - 1 if e.time > latest else read_in
        if year != read_in:
            events[i] = _moved(e, year, shifts)
    return events


def _dated_years(events: Sequence[Event]) -> tuple[dict[str, int], Counter[int]]:
    """The year most of each file's events that carry a full date fall in, and those years counted over the job (a
    year per day, not per event: a 16k-rank job has 16k dated lines over a few days). A file's one day is held as
    two numbers, a Counter only for a file of several days (one a file was 34 MB at 65k ranks, for one day each)."""
    first: dict[str, int] = {}  # a file's first day
    counts: dict[str, int] = {}  # its events on that day, while it has no other
    several: dict[str, Counter[int]] = {}  # a file of more days: every day counted, in the order they came
    for e in events:
        if e.time is not None and e.time_family in DATED_FAMILIES:
            file = e.file
            day = int(e.time // 86400)
            known = first.get(file)
            if known is None:
                first[file] = day
                counts[file] = 1
            elif file in several:
                several[file][day] += 1
            elif day == known:
                counts[file] += 1
            else:
                several[file] = Counter({known: counts[file], day: 1})
    year_of_day: dict[int, int] = {}
    by_file: dict[str, int] = {}
    overall: Counter[int] = Counter()
    for file, day in first.items():
        spread = several.get(file, {day: counts[file]})
        years: Counter[int] = Counter()
        for one, count in spread.items():
            if one not in year_of_day:
                year_of_day[one] = _year_of(one * 86400.0)
            years[year_of_day[one]] += count
        by_file[file] = years.most_common(1)[0][0]
        overall.update(years)
    return by_file, overall


def _moved(e: Event, year: int, shifts: dict[tuple[int, int], float | None]) -> Event:
    """The event with its time in `year`: the same shift for every time of a day, or the line read again around
    29 February (a guessed year without it may have read that day as 1 March)."""
    assert e.time is not None
    day = int(e.time // 86400)
    if (day, year) not in shifts:
        moved = in_year(day * 86400.0, year)
        shifts[(day, year)] = None if moved is None else moved - day * 86400.0
    shift = shifts[(day, year)]
    whole = e.time // 1
    found = (whole + shift + (e.time - whole),) if shift is not None else parse_time(e.text, year)
    return evolve(e, time=found[0]) if found else e


def _year_of(seconds: float) -> int:
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).year
