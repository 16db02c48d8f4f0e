"""The one place in ddpslurm that runs Slurm commands as subprocesses.

Everything else builds argv lists (pure, `commands.py`) and parses text (pure, `parse.py`). `run()`
never sets SLURM_CONF or any other variable: a real site's login node needs none, and the caller's
environment (or `env`) is passed through as is.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from ddpslurm.errors import SlurmCommandError, SlurmNotFoundError

#: Exit status reported in a SlurmCommandError when the command ran past its timeout (as `timeout(1)`).
TIMEOUT_EXIT = 124


def not_found_error(binary: str) -> SlurmNotFoundError:
    """The one-line error for a Slurm binary that is not on PATH."""
    return SlurmNotFoundError(
        f"{binary} not found on PATH (is Slurm installed?)",
        "On a login node `module load slurm`; to try ddpslurm without Slurm use `ddpslurm submit --local`",
    )


def run(
    argv: Sequence[str],
    *,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command and capture its text output.

    Raises SlurmNotFoundError when the binary is missing, SlurmCommandError when it exits non-zero
    (only with `check=True`) or runs longer than `timeout` seconds.
    """
    args = [str(a) for a in argv]
    if not args:
        raise ValueError("run() needs a command")
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, input=input,
            env=dict(env) if env is not None else None, check=False,
        )
    except FileNotFoundError:
        raise not_found_error(args[0]) from None
    except PermissionError as error:
        raise SlurmCommandError(args, 126, f"cannot execute {args[0]}: {error.strerror}",
                                "Check the Slurm installation on this machine") from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(
            args, TIMEOUT_EXIT, f"no answer after {timeout:g} s",
            "slurmctld or slurmdbd may be down or overloaded; try again later or ask your admins",
        ) from None
    if check and done.returncode != 0:
        raise SlurmCommandError(args, done.returncode, done.stderr or done.stdout,
                                f"The full command was: {' '.join(args)}")
    return done
