"""The one-line diagnosis as Slurm's accounting holds it (the job's Comment / AdminComment), and back. Pure.

Written `ddpslurm: cause=cuda_oom rank=3 node=gpu07 confidence=high where=/path/job_123`: words of
`key=value`, `where` last (a path may hold blanks). Slurm limits what a job's Comment may hold: slurmctld
refuses a Comment over 1024 characters (`scontrol update` says "Pathname of a file, directory or other
parameter too long"; checked on Slurm 22.05), and slurmdbd turns quotes into backquotes. `sacct
--parsable2` separates fields with `|`. So the line holds none of `|`, quotes, backslashes or control
characters, and a user's own comment is kept in front of it (`user words; ddpslurm: ...`), never overwritten.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MARK = "ddpslurm:"
#: slurmctld's limit for a job's Comment (job_mgr.c `_test_strlen(comment, 1024)`; `scontrol update` refuses more).
COMMENT_LIMIT = 1024
#: Between a user's own comment and ddpslurm's line.
SEPARATOR = "; "
#: The keys, in the order they are written; `where` is last and takes the rest of the line.
KEYS = ("cause", "rank", "node", "confidence", "where")
_UNSAFE = re.compile(r"[|\"'`\\\x00-\x1f\x7f-\x9f]")
_WORD = re.compile(r"[^A-Za-z0-9_.:/+@\[\],-]")
_PAIR = re.compile(r"(cause|rank|node|confidence)=(\S*)")


def clean(text: object, limit: int = 200) -> str:
    """`text` as one safe line for a Slurm comment: no `|`, quotes, backslashes or control characters."""
    return _UNSAFE.sub(" ", str(text))[:limit].strip()


def _word(value: object) -> str:
    return _WORD.sub("_", str(value))[:120] if value not in (None, "") else "-"


def diagnosis_line(diagnosis: Mapping[str, Any], where: str = "") -> str:
    """`ddpslurm: cause=... rank=... node=... confidence=... where=...` from an `analyze --json` object."""
    rank = diagnosis.get("first_failing_rank")
    words = [MARK, f"cause={_word(diagnosis.get('cause') or 'unknown')}",
             f"rank={rank if isinstance(rank, int) and not isinstance(rank, bool) else '-'}",
             f"node={_word(diagnosis.get('first_failing_host'))}",
             f"confidence={_word(diagnosis.get('confidence'))}"]
    where = clean(where, 100_000)
    if where:  # a long path keeps its end: the job's own folder or file name
        words.append(f"where={where if len(where) <= 600 else '...' + where[-597:]}")
    return " ".join(words)


def own_part(comment: str) -> tuple[str, str]:
    """(the user's part, ddpslurm's line) of a Comment; either may be empty."""
    at = comment.find(MARK)
    if at < 0:
        return comment.strip(), ""
    user = comment[:at].rstrip()
    if user.endswith(SEPARATOR.strip()):
        user = user[: -len(SEPARATOR.strip())].rstrip()
    return user, comment[at:].strip()


def merge_comment(existing: str | None, line: str, limit: int = COMMENT_LIMIT) -> str | None:
    """The Comment to set: the user's own comment kept in front, ddpslurm's earlier line (an earlier attempt)
    replaced, `where=` shortened to fit `limit`; None when even the shortest line does not fit beside the
    user's comment (the user's words are never cut)."""
    user, _ = own_part(existing or "")
    prefix = f"{user}{SEPARATOR}" if user else ""
    if len(prefix) + len(line) <= limit:
        return prefix + line
    head = line.split(" where=", 1)[0]
    room = limit - len(prefix) - len(head) - len(" where=...")
    if " where=" in line and room >= 16:
        return f"{prefix}{head} where=...{line.split(' where=', 1)[1][-room:]}"
    return prefix + head if len(prefix) + len(head) <= limit else None


def parse_line(comment: str | None) -> dict[str, str | int | None] | None:
    """ddpslurm's line read back from a Comment (None when it holds none): cause, rank, node, confidence, where."""
    _, line = own_part(comment or "")
    if not line:
        return None
    body, _, where = line[len(MARK):].partition(" where=")
    found: dict[str, str | int | None] = {key: None for key in KEYS}
    for key, value in _PAIR.findall(body):
        found[key] = None if value in ("", "-") else value
    rank = found["rank"]
    found["rank"] = int(rank) if isinstance(rank, str) and rank.isdigit() else None
    found["where"] = where.strip() or None
    return found if found["cause"] else None
