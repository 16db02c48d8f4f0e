"""Findings as text for a person, JSON for scripts, SARIF 2.1.0 for code-scanning tools.

Every piece of file text (paths, code snippets in messages) goes through ddpslurm.sanitize: a script's content
never drives the terminal, and JSON stays valid UTF-8.
"""

from __future__ import annotations

import os
import textwrap
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpslurm._version import __version__
from ddpslurm.lint.engine import LintReport
from ddpslurm.lint.model import ERROR, INFO, LEVEL_WORDS, LEVELS, SARIF_LEVELS, WARN, Finding
from ddpslurm.lint.rules import RULES
from ddpslurm.sanitize import json_dumps, terminal

SCHEMA_VERSION = 1
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_WRAP = 96


def shown_path(path: Path, cwd: Path | None = None) -> str:
    """`path` relative to the current folder when it lies below it, else as given."""
    base = cwd or Path.cwd()
    try:
        return os.fspath(path.absolute().relative_to(base.absolute()))
    except ValueError:
        return os.fspath(path)


def unique_findings(reports: Sequence[LintReport]) -> list[Finding]:
    """The findings of all reports, each once (a module two scripts import is read twice)."""
    seen: set[tuple[str, Path, int, int]] = set()
    out = []
    for report in reports:
        for finding in report.findings:
            key = (finding.rule, finding.path.absolute(), finding.line, finding.column)
            if key not in seen:
                seen.add(key)
                out.append(finding)
    return out


def one_line(finding: Finding, cwd: Path | None = None) -> str:
    """`file:line:col: level ID message`, terminal-safe."""
    return terminal(f"{shown_path(finding.path, cwd)}:{finding.line}:{finding.column}: "
                    f"{LEVEL_WORDS[finding.level]} {finding.rule} {finding.message}")


def counts_text(findings: Sequence[Finding]) -> str:
    """`1 error, 2 warnings`: the levels that occur."""
    counted = Counter(f.level for f in findings)
    parts = [(counted[ERROR], "error"), (counted[WARN], "warning"), (counted[INFO], "info")]
    return ", ".join(f"{n} {word}{'s' if n != 1 and word != 'info' else ''}" for n, word in parts if n)


def text(reports: Sequence[LintReport], cwd: Path | None = None) -> str:
    """Each finding, with the why and the fix under the first one of its rule, then one summary line."""
    findings = unique_findings(reports)
    lines = []
    explained: set[str] = set()
    for finding in findings:
        lines.append(one_line(finding, cwd))
        if finding.rule in explained:
            continue
        explained.add(finding.rule)
        for label, body in (("why", finding.why), ("fix", finding.fix)):
            lines.extend(textwrap.wrap(terminal(body), _WRAP, initial_indent=f"    {label}: ",
                                       subsequent_indent="         "))
    files = len({p.absolute() for r in reports for p in r.files})
    suppressed = sum(r.suppressed for r in reports)
    skipped = sum(r.skipped_modules for r in reports)
    scripts = ", ".join(terminal(shown_path(r.script, cwd)) for r in reports)
    noted = (f"; {suppressed} suppressed" if suppressed else "") + (
        f"; {skipped} more local modules not read" if skipped else "")
    if findings:
        lines.append(f"{counts_text(findings)} in {scripts} ({files} file{'s' if files != 1 else ''} read{noted})")
    else:
        lines.append(f"no findings in {scripts} ({files} file{'s' if files != 1 else ''} read{noted})")
    return "\n".join(lines) + "\n"


def as_json(reports: Sequence[LintReport], cwd: Path | None = None) -> str:
    findings = unique_findings(reports)
    counted = Counter(f.level for f in findings)
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "scripts": [shown_path(r.script, cwd) for r in reports],
        "files_read": sorted({shown_path(p, cwd) for r in reports for p in r.files}),
        "findings": [f.as_dict(shown_path(f.path, cwd)) for f in findings],
        "counts": {level: counted[level] for level in LEVELS},
        "suppressed": sum(r.suppressed for r in reports),
    }
    return json_dumps(document) + "\n"


def _uri(path: Path, cwd: Path | None) -> str:
    shown = shown_path(path, cwd)
    if Path(shown).is_absolute():
        return path.absolute().as_uri()
    return urllib.parse.quote(Path(shown).as_posix())


def sarif(reports: Sequence[LintReport], cwd: Path | None = None) -> str:
    """One SARIF 2.1.0 run: the rules as tool.driver.rules, each finding as a result with its location."""
    index = {rule.id: number for number, rule in enumerate(RULES)}
    rules = [{"id": rule.id, "name": rule.name, "shortDescription": {"text": rule.message},
              "fullDescription": {"text": rule.why}, "help": {"text": rule.fix},
              "defaultConfiguration": {"level": SARIF_LEVELS[rule.level]}} for rule in RULES]
    results = [{
        "ruleId": f.rule, "ruleIndex": index[f.rule], "level": SARIF_LEVELS[f.level],
        "message": {"text": f.message},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(f.path, cwd)},
                                            "region": {"startLine": f.line, "startColumn": f.column}}}],
    } for f in unique_findings(reports)]
    document = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [{
        "tool": {"driver": {"name": "ddpslurm lint", "version": __version__, "rules": rules}},
        "columnKind": "unicodeCodePoints", "results": results}]}
    return json_dumps(document) + "\n"


def rules_table() -> str:
    """`--list-rules`: id, level, name and message of every rule."""
    return "".join(f"{r.id}  {LEVEL_WORDS[r.level]:<7}  {r.name:<26}  {r.message}\n" for r in RULES)
