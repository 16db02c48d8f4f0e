"""The linter's vocabulary: levels, a rule (data plus its matcher), a hit (what a matcher found), a finding."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddpslurm.lint.project import Project
    from ddpslurm.lint.source import Module

ERROR, WARN, INFO = "error", "warn", "info"
LEVELS = (ERROR, WARN, INFO)
#: how a level reads in text output and in SARIF
LEVEL_WORDS = {ERROR: "error", WARN: "warning", INFO: "info"}
SARIF_LEVELS = {ERROR: "error", WARN: "warning", INFO: "note"}
RANK_OF_LEVEL = {ERROR: 0, WARN: 1, INFO: 2}


@dataclass(frozen=True)
class Hit:
    """One place a matcher found: the module, the node, what to say there and, rarely, another level."""

    module: Module
    node: ast.AST
    message: str
    level: str | None = None


Matcher = Callable[["Project"], Iterator[Hit]]


@dataclass(frozen=True)
class Rule:
    """A check: its id, default level, one-line message, why it breaks under DDP on Slurm, the fix, the matcher."""

    id: str
    name: str
    level: str
    message: str
    why: str
    fix: str
    check: Matcher


@dataclass(frozen=True)
class Finding:
    """A hit turned into a report line: rule, level, file, 1-based line and column, message."""

    rule: str
    level: str
    path: Path
    line: int
    column: int
    message: str
    why: str
    fix: str
    end_line: int | None = None

    def sort_key(self) -> tuple[str, int, int, str]:
        return (str(self.path), self.line, self.column, self.rule)

    def as_dict(self, path_text: str) -> dict[str, object]:
        return {"rule": self.rule, "level": self.level, "file": path_text, "line": self.line,
                "column": self.column, "message": self.message, "why": self.why, "fix": self.fix}
