"""Timestamps in every common log form, normalized to float seconds since the epoch (UTC assumed).

Each parse returns `(seconds, family)`. Families with a known zone (`iso-tz`, `record`, `epoch`) compare
with each other; naive families (`iso`, `glog`, `ctime`, `syslog`) are the nodes' local time and compare
with each other only, since their zone is unknown. glog (`E0217 08:19:10.679000`) carries no year: the caller
passes one (from a ddpslurm record or the file's mtime).
"""

from __future__ import annotations

import calendar
import datetime as _dt
import functools

import regex

_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                       "Nov", "Dec"), start=1)}

_ISO = regex.compile(
    r"(?<!\d)(?P<y>(?:19|20)\d\d)-(?P<mo>[01]\d)-(?P<d>[0-3]\d)[T _](?P<h>[0-2]\d):(?P<mi>[0-5]\d):(?P<s>[0-6]\d)"
    r"(?:[.,](?P<frac>\d{1,9}))?(?: ?(?P<tz>Z|[+-][01]\d:?[0-5]\d))?(?!\d)"
)
_GLOG = regex.compile(
    r"(?<![\w])[IWEF](?P<mo>1[0-2]|0?[1-9])(?P<d>[0-3]\d) (?P<h>[0-2]\d):(?P<mi>[0-5]\d):(?P<s>[0-6]\d)"
    r"(?:\.(?P<frac>\d{1,9}))?"
)
_CTIME = regex.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) "
    r"(?P<h>[0-2]\d):(?P<mi>[0-5]\d):(?P<s>[0-6]\d)(?:\.(?P<frac>\d{1,9}))?(?: [A-Z]{3,4})? (?P<y>(?:19|20)\d\d)"
)
_SYSLOG = regex.compile(
    r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) "
    r"(?P<h>[0-2]\d):(?P<mi>[0-5]\d):(?P<s>[0-6]\d)\b"
)


_DIGIT = regex.compile(r"\d")
#: the `hh:mm:ss` every form above holds: a line without it is passed over at once (an NCCL INFO `Trees` line would
#: otherwise cost the four searches); a shortcut only, the answers are those of the searches without it
CLOCK = regex.compile(r"\d:[0-5]\d:[0-6]\d")
_MONTH_NAMES = "(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
#: each form up to its clock with every digit any digit (`19|20`, `[0-5]` read as `\d`): where one finds nothing
#: in a line's shape (its digits masked, digit_shape), the form finds nothing in any line of that shape, and where it
#: first finds something, no line of the shape holds the form earlier
_FORMS_ANY_DIGIT = (
    regex.compile(r"(?<!\d)\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d"),
    regex.compile(r"(?<![\w])[IWEF]\d{3,4} \d\d:\d\d:\d\d"),
    regex.compile(rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) {_MONTH_NAMES} +\d{{1,2}} \d\d:\d\d:\d\d"),
    regex.compile(rf"^{_MONTH_NAMES} +\d{{1,2}} \d\d:\d\d:\d\d"),
)
#: where the time of the lines of one shape is looked for: the first form that may hold it and the offset from which
#: (`time_plan`); None: they hold none
TimePlan = tuple[int, int] | None
#: the plan of a line whose shape is not known: every form, from its start
EVERY_FORM: TimePlan = (0, 0)


def time_plan(shape: str) -> TimePlan:
    """Where lines of this shape (digits masked) hold the time `parse_time` reads, if any: the first of its forms
    that may match, and where it may first match (a line recipe keeps it: its lines are then searched for that
    form from there only, `parse_planned`)."""
    if not _DIGIT.search(shape, 0, 200):
        return None
    for form, pattern in enumerate(_FORMS_ANY_DIGIT):
        m = pattern.search(shape)
        if m:
            return form, m.start()
    return None


def _frac(text: str | None) -> float:
    return float("0." + text) if text else 0.0


def epoch(y: int, mo: int, d: int, h: int, mi: int, s: int) -> float | None:
    """`calendar.timegm` of these values (the day, hour and minute not checked, as it does), None where it refuses
    the year or month; a month's first day is looked up once (every timed line of a job asks for a few months)."""
    days = _month_start(y, mo)
    return None if days is None else float((((days + d - 1) * 24 + h) * 60 + mi) * 60 + min(s, 59))


@functools.lru_cache(maxsize=4096)
def _month_start(y: int, mo: int) -> int | None:
    """Days from 1970-01-01 to the first day of month `mo` of year `y`; None for no such month."""
    try:
        return calendar.timegm((y, mo, 1, 0, 0, 0, 0, 0, 0)) // 86400
    except (ValueError, OverflowError):
        return None


def _tz_offset(tz: str | None) -> float:
    if not tz or tz == "Z":
        return 0.0
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    return sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)


def parse_time(text: str, year: int | None = None) -> tuple[float, str] | None:
    """The first timestamp found in `text` as (epoch seconds, family), or None.

    `year` fills in formats without one (glog, syslog); without it those use the current year.
    """
    if not _DIGIT.search(text, 0, 200) or not CLOCK.search(text):
        return None
    for read in _READERS:
        found = read(text, 0, year)
        if found is not None:
            return found
    return None


def parse_planned(text: str, plan: TimePlan, year: int | None = None) -> tuple[float, str] | None:
    """`parse_time(text, year)` for a line whose shape has this `time_plan`: the planned form only, from the planned
    offset, where it reads a time there (no earlier form, and no earlier place, can); else the full search."""
    if plan is None:
        return None
    if plan == EVERY_FORM:
        return parse_time(text, year)
    form, start = plan
    return _READERS[form](text, start, year) or parse_time(text, year)


def _read_iso(text: str, start: int, year: int | None) -> tuple[float, str] | None:
    m = _ISO.search(text, start)
    if m:
        y, mo, d, h, mi, sec, frac, tz = m.groups()
        base = epoch(int(y), int(mo), int(d), int(h), int(mi), int(sec))
        if base is not None:
            return base + _frac(frac) - _tz_offset(tz), "iso-tz" if tz else "iso"
    return None


def _read_glog(text: str, start: int, year: int | None) -> tuple[float, str] | None:
    m = _GLOG.search(text, start)
    if m:
        mo, d, h, mi, sec, frac = m.groups()
        base = epoch(_year(year), int(mo), int(d), int(h), int(mi), int(sec))
        if base is not None:
            return base + _frac(frac), "glog"
    return None


def _read_ctime(text: str, start: int, year: int | None) -> tuple[float, str] | None:
    m = _CTIME.search(text, start)
    if m:
        mon, d, h, mi, sec, frac, y = m.groups()
        base = epoch(int(y), _MONTHS[mon], int(d), int(h), int(mi), int(sec))
        if base is not None:
            return base + _frac(frac), "ctime"
    return None


def _read_syslog(text: str, start: int, year: int | None) -> tuple[float, str] | None:
    m = _SYSLOG.search(text, start)
    if m:
        mon, d, h, mi, sec = m.groups()
        base = epoch(_year(year), _MONTHS[mon], int(d), int(h), int(mi), int(sec))
        if base is not None:
            return base, "syslog"
    return None


#: the forms in the order `parse_time` tries them (the order of _FORMS_ANY_DIGIT)
_READERS = (_read_iso, _read_glog, _read_ctime, _read_syslog)


def _year(year: int | None) -> int:
    """The year a year-less form is read in: the caller's, else this one."""
    return year or _dt.datetime.now(_dt.timezone.utc).year


def in_year(seconds: float, year: int) -> float | None:
    """The same month, day and time of day as `seconds` (a year-less time read with a guessed year) in `year`;
    None around 29 February (a guessed year without it may have read that day as 1 March): read the line again."""
    try:
        moment = _dt.datetime.fromtimestamp(int(seconds // 1), _dt.timezone.utc)
        if (moment.month, moment.day) in ((2, 29), (3, 1)):
            return None
        moment = moment.replace(year=year)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.timestamp() + (seconds - seconds // 1)


def parse_record_time(value: object) -> float | None:
    """A `unix` float or an ISO string from a JSON record, as epoch seconds (UTC)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if regex.fullmatch(r"\d{9,11}(?:\.\d+)?", text):
            return float(text)
        found = parse_time(text.replace("_", "T", 1) if regex.match(r"\d{4}-\d\d-\d\d_", text) else text)
        if found:
            return found[0]
    return None


_ZONED = {"iso-tz", "record", "epoch"}


def comparable(family_a: str | None, family_b: str | None) -> bool:
    """Whether two times can be ordered: both zoned (UTC), or both naive (the nodes' local time)."""
    if family_a is None or family_b is None:
        return False
    return (family_a in _ZONED) == (family_b in _ZONED)


def format_time(seconds: float | None) -> str | None:
    """ISO 8601 UTC with milliseconds, for reports."""
    if seconds is None:
        return None
    try:
        moment = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
