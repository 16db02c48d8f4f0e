"""`JobSpec`: what the person asked for, validated. Pure: no Slurm, no submitit, no torch.

`make_spec(...)` turns raw flag values into a frozen `JobSpec` or raises a one-line `UsageError` /
`SubmitError` that says what to change.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpslurm.errors import SubmitError, UsageError
from ddpslurm.jobfolder import DEFAULT_ROOT
from ddpslurm.sbatch_values import check_sbatch_value, parse_sbatch_args, parse_time

LAUNCHERS = ("srun", "torchrun")
#: the launcher that restarts workers in place and runs with a range of nodes
ELASTIC_LAUNCHER = "torchrun"
_NODE_RANGE = re.compile(r"\s*(\d+)\s*[:-]\s*(\d+)\s*")
DEFAULT_SIGNAL_DELAY_S = 90
DEFAULT_MAX_REQUEUES = 3
DEFAULT_TIME = "60"
#: sbatch(1): "the signal may be sent up to 60 seconds earlier than specified".
SIGNAL_RESOLUTION_S = 60
#: --hang-timeout below this is refused: progress is sampled once a second and the stacks take seconds.
MIN_HANG_TIMEOUT_S = 10

_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")


def signal_delay_fix(signal_delay_s: int, time_s: int) -> str:
    """The way out of a --signal-delay that does not fit in --time (only the possible ones)."""
    minimum_minutes = -(-(signal_delay_s + SIGNAL_RESOLUTION_S + 1) // 60)
    raise_time = f"raise --time to {minimum_minutes} (minutes) or more"
    largest_delay = time_s - SIGNAL_RESOLUTION_S - 1
    if largest_delay < 1:
        return raise_time.capitalize()
    return f"Use --signal-delay {largest_delay} or less, or {raise_time}"


@dataclass(frozen=True)
class JobSpec:
    """A validated submission request. `script` is absolute; times are in seconds."""

    script: Path
    script_args: tuple[str, ...] = ()
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_s: int = 3600
    constraint: str | None = None
    exclude: str | None = None
    nodelist: str | None = None
    sbatch_args: tuple[tuple[str, str], ...] = ()
    launcher: str = "srun"
    folder: Path = field(default_factory=lambda: Path(DEFAULT_ROOT).absolute())
    max_requeues: int = DEFAULT_MAX_REQUEUES
    interface: str | None = None
    signal_delay_s: int = DEFAULT_SIGNAL_DELAY_S
    local: bool = False
    job_name: str = "ddpslurm"
    master_port: int | None = None  # None: derived from the job id on every node
    hang_timeout_s: int = 0  # 0: no hang monitor (see ddpslurm.launch.hang_monitor)
    preflight: bool = False  # the doctor's checks before the training step (ddpslurm.doctor.preflight)
    analyze: bool = True  # the post-mortem at a failed job's end (ddpslurm.postmortem.jobend); --no-analyze
    python: str = field(default_factory=lambda: sys.executable)  # the interpreter every rank runs
    max_restarts: int = 0  # torchrun's in-place restarts of all workers within one attempt (--max-restarts)
    min_nodes: int | None = None  # --nodes MIN:MAX: MIN (then `nodes` is MAX); None: a fixed node count

    @property
    def elastic(self) -> bool:
        """Whether the job runs on a range of nodes (`--nodes MIN:MAX`)."""
        return self.min_nodes is not None

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def time_min(self) -> int:
        """The time limit in whole minutes as sbatch gets it (rounded up)."""
        return -(-self.time_s // 60)


def _positive(name: str, value: int | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        least = 0 if allow_zero else 1
        raise UsageError(f"{name} {value} is invalid", f"Give an integer >= {least}")


def _check_hang_timeout(hang_timeout_s: int, local: bool) -> None:
    if hang_timeout_s == 0:
        return
    if hang_timeout_s < MIN_HANG_TIMEOUT_S:
        raise UsageError(f"--hang-timeout {hang_timeout_s} is too short",
                         f"Give {MIN_HANG_TIMEOUT_S} seconds or more (longer than any stretch without a collective), "
                         "or 0 for no hang monitor")
    if local:
        raise UsageError("--hang-timeout needs Slurm: the batch step watches the ranks",
                         "Drop --local, or drop --hang-timeout")


def check_script(script: str | os.PathLike[str]) -> Path:
    """The script as an absolute path; raise a `SubmitError` when it is missing or unreadable."""
    path = Path(script).expanduser().absolute()
    if not path.exists():
        raise SubmitError(f"script {str(script)!r} does not exist", "Check the path (relative to the current folder)")
    if not path.is_file():
        raise SubmitError(f"script {str(script)!r} is not a file", "Give the Python file that trains, e.g. train.py")
    if not os.access(path, os.R_OK):
        raise SubmitError(f"script {str(script)!r} is not readable", f"Run `chmod a+r {path}`")
    return path


def python_path(python: str | None) -> str:
    """--python as an absolute path (a bare name is looked up on PATH); sys.executable when not given.
    Symbolic links are kept: a virtual environment's `bin/python` is one."""
    if python is None:
        return sys.executable
    if not python or not python.isprintable():
        raise UsageError(f"--python {python!r} is not a usable path", "Give the interpreter's path on one line")
    if os.sep not in python:
        found = shutil.which(python)
        if found is None:
            raise SubmitError(f"--python {python!r} is not on PATH",
                              "Give the interpreter's path, e.g. --python ~/venv/bin/python")
        python = found
    return os.path.abspath(os.path.expanduser(python))


def parse_nodes(value: int | str) -> tuple[int | None, int]:
    """--nodes as (MIN or None, MAX): `4` -> (None, 4); `2:4` (or sbatch's `2-4`) -> (2, 4). Pure."""
    if isinstance(value, int):
        return None, value
    text = str(value).strip()
    if text.isdigit():
        return None, int(text)
    found = _NODE_RANGE.fullmatch(text)
    if not found:
        raise UsageError(f"--nodes {text!r} is neither a node count nor a range MIN:MAX",
                         "Give a count such as 4, or a range such as 2:4")
    low, high = int(found[1]), int(found[2])
    if not 1 <= low <= high:
        raise UsageError(f"--nodes {text!r} is not a range of at least one node",
                         "Give MIN:MAX with 1 <= MIN <= MAX, e.g. 2:4")
    return (low, high) if low < high else (None, high)


def _elastic_launcher(launcher: str | None, *, max_restarts: int, min_nodes: int | None, local: bool) -> str:
    """The launcher: torchrun when --max-restarts > 0 or --nodes MIN:MAX asks for it (an explicit `--launcher srun`
    with either is refused), else the one given (default srun)."""
    _positive("--max-restarts", max_restarts, allow_zero=True)
    wants = [flag for flag, on in (("--max-restarts", max_restarts > 0), ("--nodes MIN:MAX", min_nodes is not None))
             if on]
    if not wants:
        return launcher or "srun"
    asked, need = " and ".join(wants), "need" if len(wants) > 1 else "needs"
    if local:
        raise UsageError(f"{asked} {need} torchrun on Slurm and cannot run with --local",
                         f"Drop --local, or drop {asked}")
    if launcher not in (None, ELASTIC_LAUNCHER):
        raise UsageError(f"{asked} {need} --launcher {ELASTIC_LAUNCHER}: srun neither restarts a failed "
                         "rank in place nor runs on a range of nodes",
                         f"Use --launcher {ELASTIC_LAUNCHER} (or leave --launcher out)")
    return ELASTIC_LAUNCHER


def _check_numbers(*, nodes: int, tasks_per_node: int | None, gpus_per_node: int | None,
                   cpus_per_task: int | None, max_requeues: int, signal_delay_s: int, master_port: int | None) -> None:
    """The integer flags: counts at least 1 (0 allowed where it means none), a port in 1024..65535."""
    _positive("--nodes", nodes)
    _positive("--tasks-per-node", tasks_per_node)
    _positive("--gpus-per-node", gpus_per_node, allow_zero=True)
    _positive("--cpus-per-task", cpus_per_task)
    _positive("--max-requeues", max_requeues, allow_zero=True)
    _positive("--signal-delay", signal_delay_s)
    if master_port is not None and not 1024 <= master_port <= 65535:
        raise UsageError(f"--master-port {master_port} is not a port between 1024 and 65535",
                         "Give a free port such as 29500, or leave it out to derive one from the job id")


def _check_names(launcher: str, sbatch_options: Iterable[tuple[str, str | None]], interface: str | None) -> None:
    """The text flags: a known launcher, values fit for an `#SBATCH` line, a network interface name."""
    if launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {launcher!r} is unknown", f"Use one of: {', '.join(LAUNCHERS)}")
    for option, value in sbatch_options:
        if value is not None:
            check_sbatch_value(option, value, UsageError)
    if interface is not None and not _IFNAME.fullmatch(interface):
        raise UsageError(f"--interface {interface!r} is not a network interface name",
                         "Give a name such as `eth0` or `ib0` (see `ip -o link`)")


def _time_limit_s(time: str, signal_delay_s: int) -> int:
    """--time in seconds, refused when the preemption signal (--signal-delay before the end) would come too early."""
    time_s = parse_time(time)
    if signal_delay_s + SIGNAL_RESOLUTION_S >= time_s:
        raise UsageError(
            f"--signal-delay {signal_delay_s}s leaves no time in a --time {time} ({time_s}s) job: Slurm may send "
            f"the signal up to {SIGNAL_RESOLUTION_S}s earlier than asked, i.e. before the script starts",
            signal_delay_fix(signal_delay_s, time_s))
    return time_s


def _check_modes(*, launcher: str, local: bool, preflight: bool, hang_timeout_s: int) -> None:
    """Flag combinations: --local refuses --preflight, --launcher torchrun and --hang-timeout; the hang timeout."""
    if preflight and local:
        raise UsageError("--preflight checks Slurm nodes and cannot run with --local", "Drop --preflight or --local")
    if local and launcher != "srun":
        raise UsageError("--local runs ranks as local processes and cannot use --launcher torchrun",
                         "Drop --launcher torchrun, or submit to Slurm without --local")
    _check_hang_timeout(hang_timeout_s, local)


def _jobs_root(folder: str | os.PathLike[str]) -> Path:
    """--folder as an absolute path, refused when it cannot go on the `#SBATCH --output=` line it becomes."""
    folder_path = Path(folder).expanduser().absolute()
    check_sbatch_value("folder", str(folder_path), UsageError, "--folder")
    return folder_path


def make_spec(
    script: str | os.PathLike[str],
    script_args: Sequence[str] = (),
    *,
    nodes: int | str = 1,
    tasks_per_node: int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_task: int | None = None,
    mem: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    time: str = DEFAULT_TIME,
    constraint: str | None = None,
    exclude: str | None = None,
    nodelist: str | None = None,
    sbatch_args: Iterable[str] = (),
    launcher: str | None = None,
    folder: str | os.PathLike[str] = DEFAULT_ROOT,
    max_requeues: int = DEFAULT_MAX_REQUEUES,
    interface: str | None = None,
    signal_delay_s: int = DEFAULT_SIGNAL_DELAY_S,
    local: bool = False,
    job_name: str = "ddpslurm",
    master_port: int | None = None,
    hang_timeout_s: int = 0,
    preflight: bool = False,
    python: str | None = None,
    analyze: bool = True,
    max_restarts: int = 0,
) -> JobSpec:
    """Validate raw flag values into a `JobSpec`. `tasks_per_node` defaults to `gpus_per_node`, else 1; `nodes` is a
    count or a range `MIN:MAX`; `launcher` None: srun, or torchrun where --max-restarts or a node range needs it."""
    min_nodes, nodes = parse_nodes(nodes)
    launcher = _elastic_launcher(launcher, max_restarts=max_restarts, min_nodes=min_nodes, local=local)
    _check_numbers(nodes=nodes, tasks_per_node=tasks_per_node, gpus_per_node=gpus_per_node,
                   cpus_per_task=cpus_per_task, max_requeues=max_requeues, signal_delay_s=signal_delay_s,
                   master_port=master_port)
    _check_names(launcher, (("mem", mem), ("partition", partition), ("account", account), ("qos", qos),
                            ("constraint", constraint), ("exclude", exclude), ("nodelist", nodelist),
                            ("job-name", job_name)), interface)
    time_s = _time_limit_s(time, signal_delay_s)
    _check_modes(launcher=launcher, local=local, preflight=preflight, hang_timeout_s=hang_timeout_s)
    if tasks_per_node is None:
        tasks_per_node = gpus_per_node if gpus_per_node else 1
    folder_path = _jobs_root(folder)
    return JobSpec(
        script=check_script(script), script_args=tuple(script_args), nodes=nodes, tasks_per_node=tasks_per_node,
        gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task, mem=mem, partition=partition, account=account,
        qos=qos, time_s=time_s, constraint=constraint, exclude=exclude, nodelist=nodelist,
        sbatch_args=parse_sbatch_args(sbatch_args),
        launcher=launcher, folder=folder_path, max_requeues=max_requeues,
        interface=interface, signal_delay_s=signal_delay_s, local=local, job_name=job_name,
        master_port=master_port, hang_timeout_s=hang_timeout_s, preflight=preflight, python=python_path(python),
        analyze=analyze, max_restarts=max_restarts, min_nodes=min_nodes,
    )
