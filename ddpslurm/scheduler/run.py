"""The one place in ddpslurm that runs Slurm commands (and any other program) as subprocesses.

Everything else builds argv lists (pure, `commands.py`) and parses text (pure, `parse.py`). `run()`
never sets SLURM_CONF or any other variable: a real site's login node needs none, and the caller's
environment (or `env`) is passed through as is.
"""

from __future__ import annotations

import os
import shutil
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


#: Where Slurm clients find their configuration without asking DNS: the packaged defaults, and the caches
#: that slurmd and sackd keep on configless sites.
CONFIG_FILES = (
    "/etc/slurm/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
    "/usr/local/etc/slurm.conf",
    "/run/slurm/conf/slurm.conf",
    "/var/spool/slurmd/conf-cache/slurm.conf",
)
#: Set to 1 on a configless site whose clients really should find slurmctld through DNS SRV records.
CONFIGLESS_ENV = "DDPSLURM_SLURM_CONFIGLESS"


def configuration_error(environ: Mapping[str, str]) -> SlurmNotFoundError | None:
    """Why Slurm's clients would have no configuration here, or None.

    Without SLURM_CONF and without a slurm.conf file, every Slurm client looks the controller up in DNS
    (SRV records) and fails with "Unknown host" after the round trip; ddpslurm says so instead.
    """
    conf = environ.get("SLURM_CONF")
    if conf:
        if os.path.isfile(conf):
            return None
        return SlurmNotFoundError(f"SLURM_CONF={conf} does not exist", "Point SLURM_CONF at the cluster's slurm.conf")
    if environ.get(CONFIGLESS_ENV) == "1" or any(os.path.isfile(path) for path in CONFIG_FILES):
        return None
    return SlurmNotFoundError(
        "Slurm is not configured on this machine: SLURM_CONF is unset and there is no /etc/slurm/slurm.conf",
        "Set SLURM_CONF to the cluster's slurm.conf (the local cluster: eval \"$(slurm/cluster env)\"), "
        f"set {CONFIGLESS_ENV}=1 on a configless site, or try ddpslurm without Slurm: `ddpslurm submit --local`",
    )


def require_slurm(binary: str, environ: Mapping[str, str]) -> None:
    """Raise the one-line error when `binary` is not on PATH or Slurm has no configuration here.

    For commands ddpslurm runs itself (`run`) and for the sbatch that submitit runs on its behalf.
    """
    if shutil.which(binary, path=environ.get("PATH")) is None:
        raise not_found_error(binary)
    config_problem = configuration_error(environ)
    if config_problem is not None:
        raise config_problem


def run(
    argv: Sequence[str],
    *,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command and capture its text output.

    Raises SlurmNotFoundError when the binary is missing or Slurm has no configuration (it would ask DNS),
    SlurmCommandError when it exits non-zero
    (only with `check=True`) or runs longer than `timeout` seconds.
    """
    args = [str(a) for a in argv]
    if not args:
        raise ValueError("run() needs a command")
    require_slurm(args[0], os.environ if env is None else env)
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


def run_program(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a program that is not a Slurm command (the interpreter a job will run, asked what it imports; the
    site's mail program, the message on its stdin) and capture its text output; the exit status is the
    caller's to read.

    Raises OSError when it cannot be started, subprocess.TimeoutExpired after `timeout` seconds.
    """
    args = [str(a) for a in argv]
    if not args:
        raise ValueError("run_program() needs a command")
    stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **stdin,
                          env=dict(env) if env is not None else None, check=False)


def start(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start a Slurm command (srun in the batch step) that inherits this process's stdio; the caller waits.

    Raises SlurmNotFoundError like `run()`.
    """
    args = [str(a) for a in argv]
    if not args:
        raise ValueError("start() needs a command")
    require_slurm(args[0], os.environ)
    try:
        return subprocess.Popen(args)
    except FileNotFoundError:
        raise not_found_error(args[0]) from None


def spawn_detached(argv: Sequence[str], *, log_path: str | None = None, env: Mapping[str, str] | None = None) -> int:
    """Start a program in a session of its own, its output appended to `log_path` (else discarded), no stdin and
    no inherited descriptors, and return its pid without waiting: a hook that must not block its caller
    (slurmctld waits for EpilogSlurmctld) hands its work to it. Raises OSError when it cannot be started."""
    args = [str(a) for a in argv]
    if not args:
        raise ValueError("spawn_detached() needs a command")
    out = open(log_path, "ab") if log_path else open(os.devnull, "wb")  # noqa: SIM115 - handed to the child
    try:
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True, env=dict(env) if env is not None else None)
    finally:
        out.close()
    return child.pid
