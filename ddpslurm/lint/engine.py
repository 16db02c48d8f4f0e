"""Lint one script: read it (and its local imports), run every rule, drop suppressed hits, sort the findings."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpslurm.errors import UsageError
from ddpslurm.lint.model import ERROR, Finding, Hit, Rule
from ddpslurm.lint.project import Project, SourceError, load_project, read_source
from ddpslurm.lint.rules import BY_ID, RULES, SYNTAX_RULE
from ddpslurm.lint.source import Module

_PYTHON_SUFFIXES = (".py", ".pyw")


@dataclass
class LintReport:
    """What linting one script found, and what it read."""

    script: Path
    findings: list[Finding] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    skipped_modules: int = 0
    suppressed: int = 0

    @property
    def has_errors(self) -> bool:
        return any(f.level == ERROR for f in self.findings)


def read_script(script: str | Path) -> tuple[Path, str]:
    """The script's path and text; a UsageError (one line) when it is missing, a folder or not Python."""
    path = Path(script).expanduser()
    shown = str(script)
    if not path.exists():
        raise UsageError(f"{shown!r} does not exist", "Give the path of the training script")
    if path.is_dir():
        raise UsageError(f"{shown!r} is a folder", "Give the training script itself, e.g. train.py")
    try:
        text = read_source(path)
    except SourceError as failed:
        raise UsageError(f"{shown!r} {failed}", "Give the Python file that trains") from None
    first = text.split("\n", 1)[0]
    if path.suffix.lower() not in _PYTHON_SUFFIXES and not (first.startswith("#!") and "python" in first):
        raise UsageError(f"{shown!r} is not a Python script (no .py suffix, no python #! line)",
                         "Give the Python file that trains; an sbatch script runs one, lint that one")
    return path, text


def _column(module: Module, node: ast.AST) -> int:
    """1-based column in characters (the AST counts UTF-8 bytes)."""
    line = module.lines[node.lineno - 1] if 0 < node.lineno <= len(module.lines) else ""
    return len(line.encode("utf-8")[: node.col_offset].decode("utf-8", errors="ignore")) + 1


def _finding(rule: Rule, hit: Hit) -> Finding:
    node = hit.node
    return Finding(rule=rule.id, level=hit.level or rule.level, path=hit.module.path, line=node.lineno,
                   column=_column(hit.module, node), message=hit.message, why=rule.why, fix=rule.fix,
                   end_line=getattr(node, "end_lineno", None))


def _script_only(module: Module, node: ast.AST) -> bool:
    for child, parent in module.ancestors(node):
        if (isinstance(parent, ast.If) and child is not parent.test and isinstance(parent.test, ast.Compare)
                and isinstance(parent.test.left, ast.Name) and parent.test.left.id == "__name__"):
            return True
    return False


def _run(rule: Rule, project: Project) -> list[Hit]:
    try:
        return list(rule.check(project))
    except RecursionError:  # a pathologically nested file: this rule says nothing about it
        return []


def lint_script(script: str | Path, ignore: Iterable[str] = (), roots: Iterable[Path] = ()) -> LintReport:
    """Every finding of every rule (but `ignore`) in the script and the modules it imports from its folder
    (and from `roots`, folders searched after it, as PYTHONPATH would be)."""
    path, text = read_script(script)
    skip = {i.upper() for i in ignore}
    project = load_project(path, text, roots)
    report = LintReport(script=path, files=[m.path for m in project.modules], skipped_modules=project.skipped)
    syntax = BY_ID[SYNTAX_RULE]
    for broken in project.broken:
        if SYNTAX_RULE not in skip:
            report.findings.append(Finding(SYNTAX_RULE, ERROR, broken.path, broken.line, broken.column,
                                           f"does not parse: {broken.message}", syntax.why, syntax.fix))
    order = {m.path: index for index, m in enumerate(project.modules)}
    entry = project.modules[0] if project.modules else None
    seen: set[tuple[str, Path, int, int]] = set()
    for rule in RULES:
        if rule.id in skip or rule.id == SYNTAX_RULE:
            continue
        for hit in _run(rule, project):
            if hit.module is not entry and _script_only(hit.module, hit.node):
                continue  # `if __name__ == "__main__":` of an imported module: never runs in the job
            finding = _finding(rule, hit)
            key = (finding.rule, finding.path, finding.line, finding.column)
            if key in seen:
                continue
            seen.add(key)
            lines = (finding.line, finding.end_line or finding.line)
            if hit.module.suppressed(rule.id, lines):
                report.suppressed += 1
                continue
            report.findings.append(finding)
    report.findings.sort(key=lambda f: (order.get(f.path, len(order)), f.line, f.column, f.rule))
    return report


def lint_paths(scripts: Sequence[str | Path], ignore: Iterable[str] = (), roots: Sequence[str | Path] = ()
               ) -> list[LintReport]:
    """`lint_script` for each script; unknown ids in `ignore` and `roots` that are no folders are a UsageError."""
    ignore = list(ignore)
    unknown = sorted({i.upper() for i in ignore} - set(BY_ID))
    if unknown:
        raise UsageError(f"unknown rule id {', '.join(unknown)}", "`ddpslurm lint --list-rules` lists them")
    folders = [Path(r).expanduser() for r in roots]
    for folder, given in zip(folders, roots, strict=True):
        if not folder.is_dir():
            raise UsageError(f"--path {str(given)!r} is not a folder", "Give a folder your script imports from")
    return [lint_script(script, ignore, folders) for script in scripts]
