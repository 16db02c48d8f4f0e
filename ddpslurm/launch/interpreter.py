"""`submit --python`: the interpreter the ranks will run, checked before the job waits in the queue.

Before submitting, `check_interpreter` runs it here (through `ddpslurm.scheduler.run`, with a timeout) and
refuses the job when it lacks a module the job needs; where it cannot run here (another architecture, a
file system too slow to answer), the batch step checks again before srun (`batch_check_lines`) and ends the
job with one line instead of a traceback per rank.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping

from ddpslurm.errors import SubmitError

#: What the job imports on every node: the script's torch, submitit's job runner, ddpslurm's worker.
NEEDED_MODULES = ("torch", "submitit", "ddpslurm")
#: Importing torch from a cold shared file system can take long; past this the batch step checks instead.
PROBE_TIMEOUT_S = 120
_MARK = "ddpslurm-probe:"
_PROBE = f"""
import importlib, sys
missing = []
for name in {NEEDED_MODULES!r}:
    try:
        importlib.import_module(name)
    except BaseException as error:
        missing.append(name + " (" + type(error).__name__ + ": " + str(error).splitlines()[0][:200] + ")")
print({_MARK!r}, "%d.%d" % sys.version_info[:2], "; ".join(missing))
"""
_FIX = ("Install them into it (`{python} -m pip install 'ddpslurm[launch,torch]'` brings torch, submitit and "
        "ddpslurm), or pass --python with one that has them")


def probe_argv(python: str) -> list[str]:
    """The command that asks `python` whether it imports what the job needs."""
    return [python, "-c", _PROBE]


def probe_env(environ: Mapping[str, str], package_parent: str | None) -> dict[str, str]:
    """The environment of the probe: the caller's, with this ddpslurm first on PYTHONPATH as in the job."""
    env = dict(environ)
    if package_parent:
        env["PYTHONPATH"] = package_parent + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def read_probe(python: str, stdout: str) -> tuple[str | None, str | None]:
    """(the Python version, what failed to import) from the probe's output (pure); (None, None) if absent."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith(_MARK)), None)
    if line is None:
        return None, None
    _, version, *rest = line.split(" ", 2)
    return version, (rest[0].strip() if rest else "") or None


def check_interpreter(python: str, *, package_parent: str | None, environ: Mapping[str, str] | None = None,
                      timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Raise a SubmitError when `python` cannot be the job's interpreter; return a warning when it could not
    be checked here (the batch step checks it again), else None."""
    from ddpslurm.scheduler.run import run_program

    if not os.path.isfile(python):
        raise SubmitError(f"--python {python!r} does not exist",
                          "Give the interpreter of the environment that has torch, e.g. --python ~/venv/bin/python")
    if not os.access(python, os.X_OK):
        raise SubmitError(f"--python {python!r} is not executable", f"Run `chmod +x {shlex.quote(python)}`")
    env = probe_env(os.environ if environ is None else environ, package_parent)
    try:
        done = run_program(probe_argv(python), timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"--python {python} did not answer within {timeout:g} s; the batch step checks it before srun"
    except OSError as error:
        return f"--python {python} cannot run here ({error.strerror}); the batch step checks it before srun"
    version, missing = read_probe(python, done.stdout)
    if version is None:
        last = next((ln.strip() for ln in reversed((done.stderr or "").splitlines()) if ln.strip()), "no output")
        raise SubmitError(f"--python {python} is not a working Python (exit {done.returncode}: {last})",
                          _FIX.format(python=shlex.quote(python)))
    if missing:
        raise SubmitError(f"--python {python} cannot import {missing}, which every rank needs",
                          _FIX.format(python=shlex.quote(python)))
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if version != here:
        return (f"--python {python} is Python {version}, this ddpslurm runs on {here}: the job is pickled here "
                "and unpickled there, which can fail across Python versions")
    return None


def batch_check_lines(python: str) -> list[str]:
    """sbatch lines that end the job with one line when `python` cannot import what the ranks need."""
    quoted = shlex.quote(python)
    code = shlex.quote("import " + ", ".join(NEEDED_MODULES))
    message = f"ddpslurm: error: {python} cannot import what every rank needs (@@). {_FIX.format(python=python)}"
    head, _, tail = message.partition("@@")
    return [
        "# The interpreter the ranks run must import torch, submitit and ddpslurm: one line here, not a traceback",
        "# per rank after srun started them all.",
        f"if ! ddpslurm_py=$({quoted} -c {code} 2>&1 >/dev/null); then",
        "  ddpslurm_py=${ddpslurm_py##*$'\\n'}  # its last line: the ImportError",
        f'  echo "{_dq(head)}$ddpslurm_py{_dq(tail)}" >&2',
        "  exit 1",
        "fi",
    ]


def _dq(text: str) -> str:
    """`text` as literal text inside a double-quoted shell string (pure)."""
    return text.translate(str.maketrans({"\\": "\\\\", '"': '\\"', "$": "\\$", "`": "\\`"}))
