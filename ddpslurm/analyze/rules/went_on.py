"""What a process prints when it went on after an exception it logged: `analyzer/went_on.toml` in, `WentOn` out.

In: the shipped `went_on.toml` beside the signature folder and a site folder's own (`[[went_on]]` and `[[never]]`
tables: id, description, pattern). Out: `WentOn`, whose `says(text)` names the rule a line's text (after its
prefixes) matches, unless a `never` rule matches it. A bad file is an `AnalyzeInputError` naming the file and id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpslurm.errors import AnalyzeInputError

#: the file of these rules in a signature folder's parent (shipped) or in a site's signature folder
WENT_ON_FILE = "went_on.toml"
_TABLES = ("went_on", "never")
_AGENT_TABLE = "agent_survives"
_KEYS = {"id", "description", "pattern"}
_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True)
class WentOn:
    """The rules that say a line shows its process went on, and those that never do."""

    rules: tuple[tuple[str, re.Pattern[str]], ...] = ()
    never: tuple[tuple[str, re.Pattern[str]], ...] = ()
    #: signatures whose lines an agent (no rank of its own) survives when its workers speak after them
    agent_survives: frozenset[str] = frozenset()

    def says(self, text: str) -> str | None:
        """The id of the first rule `text` matches, None when none does or a `never` rule matches it."""
        for rule_id, pattern in self.rules:
            if pattern.search(text):
                return None if any(p.search(text) for _id, p in self.never) else rule_id
        return None

    def extended(self, other: WentOn) -> WentOn:
        """These rules and a later folder's (same id: the later one replaces it)."""
        def merged(mine: tuple, theirs: tuple) -> tuple:
            ids = {rule_id for rule_id, _p in theirs}
            return tuple(r for r in mine if r[0] not in ids) + theirs

        return WentOn(merged(self.rules, other.rules), merged(self.never, other.never),
                      self.agent_survives | other.agent_survives)


def _rule(raw: Any, path: Path, table: str) -> tuple[str, re.Pattern[str]]:
    rule_id = raw.get("id") if isinstance(raw, dict) else None
    if not isinstance(rule_id, str) or not _ID.match(rule_id):
        raise _fail(path, str(rule_id), "`id` must be a kebab-case string")
    unknown = set(raw) - _KEYS
    if unknown:
        raise _fail(path, rule_id, f"unknown key(s) {', '.join(sorted(unknown))}")
    pattern = raw.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise _fail(path, rule_id, "`pattern` must be a non-empty string")
    try:
        return rule_id, re.compile(pattern)
    except re.error as error:
        raise _fail(path, rule_id, f"bad pattern in [[{table}]]: {error}") from None


def _fail(path: Path, rule_id: str, what: str) -> AnalyzeInputError:
    return AnalyzeInputError(f"rule {rule_id!r} in {path}: {what}",
                             "fix that entry (the schema is at the top of analyzer/went_on.toml)")


def parse_went_on(data: dict[str, Any], path: Path) -> WentOn:
    """The rules of one file's tables, validated."""
    unknown = set(data) - {*_TABLES, _AGENT_TABLE}
    if unknown:
        raise AnalyzeInputError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}",
                                "a went_on.toml holds [[went_on]], [[never]] and [[agent_survives]] tables only")
    parts = []
    for table in _TABLES:
        rows = data.get(table, [])
        if not isinstance(rows, list):
            raise AnalyzeInputError(f"{path}: {table} must be a list of [[{table}]] tables", "fix the file")
        parts.append(tuple(_rule(raw, path, table) for raw in rows))
    ids = [rule_id for part in parts for rule_id, _p in part]
    if len(ids) != len(set(ids)):
        raise AnalyzeInputError(f"{path}: a rule id is used twice", "give each rule an id of its own")
    return WentOn(*parts, agent_survives=_agent_survives(data.get(_AGENT_TABLE, []), path))


def _agent_survives(rows: Any, path: Path) -> frozenset[str]:
    """The signature ids of the `[[agent_survives]]` tables (checked against the signatures when the set is built)."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(r) <= {"signature", "description"}
                                             and isinstance(r.get("signature"), str) for r in rows):
        raise AnalyzeInputError(f"{path}: each [[agent_survives]] table needs a `signature` id (and a description)",
                                "fix the file")
    return frozenset(r["signature"] for r in rows)
