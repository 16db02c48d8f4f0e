"""Slurm variables -> the torch.distributed environment (pure), and the one function that exports it.

`derive_dist_env(os.environ)` runs in every task that srun started. Step-level variables win over
job-level ones (`SLURM_VARIABLES` below), because a step may run on a subset of the job's nodes, and then
rank 0 is not on the first host of the JOB nodelist (Lightning#17228).

MASTER_PORT, unless the user preset it: `10000 + SLURM_JOB_ID % 20000` (plus 7919 per step id). An array
task has a job id of its own, and that is the key: array job id + task id is some other job's id (array
5000's task 3 and plain job 5003 would get one port on a shared node). The range 10000-29999 stays below
Linux's ephemeral port range (32768+), so an outgoing connection never holds the port by chance (same
function as IDRIS's idr_torch; submitit draws from 20000-60000, which overlaps the ephemeral range).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from ddpslurm.errors import EnvDerivationError
from ddpslurm.scheduler.hostlist import expand_hostlist, expand_tasks_per_node

_UNDER_SRUN = "Run this under srun inside an sbatch or salloc allocation (or use `ddpslurm submit`)"

#: field -> Slurm variables in order of preference (step-level first, then job-level, then legacy names).
SLURM_VARIABLES: Mapping[str, tuple[str, ...]] = {
    "rank": ("SLURM_PROCID",),
    "local_rank": ("SLURM_LOCALID",),
    "node_rank": ("SLURM_NODEID",),
    "world_size": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    "nodelist": ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "num_nodes": ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),
    # optional ones
    "step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "restart_count": ("SLURM_RESTART_COUNT",),
    "array_job_id": ("SLURM_ARRAY_JOB_ID",),
    "array_task_id": ("SLURM_ARRAY_TASK_ID",),
    "distribution": ("SLURM_DISTRIBUTION",),
    "gpus_on_node": ("SLURM_GPUS_ON_NODE",),
}
REQUIRED = ("rank", "local_rank", "node_rank", "world_size", "tasks_per_node", "nodelist", "num_nodes", "job_id")

#: Default port function (see the module docstring).
PORT_BASE = 10000
PORT_SPAN = 20000


@dataclass(frozen=True)
class DistEnv:
    """Everything torch.distributed needs, derived from one task's Slurm environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    hostnames: tuple[str, ...]
    job_id: str
    tasks_per_node: tuple[int, ...] = ()
    step_id: str | None = None
    restart_count: int = 0
    array_job_id: str | None = None
    array_task_id: str | None = None
    distribution: str | None = None

    @property
    def hostname(self) -> str:
        """The host this task runs on (from the step nodelist and SLURM_NODEID)."""
        return self.hostnames[self.node_rank]


@dataclass(frozen=True)
class TorchrunArgs:
    """The torchrun rendezvous of a one-task-per-node step, derived from Slurm."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    rdzv_endpoint: str
    rdzv_id: str
    master_addr: str
    master_port: int

    def argv(self) -> list[str]:
        """torchrun options (c10d rendezvous on the rank-0 host)."""
        return [
            f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", f"--nproc-per-node={self.nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={self.rdzv_endpoint}", f"--rdzv-id={self.rdzv_id}",
        ]


def _lookup(environ: Mapping[str, str], field: str) -> tuple[str, str] | None:
    """(variable name, value) of the first non-empty variable for `field`, or None."""
    for name in SLURM_VARIABLES[field]:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def _require(environ: Mapping[str, str], field: str) -> tuple[str, str]:
    found = _lookup(environ, field)
    if found is None:
        names = " / ".join(SLURM_VARIABLES[field])
        raise EnvDerivationError(f"{names} is not set, so the {field.replace('_', ' ')} cannot be derived",
                                 _UNDER_SRUN)
    return found


def _int(name: str, value: str, minimum: int = 0) -> int:
    if not re.fullmatch(r"\d+", value) or int(value) < minimum:
        raise EnvDerivationError(f"{name}={value!r} is not an integer >= {minimum}",
                                 "Unset it or give the value Slurm would set")
    return int(value)


#: Concurrent job steps of one job (a sweep of `srun ... &` in one allocation) may share a node: each step
#: id moves the port by this much (a prime, so steps and neighbouring job ids rarely meet).
STEP_PORT_STRIDE = 7919


def master_port_for(job_id: str, step_id: str | None = None) -> int:
    """The default MASTER_PORT: 10000 + (SLURM_JOB_ID + 7919 x step) % 20000 (step: the numeric SLURM_STEP_ID,
    0 for the batch's first srun and for none).

    An array task is keyed by its own SLURM_JOB_ID, unique among running jobs (array job id + task id is not:
    it can be another job's id)."""
    key = _int("SLURM_JOB_ID", job_id)
    step = int(step_id) if step_id and step_id.isdigit() else 0
    return PORT_BASE + (key + STEP_PORT_STRIDE * step) % PORT_SPAN


def _preset_port(environ: Mapping[str, str]) -> int | None:
    value = environ.get("MASTER_PORT", "").strip()
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise EnvDerivationError(f"MASTER_PORT={value!r} is not a port number between 1 and 65535",
                                 "Unset MASTER_PORT to let ddpslurm derive one from the job id, or fix its value")
    return int(value)


def rank_zero_node(tasks_per_node: list[int], distribution: str | None) -> int:
    """Index (in the step nodelist) of the node that runs task 0.

    block, cyclic and plane distributions all place task 0 on the first node of the step that has tasks;
    `arbitrary` (SLURM_HOSTFILE) can put it anywhere, so it cannot be derived from the environment.
    """
    kind = re.split(r"[:,=]", distribution or "block", maxsplit=1)[0].strip().lower()
    if kind == "arbitrary":
        raise EnvDerivationError(
            "SLURM_DISTRIBUTION=arbitrary: the host of rank 0 cannot be derived from the Slurm environment",
            "Set MASTER_ADDR to the first host of your SLURM_HOSTFILE")
    return next(i for i, count in enumerate(tasks_per_node) if count > 0)


def derive_dist_env(environ: Mapping[str, str]) -> DistEnv:
    """Derive ranks, sizes and the rendezvous address of this task from its Slurm environment."""
    values = {field: _require(environ, field) for field in REQUIRED}
    rank = _int(*values["rank"])
    local_rank = _int(*values["local_rank"])
    node_rank = _int(*values["node_rank"])
    world_size = _int(*values["world_size"], minimum=1)
    num_nodes = _int(*values["num_nodes"], minimum=1)
    job_id = str(_int(*values["job_id"]))
    tpn_name, tpn_text = values["tasks_per_node"]
    nodes_name, nodes_text = values["nodelist"]
    tasks_per_node = expand_tasks_per_node(tpn_text)
    hostnames = expand_hostlist(nodes_text)
    world_name, nn_name = values["world_size"][0], values["num_nodes"][0]

    if world_size > 1 and _lookup(environ, "step_id") is None:
        raise EnvDerivationError(
            f"no SLURM_STEP_ID: this process runs in the batch script itself, not under srun, so it is the only "
            f"one of the {world_size} tasks ({world_name}={world_size}) and would wait for the others forever",
            "Start it with `srun python ...` inside the sbatch script (or use `ddpslurm submit`)")

    def inconsistent(what: str) -> EnvDerivationError:
        return EnvDerivationError(f"inconsistent Slurm environment: {what}",
                                  "Do not set these variables by hand; " + _UNDER_SRUN.lower())

    if len(hostnames) != num_nodes:
        raise inconsistent(f"{nodes_name}={nodes_text!r} names {len(hostnames)} hosts but {nn_name}={num_nodes}")
    if len(tasks_per_node) != num_nodes:
        raise inconsistent(f"{tpn_name}={tpn_text!r} covers {len(tasks_per_node)} nodes but {nn_name}={num_nodes}")
    if sum(tasks_per_node) != world_size:
        raise inconsistent(f"{tpn_name}={tpn_text!r} sums to {sum(tasks_per_node)} but {world_name}={world_size}")
    if rank >= world_size:
        raise inconsistent(f"SLURM_PROCID={rank} is not below {world_name}={world_size}")
    if node_rank >= num_nodes:
        raise inconsistent(f"SLURM_NODEID={node_rank} is not below {nn_name}={num_nodes}")
    local_world_size = tasks_per_node[node_rank]
    if local_rank >= local_world_size:
        raise inconsistent(f"SLURM_LOCALID={local_rank} is not below the {local_world_size} tasks of node "
                           f"{node_rank} ({tpn_name}={tpn_text!r})")

    optional = {field: (_lookup(environ, field) or ("", ""))[1] or None
                for field in ("step_id", "restart_count", "array_job_id", "array_task_id", "distribution")}
    port = _preset_port(environ)
    if port is None:
        port = master_port_for(job_id, optional["step_id"])
    master_addr = environ.get("MASTER_ADDR", "").strip()
    if not master_addr:
        master_addr = hostnames[rank_zero_node(tasks_per_node, optional["distribution"])]
    restart = optional["restart_count"]
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world_size, local_world_size=local_world_size,
        node_rank=node_rank, master_addr=master_addr, master_port=port, hostnames=tuple(hostnames),
        job_id=job_id, tasks_per_node=tuple(tasks_per_node), step_id=optional["step_id"],
        restart_count=_int("SLURM_RESTART_COUNT", restart) if restart else 0,
        array_job_id=optional["array_job_id"], array_task_id=optional["array_task_id"],
        distribution=optional["distribution"],
    )


def _gpus_from_environ(environ: Mapping[str, str]) -> int | None:
    found = _lookup(environ, "gpus_on_node")
    return _int(*found) if found else None


def rendezvous_id(dist: DistEnv) -> str:
    """torchrun's --rdzv-id: the job id, plus the step and the attempt when not 0. A requeued attempt with
    the job id alone would meet a c10d store of the last attempt that is still closing (the
    `stale_rendezvous_state` cause: RendezvousClosedError)."""
    parts = [dist.job_id]
    if dist.step_id and dist.step_id.isdigit() and int(dist.step_id):
        parts.append(f"s{dist.step_id}")
    if dist.restart_count:
        parts.append(f"a{dist.restart_count}")
    return "-".join(parts)


def derive_torchrun_args(environ: Mapping[str, str], nproc_per_node: int | None = None) -> TorchrunArgs:
    """torchrun's nnodes, node rank and c10d rendezvous for a step with one task per node.

    nproc_per_node: the given value, else SLURM_GPUS_ON_NODE, else 1 (a CPU-only node).
    """
    dist = derive_dist_env(environ)
    if any(count != 1 for count in dist.tasks_per_node):
        raise EnvDerivationError(
            f"torchrun mode needs one Slurm task per node, but the step has tasks per node {list(dist.tasks_per_node)}",
            "Use `srun --ntasks-per-node=1` (torchrun starts the per-GPU processes itself)")
    nproc = nproc_per_node if nproc_per_node is not None else (_gpus_from_environ(environ) or 1)
    if nproc < 1:
        raise EnvDerivationError(f"nproc_per_node={nproc} must be at least 1", "Give the number of GPUs per node")
    return TorchrunArgs(
        nnodes=len(dist.hostnames), node_rank=dist.node_rank, nproc_per_node=nproc,
        rdzv_endpoint=f"{dist.master_addr}:{dist.master_port}", rdzv_id=rendezvous_id(dist),
        master_addr=dist.master_addr, master_port=dist.master_port,
    )


def dist_env_vars(dist: DistEnv) -> dict[str, str]:
    """The variables torch.distributed's env:// init reads (plus NODE_RANK / GROUP_RANK as torchrun sets)."""
    return {
        "MASTER_ADDR": dist.master_addr,
        "MASTER_PORT": str(dist.master_port),
        "RANK": str(dist.rank),
        "LOCAL_RANK": str(dist.local_rank),
        "WORLD_SIZE": str(dist.world_size),
        "LOCAL_WORLD_SIZE": str(dist.local_world_size),
        "NODE_RANK": str(dist.node_rank),
        "GROUP_RANK": str(dist.node_rank),
    }


def export_dist_env(dist: DistEnv, environ: MutableMapping[str, str]) -> None:
    """Set the torch.distributed variables in `environ`. CUDA_VISIBLE_DEVICES is never touched:
    when Slurm binds GPUs (--gpus-per-task, --gpu-bind) it has already set it right."""
    environ.update(dist_env_vars(dist))


def binding_warnings(environ: Mapping[str, str], local_world_size: int) -> list[str]:
    """What in a rank's Slurm environment will trip a script that picks cuda:LOCAL_RANK. Pure."""
    found = []
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    devices = [d for d in visible.split(",") if d.strip()] if visible else []
    if visible and len(devices) < local_world_size:
        why = ("Slurm binds GPUs per task (--gpus-per-task, --gpu-bind)" if environ.get("SLURM_JOB_ID") else
               "fewer GPUs than ranks were given to this node (--gpus-per-node)")
        found.append(f"CUDA_VISIBLE_DEVICES={visible} holds {len(devices)} device(s) for {local_world_size} ranks "
                     f"on this node: {why}, so cuda:LOCAL_RANK does not exist here; use cuda:0, or ask for "
                     "--gpus-per-node without per-task binding")
    if environ.get("SLURM_HET_SIZE"):
        found.append(f"heterogeneous job (SLURM_HET_SIZE={environ['SLURM_HET_SIZE']}): ranks and world size are "
                     "derived for this component only; run one component per DDP job")
    return found
