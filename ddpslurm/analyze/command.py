"""What `ddpslurm analyze` does between parsing its options and exiting (kept out of cli.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ddpslurm.analyze.read.streams import STDIN
from ddpslurm.errors import UsageError


def resolve_inputs(args: Sequence[str], folders: Sequence[str]) -> tuple[list[Path], str | None]:
    """PATHs as given; an all-digit argument that is not a path is a job id -> its job folder."""
    from ddpslurm.analyze.api import find_job_folder

    paths: list[Path] = []
    job_id = None
    for arg in args:
        if arg.isdigit() and not os.path.exists(arg):
            job_id = arg
            paths.append(find_job_folder(arg, folders))
        else:
            paths.append(Path(arg))
    return paths, job_id


def output_format(as_json: bool, fmt: str | None, width: int | None) -> str:
    """The report format `--json` and `--format` ask for (text when neither); asking for two is a usage error, and
    so is `--width` with a format that is not wrapped."""
    if as_json and fmt not in (None, "json"):
        raise UsageError(f"--json and --format {fmt} ask for two formats", "give one of them")
    output = "json" if as_json else fmt or "text"
    if width is not None and output != "text":
        raise UsageError(f"--width applies to the text report, not to --format {output}", "leave --width out")
    return output


def run_analyze(inputs: Sequence[str], *, output: str, signature_dirs: Sequence[str], attempt: str | None,
                jobs: int | None, folders: Sequence[str], echo, html_file: str | None = None,
                width: int | None = None, restart: str | None = None) -> int:
    """Analyze and print in `output` format (text | markdown | json) at `width` columns (text), and the HTML
    report to `html_file`; `attempt`, `restart`: which run of a requeued or restarted job (default: the last)."""
    from ddpslurm.analyze.api import add_accounting, analyze_paths
    from ddpslurm.analyze.report.text import json_pieces, render_text, to_markdown

    if attempt is not None and attempt not in ("all", "last") and not attempt.isdigit():
        raise UsageError(f"--attempt {attempt!r} is not a number", "use --attempt N, --attempt last or --attempt all")
    if restart is not None and restart not in ("all", "last") and not restart.isdigit():
        raise UsageError(f"--restart {restart!r} is not a number", "use --restart K, --restart last or --restart all")
    if jobs is not None and jobs < 1:
        raise UsageError("--jobs must be at least 1", "use --jobs 1 for a single process")
    paths, job_id = resolve_inputs(inputs, folders)
    if STDIN in inputs and sys.stdin.isatty():
        echo("ddpslurm: reading a log from standard input: paste it, then press Ctrl-D", err=True)
    diagnosis = analyze_paths(paths, workers=jobs, progress=output == "text" and sys.stderr.isatty(),
                              signature_dirs=signature_dirs, attempt=attempt, restart=restart)
    if job_id is not None:
        add_accounting(diagnosis, job_id)
    if html_file:
        from ddpslurm.analyze.report.html import write_html

        write_html(diagnosis, html_file)
    if output == "json":
        for piece in json_pieces(diagnosis):
            echo(piece, nl=False)
        echo("")
    elif output == "markdown":
        echo(to_markdown(diagnosis), nl=False)
    else:
        render_text(diagnosis, width=width)
    return 0

