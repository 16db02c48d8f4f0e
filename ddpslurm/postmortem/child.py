"""`python -m ddpslurm.postmortem.child --out DIR PATH...`: analyze PATHs, write DIR/diagnosis.json and .md.

Run as a subprocess by `analysis.run_analysis`, so that a time budget can end it whatever it is doing and its
memory goes back when it exits. Exit 0: both files written; 1: the input could not be analyzed (one line on
stderr); 2: usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ddpslurm.jobfolder import DIAGNOSIS_JSON, DIAGNOSIS_MD

__all__ = ["DIAGNOSIS_JSON", "DIAGNOSIS_MD", "main", "write_atomic"]


def write_atomic(path: Path, text: str) -> None:
    """Write `text` so that a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpslurm.postmortem.child", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for diagnosis.json and diagnosis.md")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1: the job's end is no "
                                                            "time to take a node's cores)")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    from ddpslurm.analyze.api import analyze_paths
    from ddpslurm.analyze.report.text import to_json, to_markdown
    from ddpslurm.errors import DdpSlurmError
    from ddpslurm.sanitize import terminal

    try:
        diagnosis = analyze_paths(args.paths, workers=args.jobs)
    except DdpSlurmError as error:
        print(terminal(f"ddpslurm post-mortem: {error.one_line()}"), file=sys.stderr)
        return 1
    out = Path(args.out)
    write_atomic(out / DIAGNOSIS_MD, to_markdown(diagnosis))
    write_atomic(out / DIAGNOSIS_JSON, to_json(diagnosis) + "\n")  # last: its presence means both are there
    return 0


if __name__ == "__main__":
    sys.exit(main())
