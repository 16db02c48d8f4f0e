"""The one check for every value that reaches an `#SBATCH` line (`submit` and `template` share it).

`shlex.quote` does not protect a directive: sbatch reads `#SBATCH` lines itself (src/sbatch/opt.c,
`_get_argument`), splits them at white space, treats `"`, `'` and `\\` as quoting, starts a comment at an
unquoted `#`, and stops reading directives at the first line that is not one. So a value must be printable
ASCII without white space, quotes, backslashes or `#` (a newline would end the directive and put a shell
line into the script), and then match the syntax sbatch takes for its option. Digits are ASCII digits
(`[0-9]`, never `\\d`, which accepts `٦٤`), and every pattern must match the whole value (`fullmatch`:
`$` in `re.match` accepts a trailing newline). Pure; the checks raise the caller's error class.

`parse_time` and `parse_sbatch_args` read the `--time` and `--sbatch-arg` flags that `submit` and `doctor`
share, and raise a one-line `UsageError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ddpslurm.errors import EnvDerivationError, UsageError
from ddpslurm.jobfolder import DEFAULT_ROOT
from ddpslurm.scheduler.hostlist import expand_hostlist

#: what sbatch's directive reader takes as one plain token: printable ASCII but space, quotes, `\` and `#`
_TOKEN = re.compile(r"[!$-&(-\[\]-~]*", re.ASCII)
_NAME = r"[A-Za-z0-9_.-]+"
_HOSTS = r"[A-Za-z0-9_.\[\],/-]+"  # a hostlist (`node[01-04],gpu7`) or a file of host names
_DIGITS = r"[0-9]+"

#: option -> (the syntax sbatch takes, an example); an option not listed only has to be a plain token
SYNTAX: dict[str, tuple[str, str]] = {
    "partition": (rf"{_NAME}(?:,{_NAME})*", "gpu or gpu,cpu"),
    "account": (_NAME, "proj123"),
    "qos": (_NAME, "normal"),
    "reservation": (_NAME, "maint1"),
    "job-name": (r"[A-Za-z0-9_.+-]{1,128}", "ddp-train"),
    "mem": (rf"{_DIGITS}[KMGTkmgt]?", "64G"),
    "time": (rf"{_DIGITS}(?:-{_DIGITS})?(?::{_DIGITS}){{0,2}}", "04:00:00"),
    "constraint": (r"[A-Za-z0-9_.,&|*()\[\]!:=+-]+", "a100&ib"),
    "exclude": (_HOSTS, "node[03-04]"),
    "nodelist": (_HOSTS, "node[01-02]"),
    "array": (rf"{_DIGITS}(?:-{_DIGITS}(?::{_DIGITS})?)?(?:,{_DIGITS}(?:-{_DIGITS}(?::{_DIGITS})?)?)*(?:%{_DIGITS})?",
              "0-7%2"),
    "folder": (r"[A-Za-z0-9_.,:+=@~/-]+", f"/scratch/me/{DEFAULT_ROOT}"),
}

#: sbatch options ddpslurm sets itself: `--sbatch-arg` may not override them (flag to use instead).
RESERVED_SBATCH_KEYS: dict[str, str] = {
    "nodes": "--nodes", "ntasks-per-node": "--tasks-per-node", "ntasks": "--nodes/--tasks-per-node",
    "gpus-per-node": "--gpus-per-node", "cpus-per-task": "--cpus-per-task", "mem": "--mem",
    "partition": "--partition", "account": "--account", "qos": "--qos", "time": "--time",
    "constraint": "--constraint", "exclude": "--exclude", "nodelist": "--nodelist", "signal": "--signal-delay",
    "output": "--folder", "error": "--folder", "open-mode": "--folder", "job-name": "--job-name",
    "requeue": "--max-requeues", "no-requeue": "--max-requeues 0",
}

# Slurm --time (sbatch(1)): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, ASCII digits, the whole value. The leading
# field is unbounded; the ones after it are clock fields: hours 0-23 after a day, minutes and seconds 0-59.
_TIME_FORMS = (
    (re.compile(r"([0-9]+)"), ("m",)),
    (re.compile(r"([0-9]+):([0-9]+)"), ("m", "s")),
    (re.compile(r"([0-9]+):([0-9]+):([0-9]+)"), ("h", "m", "s")),
    (re.compile(r"([0-9]+)-([0-9]+)"), ("d", "h")),
    (re.compile(r"([0-9]+)-([0-9]+):([0-9]+)"), ("d", "h", "m")),
    (re.compile(r"([0-9]+)-([0-9]+):([0-9]+):([0-9]+)"), ("d", "h", "m", "s")),
)
_FIELD_MAX = {"h": 23, "m": 59, "s": 59}
_FIELD_NAME = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_TIME_FIX = ("Use minutes (`30`), minutes:seconds (`30:00`), hours:minutes:seconds (`2:00:00`), days-hours (`1-12`), "
             "days-hours:minutes (`1-12:00`) or days-hours:minutes:seconds (`1-12:00:00`)")
_TOKEN_FIX = ("Use letters, digits and the punctuation sbatch expects for this option; nothing reaches the job "
              "script unchecked")
_HINTS = {"time": _TIME_FIX, "exclude": "Give a Slurm hostlist such as `node[01-04,07]` (closed brackets, "
                                         "ranges low-high), or a file of host names (a path with `/`)"}
_HINTS["nodelist"] = _HINTS["exclude"]
#: host lists sbatch reads for --exclude/--nodelist; a value with `/` is a file of host names
HOSTLIST_OPTIONS = ("exclude", "nodelist")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]*")


def sbatch_value_problem(option: str, value: str) -> str | None:
    """Why `value` cannot go on an `#SBATCH --<option>=` line, or None when it can."""
    if not isinstance(value, str):
        return f"must be text, got {type(value).__name__}"
    bad = next((ch for ch in value if not _TOKEN.fullmatch(ch)), None)
    if bad is not None:
        what = "a line break" if bad in "\n\r\x0b\x0c\x85\u2028\u2029" else "white space" if bad.isspace() \
            else "a control character" if not bad.isprintable() else "a non-ASCII character" if not bad.isascii() \
            else f"the character {bad!r}"
        return f"contains {what}, which sbatch would not read as part of the value"
    syntax = SYNTAX.get(option)
    if syntax is not None and not re.fullmatch(syntax[0], value, re.ASCII):
        return f"is not a valid sbatch --{option} (for example: {syntax[1]})"
    if option in HOSTLIST_OPTIONS:
        return hostlist_problem(value)
    if option == "time":
        return time_problem(value)[1]
    return None


def check_sbatch_value(option: str, value: str, error: type[Exception], flag: str | None = None) -> str:
    """`value` when it can go on an `#SBATCH` line, else `error` with one line naming the flag and the fix."""
    problem = sbatch_value_problem(option, value)
    if problem is None:
        return value
    shown = ascii(value) if len(value) <= 80 else ascii(value[:77]) + "..."
    raise error(f"{flag or '--' + option} {shown} {problem}", _HINTS.get(option, _TOKEN_FIX))


def time_problem(text: str) -> tuple[int, str | None]:
    """(seconds, None) for a Slurm time limit, else (0, why it is not one). Pure."""
    value = text.strip(" ")  # spaces from quoting are harmless; a newline or a tab is not
    if value.lower() in ("infinite", "unlimited"):
        return 0, "asks for no time limit, and ddpslurm times the preemption signal from the limit"
    for pattern, units in _TIME_FORMS:
        match = pattern.fullmatch(value)
        if not match:
            continue
        fields = [(int(num), unit) for num, unit in zip(match.groups(), units, strict=True)]
        for position, (number, unit) in enumerate(fields):
            if position and number > _FIELD_MAX[unit]:
                return 0, (f"has {number} {_FIELD_NAME[unit]} where at most {_FIELD_MAX[unit]} fit "
                           "(only the first field is unbounded)")
        seconds = sum(number * _UNIT_S[unit] for number, unit in fields)
        return (seconds, None) if seconds > 0 else (0, "is zero, which Slurm reads as no time limit")
    return 0, "is not a Slurm time limit"


def parse_time(text: str, error: type[Exception] = UsageError, flag: str = "--time") -> int:
    """Slurm `--time` text -> seconds (`90` -> 5400, `1:30:00` -> 5400, `2-00:00` -> 172800), else `error`
    with one line. Exactly sbatch's six forms, each field after the first within its clock range."""
    seconds, problem = time_problem(text)
    if problem is not None:
        raise error(f"{flag} {text!r} {problem}", _TIME_FIX)
    return seconds


def hostlist_problem(value: str) -> str | None:
    """Why `value` is no hostlist sbatch can read (`node[01-` lacks its `]`), or None. A value with `/` is a file."""
    if "/" in value:
        return None
    try:
        expand_hostlist(value)
    except EnvDerivationError as bad:
        return "is not a valid hostlist: " + bad.message.split(": ", 1)[-1]
    return None


def parse_sbatch_args(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`["mail-type=END", "exclusive="]` -> (("mail-type", "END"), ("exclusive", "")). Empty value = bare flag."""
    out: list[tuple[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-").replace("_", "-")
        if not sep:
            raise UsageError(f"--sbatch-arg {item!r} has no '='",
                             "Write KEY=VALUE (`--sbatch-arg mail-type=END`), or KEY= for a bare flag")
        if not _SBATCH_KEY.fullmatch(key):
            raise UsageError(f"--sbatch-arg {item!r}: {key!r} is not an sbatch option name",
                             "Write the long option without dashes, e.g. `--sbatch-arg reservation=myres`")
        if key in RESERVED_SBATCH_KEYS:
            raise UsageError(f"--sbatch-arg {item!r} sets an option ddpslurm controls",
                             f"Use {RESERVED_SBATCH_KEYS[key]} instead")
        out.append((key, check_sbatch_value(key, value, UsageError, f"--sbatch-arg {key}")))
    return tuple(out)
