"""`ddpslurm lint` as one library call: lint the scripts, print in the asked format, return the exit status."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ddpslurm.errors import UsageError
from ddpslurm.lint import render
from ddpslurm.lint.engine import lint_paths

FORMATS = ("text", "json", "sarif")
#: exit status when a finding of level error remains (0: none, 2: usage error, through UsageError)
EXIT_FINDINGS = 1


def _print(text: str, nl: bool = True) -> None:
    print(text, end="\n" if nl else "")


def run_lint(scripts: Sequence[str], *, output: str = "text", ignore: Sequence[str] = (),
             roots: Sequence[str] = (), echo: Callable[..., None] = _print) -> int:
    """Lint every script; 1 when an error-level finding remains, else 0."""
    if output not in FORMATS:
        raise UsageError(f"--format {output!r} is unknown", f"Use one of: {', '.join(FORMATS)}")
    if not scripts:
        raise UsageError("no script given", "Give the training script, e.g. `ddpslurm lint train.py`")
    ignored = [part.strip() for item in ignore for part in item.split(",") if part.strip()]
    reports = lint_paths(scripts, ignored, roots)
    writer = {"text": render.text, "json": render.as_json, "sarif": render.sarif}[output]
    echo(writer(reports), nl=False)
    return EXIT_FINDINGS if any(report.has_errors for report in reports) else 0
