"""The result of an analysis as plain dataclasses, and its JSON form (DESIGN.md's `--json` schema)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Evidence:
    """One log line that supports the diagnosis."""

    file: str
    line: int
    rank: int | None
    time: str | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "rank": self.rank, "time": self.time, "text": self.text}


@dataclass(frozen=True)
class RankRow:
    """One rank of the per-rank table."""

    rank: int
    host: str | None
    role: str  # culprit | victim | ok | unknown
    first_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "role": self.role, "first_error": self.first_error}


@dataclass(frozen=True)
class TimelineRow:
    """One rank on the job's time axis (for the HTML report): its first failure and its last sign of life."""

    rank: int
    host: str | None
    role: str  # culprit | victim | ok | unknown
    first_failure_time: float | None
    first_failure_text: str | None
    last_time: float | None
    exit_status: str | None


@dataclass
class Diagnosis:
    """What went wrong, who failed first, how sure, and what to do."""

    cause: str
    first_failing_rank: int | None
    first_failing_host: str | None
    confidence: str
    summary: str
    advice: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    ranks: list[RankRow] = field(default_factory=list)
    retry: str = "unknown"
    exclude_nodes: list[str] = field(default_factory=list)
    #: paths not read (or not wholly), each {"path", "reason"}: nothing is left out silently
    skipped: list[dict[str, str]] = field(default_factory=list)
    #: not part of the JSON schema: notes for the text report (files skipped, times missing, sacct view)
    notes: list[str] = field(default_factory=list)
    accounting: dict[str, Any] | None = None
    #: not part of the JSON schema: per-rank times and Slurm's job-level events, for the HTML timeline
    timeline: list[TimelineRow] = field(default_factory=list)
    job_events: list[Evidence] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the `--json` object of DESIGN.md."""
        return {
            "cause": self.cause,
            "first_failing_rank": self.first_failing_rank,
            "first_failing_host": self.first_failing_host,
            "confidence": self.confidence,
            "summary": self.summary,
            "advice": list(self.advice),
            "evidence": [e.to_dict() for e in self.evidence],
            "ranks": [r.to_dict() for r in self.ranks],
            "retry": self.retry,
            "exclude_nodes": list(self.exclude_nodes),
            "skipped": [dict(s) for s in self.skipped],
        }
