"""The one check for every value that reaches an `#SBATCH` line (`submit` and `template` share it).

`shlex.quote` does not protect a directive: sbatch reads `#SBATCH` lines itself (src/sbatch/opt.c,
`_get_argument`), splits them at white space, treats `"`, `'` and `\\` as quoting, starts a comment at an
unquoted `#`, and stops reading directives at the first line that is not one. So a value must be printable
ASCII without white space, quotes, backslashes or `#` (a newline would end the directive and put a shell
line into the script), and then match the syntax sbatch takes for its option. Digits are ASCII digits
(`[0-9]`, never `\\d`, which accepts `٦٤`), and every pattern must match the whole value (`fullmatch`:
`$` in `re.match` accepts a trailing newline). Pure; the callers raise their own error class.
"""

from __future__ import annotations

import re

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
    "folder": (r"[A-Za-z0-9_.,:+=@~/-]+", "/scratch/me/ddpslurm_jobs"),
}


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
    return None


def check_sbatch_value(option: str, value: str, error: type[Exception], flag: str | None = None) -> str:
    """`value` when it can go on an `#SBATCH` line, else `error` with one line naming the flag and the fix."""
    problem = sbatch_value_problem(option, value)
    if problem is None:
        return value
    shown = ascii(value) if len(value) <= 80 else ascii(value[:77]) + "..."
    raise error(f"{flag or '--' + option} {shown} {problem}",
                "Use letters, digits and the punctuation sbatch expects for this option; nothing reaches the "
                "job script unchecked")
