"""`plan(spec) -> LaunchPlan`: everything a submission will do, decided before anything runs. Pure.

The plan holds the submitit executor parameters (which become the sbatch options), the srun
arguments, the environment every rank gets, and the `WorkerConfig` that the worker receives on every
task. `--dry-run` prints it; `submit.py` executes it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpslurm import jobfolder
from ddpslurm.launch.interpreter import batch_check_lines
from ddpslurm.launch.spec import JobSpec

PREEMPT_SIGNAL_NAME = "USR2"
#: No `srun --wait`: a failing task ends the step at once through --kill-on-bad-exit, and a rank that
#: returns 0 early (rank 0 still saving or evaluating) must not get the others killed after N seconds.
#: The batch step requeues this many seconds before the time limit at the latest (its grace after the
#: signal is `--signal-delay` minus this), so the requeue happens while Slurm still runs the job.
REQUEUE_MARGIN_S = 15
#: Inherited from the submitting shell, these would win over the values derived from Slurm (a shell that
#: tested with MASTER_ADDR=localhost, or a submission from inside another job): the sbatch script unsets
#: them. A port of one's choosing goes through `--master-port`.
INHERITED_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                       "NODE_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                       "DDPSLURM_PREEMPTED")
#: Default process-group timeout (seconds) the worker applies when the script gives none.
DEFAULT_PG_TIMEOUT_S = 600

#: Variables every rank gets unless the person's environment already sets them (name, value, why).
ENV_DEFAULTS: tuple[tuple[str, str, str], ...] = (
    ("NCCL_DEBUG", "INFO", "NCCL init/transport lines in every rank log, for post-mortems"),
    ("NCCL_DEBUG_SUBSYS", "INIT,NET", "only init and network: the ranks, interfaces and IB devices in use and every "
     "WARN, without the per-collective and tuning chatter that is megabytes per rank at thousands of ranks"),
    ("DDPSLURM_PG_TIMEOUT", str(DEFAULT_PG_TIMEOUT_S),
     "init_process_group(timeout=None) gets this many seconds instead of torch's 10-30 min"),
    ("PYTHONUNBUFFERED", "1", "prints reach the logs at once"),
    ("PYTHONFAULTHANDLER", "1", "a segfault prints the Python stack of every thread"),
)
#: Set only where the NCCL in use supports them (NCCL >= 2.23, a CUDA build of torch). NCCL stamps only its WARN
#: lines unless told which levels to stamp (checked on an H100 with NCCL 2.28.9): every level, so that each INFO
#: line (init, the communicator's ranks, the interfaces) carries its time too.
NCCL_TIMESTAMP_ENVS = (("NCCL_DEBUG_TIMESTAMP_FORMAT", "[%F %T.%6f] "), ("NCCL_DEBUG_TIMESTAMP_LEVELS", "ALL"))
NCCL_TIMESTAMP_MIN_VERSION = (2, 23, 0)
#: Set only for torch < 2.2, whose default (0) leaves a failed collective hanging. Newer torch defaults
#: TORCH_NCCL_ASYNC_ERROR_HANDLING to 3 (tear down without the hang-prone ncclCommAbort) and still reads
#: this old name, so ddpslurm sets neither there.
OLD_TORCH_ASYNC_ERROR_ENV = ("NCCL_ASYNC_ERROR_HANDLING", "1")
OLD_TORCH_BEFORE = (2, 2)


def package_parent(parent: str | None = None) -> str | None:
    """The folder that holds this ddpslurm when it is a source checkout or an editable install (the job
    must import it, not whatever `ddpslurm` its working directory or site-packages holds); None for an
    installed wheel, which every node finds in site-packages."""
    parent = parent or str(Path(__file__).resolve().parents[2])
    return None if Path(parent).name in ("site-packages", "dist-packages") else parent


def package_setup(parent: str | None = None) -> list[str]:
    """sbatch lines that make the job import this very ddpslurm (see `package_parent`); empty for a wheel."""
    found = package_parent(parent)
    return [f"export PYTHONPATH={shlex.quote(found)}${{PYTHONPATH:+:$PYTHONPATH}}"] if found else []


@dataclass(frozen=True)
class WorkerConfig:
    """What the worker needs on every task. Plain values only: it is pickled by submitit."""

    script: str
    script_args: tuple[str, ...]
    launcher: str  # "srun" | "torchrun" | "local"
    folder: str  # the root; the job folder is <folder>/job_<jobid>
    nodes: int
    tasks_per_node: int
    max_requeues: int
    time_limit_s: int
    signal_delay_s: int
    grace_s: int
    interface: str | None
    env_defaults: tuple[tuple[str, str], ...]
    max_restarts: int = 0  # torchrun --max-restarts: in-place restarts of all workers within the attempt
    min_nodes: int = 0  # --nodes MIN:MAX: torchrun --nnodes MIN:<nodes allocated>; 0: a fixed node count


#: sbatch options (as `--sbatch-arg KEY=VALUE` keys) that change what the ranks see, and why that matters.
SBATCH_ARG_WARNINGS: tuple[tuple[str, str], ...] = (
    ("gpus-per-task", "Slurm binds one GPU per task: each rank sees CUDA_VISIBLE_DEVICES of one device, so it "
                      "must use cuda:0, not cuda:LOCAL_RANK (examples/train.py's choice fails), and NCCL loses "
                      "peer access between the node's GPUs; prefer --gpus-per-node"),
    ("gpu-bind", "Slurm narrows CUDA_VISIBLE_DEVICES per task: a script that picks cuda:LOCAL_RANK then asks for "
                 "a device it cannot see; prefer --gpus-per-node without binding"),
    ("array", "every array task is a separate DDP job with its own job id, folder and port; ranks of different "
              "tasks never meet. Use one submission per run, or a sweep script"),
    ("hetjob", "a heterogeneous job gives each component its own SLURM_PROCID numbering: ddpslurm derives ranks "
               "for one component only"),
    ("het-group", "a heterogeneous job gives each component its own SLURM_PROCID numbering: ddpslurm derives "
                  "ranks for one component only"),
)


def plan_warnings(spec: JobSpec) -> tuple[str, ...]:
    """What in the request would make the job misbehave although Slurm accepts it (shown by --dry-run and
    on submission)."""
    keys = {key.strip().lstrip("-").lower() for key, _ in spec.sbatch_args}
    return tuple(f"--sbatch-arg {key}: {why}" for key, why in SBATCH_ARG_WARNINGS if key in keys)


@dataclass(frozen=True)
class LaunchPlan:
    """A complete, inert description of one submission."""

    executor: str  # "slurm" | "local"
    folder: str  # submitit folder, with %j
    executor_params: dict[str, Any]
    srun_args: tuple[str, ...]
    signal: str
    max_requeues: int
    worker: WorkerConfig
    rank_env: tuple[tuple[str, str], ...]  # (name, value or description) as --dry-run shows it
    warnings: tuple[str, ...] = ()
    python: str = ""  # the interpreter of the batch step's supervisor and of every rank (`submit --python`)


def srun_args(spec: JobSpec) -> tuple[str, ...]:
    """Arguments for the srun that starts the tasks: fail fast (see REQUEUE_MARGIN_S for why no --wait); with a
    node range also `--no-kill`, so that a lost node does not end the step (torchrun carries on with the others).

    In-place restarts need nothing here: torchrun restarts its workers without its task (the per-node agent)
    exiting, so --kill-on-bad-exit sees nothing until the last restart is spent and an agent exits non-zero."""
    return ("--kill-on-bad-exit=1", "--no-kill") if spec.elastic else ("--kill-on-bad-exit=1",)


def batch_grace_s(signal_delay_s: int) -> int:
    """Seconds after the first rank's signal until the batch step requeues even with ranks still running."""
    return max(1, signal_delay_s - REQUEUE_MARGIN_S)


#: Variables every rank gets with --hang-timeout (unless set): the heartbeat (ddpslurm.launch.heartbeat).
HANG_ENV_DEFAULTS: tuple[tuple[str, str], ...] = (("DDPSLURM_HEARTBEAT_S", "1"),)


def batch_setup(spec: JobSpec, python: str) -> list[str]:
    """sbatch lines before submitit's srun line: no inherited rendezvous variables, and srun run by the
    batch-step supervisor (`ddpslurm.launch.batch`), which requeues the job after a signal and writes the
    post-mortem of a failed one (with --max-requeues 0 too; only --no-analyze without requeues, hang monitor or
    pre-flight runs srun bare); first, one line and the end of the job when `python` cannot import what the
    ranks need."""
    lines = [*batch_check_lines(python), f"unset {' '.join(INHERITED_DIST_VARS)}"]
    if spec.master_port:
        lines.append(f"export MASTER_PORT={int(spec.master_port)}")
    if spec.max_requeues > 0 or spec.hang_timeout_s or spec.preflight or spec.analyze:
        hang = ["--hang-timeout", str(spec.hang_timeout_s)] if spec.hang_timeout_s else []
        preflight = ["--preflight"] if spec.preflight else []  # ddpslurm doctor's checks before training
        preflight += [] if spec.analyze else ["--no-analyze"]  # no post-mortem at the job's end
        supervisor = [python, "-m", "ddpslurm.launch.batch", "--folder", str(spec.folder),
                      "--world-size", str(spec.world_size), "--grace", str(batch_grace_s(spec.signal_delay_s)),
                      "--max-requeues", str(spec.max_requeues), *hang, *preflight, "--"]
        lines += ["# srun runs under ddpslurm's batch-step supervisor: it requeues the job after a preemption or",
                  "# time-limit signal, once every rank has left its exit record or the grace time ran out, and",
                  "# writes diagnosis.json (and the job's Comment) when the job fails.",
                  f'srun() {{ {shlex.join(supervisor)} srun "$@"; }}']
    return lines


def _grace_s(signal_delay_s: int) -> int:
    """How long a script that ignores the preemption flag may keep running before the worker stops it."""
    return max(1, signal_delay_s // 2)


def _slurm_params(spec: JobSpec) -> dict[str, Any]:
    torchrun = spec.launcher == "torchrun"
    extra: dict[str, Any] = {"requeue" if spec.max_requeues > 0 else "no-requeue": True}
    # submitit's own default `--wckey=submitit` is dropped (sites that enforce wckeys refuse unknown ones);
    # `--sbatch-arg wckey=KEY` sets one
    if spec.elastic:  # sbatch's range: Slurm starts the job with as many nodes as it can give, MIN at least;
        extra["nodes"] = f"{spec.min_nodes}-{spec.nodes}"  # and a failed node does not revoke the allocation
        extra["no-kill"] = True
    for key, value in spec.sbatch_args:
        extra[key] = value if value != "" else True
    params: dict[str, Any] = {
        "job_name": spec.job_name,
        "nodes": spec.min_nodes if spec.elastic else spec.nodes,  # submitit counts its tasks from it
        "ntasks_per_node": 1 if torchrun else spec.tasks_per_node,
        "time": spec.time_min,
        "signal_delay_s": spec.signal_delay_s,
        "srun_args": list(srun_args(spec)),
        "additional_parameters": extra,
        "setup": package_setup() + batch_setup(spec, spec.python),
        "wckey": None,
    }
    cpus = spec.cpus_per_task
    if torchrun:  # one task per node hosts all the node's ranks
        cpus = (cpus or 1) * spec.tasks_per_node
    optional = {"cpus_per_task": cpus, "gpus_per_node": spec.gpus_per_node, "mem": spec.mem,
                "partition": spec.partition, "account": spec.account, "qos": spec.qos,
                "constraint": spec.constraint, "exclude": spec.exclude, "nodelist": spec.nodelist}
    params.update({key: value for key, value in optional.items() if value is not None})
    return params


def _local_params(spec: JobSpec) -> dict[str, Any]:
    params: dict[str, Any] = {"tasks_per_node": spec.world_size, "nodes": 1, "timeout_min": spec.time_min,
                              "signal_delay_s": spec.signal_delay_s}
    setup = package_setup()
    if setup:
        params["setup"] = setup
    if spec.gpus_per_node:
        params["gpus_per_node"] = spec.gpus_per_node * spec.nodes
    return params


def rank_env(spec: JobSpec) -> tuple[tuple[str, str], ...]:
    """The environment every rank will get, as --dry-run shows it (derived values described)."""
    launcher = "local" if spec.local else spec.launcher
    source = {"srun": "SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID",
              "torchrun": "torchrun (per node: SLURM_NODEID)",
              "local": "submitit's SUBMITIT_LOCAL_GLOBALID / _LOCALID"}[launcher]
    master = "127.0.0.1" if spec.local else "host of rank 0 (expanded SLURM_STEP_NODELIST)"
    iface = spec.interface or ("lo" if spec.local else "interface routing to another node of the job")
    nccl_iface = spec.interface or ("lo" if spec.local else "NCCL's own choice (set only with --interface)")
    world = (f"{spec.min_nodes * spec.tasks_per_node}..{spec.world_size} (nodes in the rendezvous x "
             f"{spec.tasks_per_node}; re-derived at every restart)" if spec.elastic else str(spec.world_size))
    derived = (
        ("RANK", f"0..{spec.world_size - 1} from {source}"),
        ("LOCAL_RANK", f"0..{spec.tasks_per_node - 1}"),
        ("WORLD_SIZE", world),
        ("LOCAL_WORLD_SIZE", str(spec.tasks_per_node if not spec.local else spec.world_size)),
        ("NODE_RANK", f"0..{spec.nodes - 1}" if not spec.local else "0"),
        ("MASTER_ADDR", master),
        ("MASTER_PORT", str(spec.master_port) if spec.master_port else "10000 + job_id % 20000 (+ 7919 x step id)"),
        ("NCCL_SOCKET_IFNAME", nccl_iface),
        ("GLOO_SOCKET_IFNAME", iface),
        ("DDPSLURM_JOB_FOLDER", str(jobfolder.job_folder(spec.folder, jobfolder.SHOWN_JOB_ID))),
        ("DDPSLURM_ATTEMPT", "SLURM_RESTART_COUNT (0 for the first attempt)"),
        *((("DDPSLURM_RESTART_COUNT", f"0..{spec.max_restarts}: in-place restarts so far in this attempt "
                                      "(torchrun's TORCHELASTIC_RESTART_COUNT counts only this node's failures)"),)
          if spec.max_restarts or spec.elastic else ()),
    )
    defaults = tuple((name, f"{value} (unless set)") for name, value, _ in ENV_DEFAULTS)
    only_new_nccl = "(unless set; only with CUDA and NCCL >= 2.23)"
    stamp = (*((name, f"{value!r} {only_new_nccl}") for name, value in NCCL_TIMESTAMP_ENVS),
             (OLD_TORCH_ASYNC_ERROR_ENV[0], f"{OLD_TORCH_ASYNC_ERROR_ENV[1]} (unless set; only with torch < 2.2)"),
             ("PYTORCH_NVML_BASED_CUDA_CHECK", "1 (unless set): ddpslurm never initializes CUDA before the script"))
    return derived + defaults + stamp


def plan(spec: JobSpec) -> LaunchPlan:
    """Derive the whole launch from the spec. Pure: same spec, same plan."""
    worker = WorkerConfig(
        script=str(spec.script), script_args=spec.script_args,
        launcher="local" if spec.local else spec.launcher, folder=str(spec.folder),
        nodes=spec.nodes, tasks_per_node=spec.tasks_per_node, max_requeues=spec.max_requeues,
        time_limit_s=spec.time_min * 60, signal_delay_s=spec.signal_delay_s,
        grace_s=_grace_s(spec.signal_delay_s), interface=spec.interface,
        env_defaults=tuple((name, value) for name, value, _ in ENV_DEFAULTS)
        + (HANG_ENV_DEFAULTS if spec.hang_timeout_s else ()),
        max_restarts=spec.max_restarts, min_nodes=spec.min_nodes or 0,
    )
    return LaunchPlan(
        executor="local" if spec.local else "slurm",
        folder=str(jobfolder.job_folder(spec.folder, jobfolder.SUBMITIT_JOB_ID)),
        executor_params=_local_params(spec) if spec.local else _slurm_params(spec),
        srun_args=() if spec.local else srun_args(spec),
        signal=f"{PREEMPT_SIGNAL_NAME}@{spec.signal_delay_s}",
        max_requeues=spec.max_requeues,
        worker=worker,
        rank_env=rank_env(spec),
        warnings=plan_warnings(spec),
        python=spec.python,
    )
