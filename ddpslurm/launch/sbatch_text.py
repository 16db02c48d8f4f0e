"""The sbatch script of a `LaunchPlan` in submitit's own format, without submitit. Pure.

`submit --dry-run` renders through submitit when it is installed (`ddpslurm.launch.submit.render_sbatch`);
a login node or laptop without it (`pip install ddpslurm`, no `[launch]` extra) still gets the script
from here. tests/unit/test_sbatch_text.py holds the two renderings equal, plan by plan, so a submitit
release that changes its format fails there, not in a user's dry run.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.launch.plan import PREEMPT_SIGNAL_NAME, LaunchPlan

#: executor parameters that are not `#SBATCH` options (submitit's `nonslurm` list, as far as ddpslurm uses it)
_NOT_DIRECTIVES = frozenset({"signal_delay_s", "srun_args", "additional_parameters", "setup", "teardown"})
#: submitit's defaults for the options ddpslurm may leave unset
_SUBMITIT_DEFAULTS: dict[str, Any] = {"job_name": "submitit", "time": 5, "nodes": 1, "wckey": "submitit"}


def _flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def render(plan: LaunchPlan, python: str) -> str:
    """The script submitit's SlurmExecutor would write for `plan`, its ranks run by `python` (shell-quoted)."""
    params = {**_SUBMITIT_DEFAULTS, **plan.executor_params}
    folder = Path(plan.folder).expanduser().absolute()
    stdout, stderr = str(folder / jobfolder.SUBMITIT_STDOUT), str(folder / jobfolder.SUBMITIT_STDERR)
    options = {k: v for k, v in params.items() if v is not None and k not in _NOT_DIRECTIVES}
    options["signal"] = f"{PREEMPT_SIGNAL_NAME}@{params.get('signal_delay_s', 90)}"
    options.update({"output": stdout.replace("%t", "0"), "error": stderr.replace("%t", "0"), "open-mode": "append"})
    options.update(params.get("additional_parameters") or {})
    lines = ["#!/bin/bash", "", "# Parameters", *(_flag(k, options[k]) for k in sorted(options))]
    if params.get("setup") is not None:
        lines += ["", "# setup", *params["setup"]]
    srun = shlex.join(["srun", "--unbuffered", "--output", stdout, "--error", stderr, *params.get("srun_args", [])])
    command = " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(folder))])
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", f"{srun} {command}", ""]
    return "\n".join(lines)
