"""InfiniBand work-completion statuses and what each says about a resubmission: `analyzer/ib_status.toml` in,
`IbStatuses` out.

In: the shipped `ib_status.toml` beside the signature folder and a site folder's own (a `[reads]` table naming the
signatures whose events carry a status and the field holding it; `[[status]]` tables: code, name, text and,
optionally, summary, retry, exclude_node, advice, cause_advice). Out: `IbStatuses`, whose `of(event)` gives the
entry of the status an event of those signatures carries (a number, libibverbs' enum name or its text). A bad file
is an `AnalyzeInputError` naming the file and the entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field as _field
from pathlib import Path
from typing import Any

from ddpslurm.analyze.model import RETRY, Event
from ddpslurm.errors import AnalyzeInputError

#: the file of these entries beside the shipped signature folder, or in a site's signature folder
IB_STATUS_FILE = "ib_status.toml"
_STATUS_KEYS = {"code", "name", "text", "description", "summary", "retry", "exclude_node", "advice", "cause_advice"}
_READS_KEYS = {"field", "signatures"}


@dataclass(frozen=True)
class IbStatus:
    """One completion status: its number, names, and what it declares over the signature's and cause's defaults."""

    code: int
    name: str
    text: str
    summary: str | None = None
    retry: str | None = None
    exclude_node: bool | None = None
    advice: tuple[str, ...] = ()
    cause_advice: bool = True

    def values(self) -> dict[str, str]:
        """The template fields an entry gives a summary or advice line."""
        return {"status": str(self.code), "status_name": self.name, "status_text": self.text}


@dataclass(frozen=True)
class IbStatuses:
    """The status table and the signatures whose events it reads."""

    field: str = "status"
    signatures: frozenset[str] = frozenset()
    by_code: dict[int, IbStatus] = _field(default_factory=dict)

    def lookup(self, value: str | None) -> IbStatus | None:
        """The entry for a status as a log gives it: `4`, `IBV_WC_LOC_PROT_ERR`, `local protection error`."""
        if value is None:
            return None
        said = value.strip()
        if said.isdigit():
            return self.by_code.get(int(said))
        folded = said.casefold()
        return next((s for s in self.by_code.values() if folded in (s.name.casefold(), s.text.casefold())), None)

    def of(self, event: Event | None) -> IbStatus | None:
        """The entry of the status `event` carries, when a signature this table reads produced it."""
        if event is None or event.signature not in self.signatures:
            return None
        return self.lookup(event.get(self.field))

    def extended(self, other: IbStatuses) -> IbStatuses:
        """These entries and a later folder's (the same code: the later entry replaces it; its signatures join)."""
        return IbStatuses(field=other.field if other.signatures else self.field,
                          signatures=self.signatures | other.signatures, by_code={**self.by_code, **other.by_code})


def _fail(path: Path, entry: str, what: str) -> AnalyzeInputError:
    return AnalyzeInputError(f"{entry} in {path}: {what}",
                             "fix that entry (the schema is at the top of analyzer/ib_status.toml)")


def _status(raw: Any, path: Path) -> IbStatus:
    if not isinstance(raw, dict):
        raise _fail(path, "a [[status]] entry", "must be a table")
    code = raw.get("code")
    if not isinstance(code, int) or isinstance(code, bool) or code < 0:
        raise _fail(path, f"[[status]] {code!r}", "`code` must be a whole number >= 0")
    where = f"[[status]] {code}"
    unknown = set(raw) - _STATUS_KEYS
    if unknown:
        raise _fail(path, where, f"unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("name", "text"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise _fail(path, where, f"`{key}` must be a non-empty string")
    for key in ("summary", "description"):
        if key in raw and not isinstance(raw[key], str):
            raise _fail(path, where, f"`{key}` must be a string")
    retry = raw.get("retry")
    if retry is not None and retry not in RETRY:
        raise _fail(path, where, f"`retry` must be one of {', '.join(RETRY)}")
    for key in ("exclude_node", "cause_advice"):
        if key in raw and not isinstance(raw[key], bool):
            raise _fail(path, where, f"`{key}` must be true or false")
    advice = raw.get("advice", [])
    if not isinstance(advice, list) or not all(isinstance(a, str) and a for a in advice):
        raise _fail(path, where, "`advice` must be a list of strings")
    return IbStatus(code=code, name=raw["name"].strip(), text=raw["text"].strip(), summary=raw.get("summary"),
                    retry=retry, exclude_node=raw.get("exclude_node"), advice=tuple(advice),
                    cause_advice=raw.get("cause_advice", True))


def parse_ib_statuses(data: dict[str, Any], path: Path) -> IbStatuses:
    """The entries of one file, validated: known keys, one entry per code, name and text."""
    unknown = set(data) - {"reads", "status"}
    if unknown:
        raise AnalyzeInputError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}",
                                "an ib_status.toml holds a [reads] table and [[status]] tables only")
    reads = data.get("reads", {})
    if not isinstance(reads, dict) or set(reads) - _READS_KEYS:
        raise _fail(path, "[reads]", "holds `field` and `signatures` only")
    field_name = reads.get("field", "status")
    sig_ids = reads.get("signatures", [])
    if not isinstance(field_name, str) or not field_name.isidentifier():
        raise _fail(path, "[reads]", "`field` must name a pattern's group")
    if not isinstance(sig_ids, list) or not all(isinstance(s, str) and s for s in sig_ids):
        raise _fail(path, "[reads]", "`signatures` must be a list of signature ids")
    rows = data.get("status", [])
    if not isinstance(rows, list):
        raise AnalyzeInputError(f"{path}: status must be a list of [[status]] tables", "fix the file")
    by_code: dict[int, IbStatus] = {}
    names: set[str] = set()
    for raw in rows:
        entry = _status(raw, path)
        folded = {entry.name.casefold(), entry.text.casefold()}
        if entry.code in by_code or folded & names:
            raise _fail(path, f"[[status]] {entry.code}", "a code, name or text is used twice")
        by_code[entry.code] = entry
        names |= folded
    return IbStatuses(field=field_name, signatures=frozenset(sig_ids), by_code=by_code)


def check_reads(statuses: IbStatuses, patterns: dict[str, str], sources: Iterable[Path]) -> None:
    """Every signature the table reads exists and its pattern captures the field (`patterns`: id -> pattern)."""
    where = ", ".join(str(p) for p in sources) or IB_STATUS_FILE
    for sig_id in sorted(statuses.signatures):
        if sig_id not in patterns:
            raise AnalyzeInputError(f"{where}: [reads] names unknown signature {sig_id!r}",
                                    "name a signature id of the signature folders")
        if f"(?P<{statuses.field}>" not in patterns[sig_id]:
            raise AnalyzeInputError(f"{where}: signature {sig_id!r} captures no `{statuses.field}` group",
                                    "capture the status in its pattern, or drop it from [reads]")
