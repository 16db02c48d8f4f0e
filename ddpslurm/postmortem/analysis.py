"""The analysis of a finished job within a time budget: `ddpslurm.postmortem.child` as a subprocess.

A subprocess, not a call: the budget ends it wherever it is (a file system that stops answering included),
and the memory a large job's analysis takes goes back when it exits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpslurm.postmortem.child import DIAGNOSIS_JSON
from ddpslurm.scheduler.run import run_program

#: Seconds the analysis may take at a job's end unless told otherwise.
DEFAULT_BUDGET_S = 120.0


@dataclass
class Outcome:
    """What the analysis gave: the `analyze --json` object, or why there is none."""

    diagnosis: dict[str, Any] | None
    why_not: str = ""
    notes: list[str] = field(default_factory=list)


def run_analysis(paths: Sequence[str | Path], out_dir: Path, budget_s: float = DEFAULT_BUDGET_S,
                 python: str = sys.executable) -> Outcome:
    """Analyze `paths` into `out_dir`/diagnosis.json and .md in at most `budget_s` seconds. Never raises."""
    if budget_s < 1:
        return Outcome(None, f"no time left for the analysis ({budget_s:.0f}s)")
    argv = [python, "-m", "ddpslurm.postmortem.child", "--out", str(out_dir), *map(str, paths)]
    try:
        done = run_program(argv, timeout=budget_s)
    except subprocess.TimeoutExpired:
        return Outcome(None, f"the analysis ran past its budget of {budget_s:g}s and was stopped")
    except OSError as error:
        return Outcome(None, f"cannot run {python}: {error.strerror or error}")
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        return Outcome(None, last[-1][:300] if last else f"the analysis exited {done.returncode}")
    try:
        found = json.loads((out_dir / DIAGNOSIS_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return Outcome(None, f"cannot read {DIAGNOSIS_JSON}: {error}")
    return Outcome(found if isinstance(found, dict) else None, "" if isinstance(found, dict) else "not an object")
