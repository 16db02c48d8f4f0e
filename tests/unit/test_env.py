"""Slurm environment -> DistEnv (table-driven): ranks, rank-0 host, port, and every error."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.env import (
    SLURM_VARIABLES,
    DistEnv,
    binding_warnings,
    derive_dist_env,
    derive_torchrun_args,
    dist_env_vars,
    export_dist_env,
    master_port_for,
)
from ddpslurm.errors import EnvDerivationError

#: A task of a 2-node step with 2 tasks per node, as srun sets it (job 4242, rank 3 on node02).
BASE = {
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "node[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}
JOB_ONLY = {**{k: v for k, v in BASE.items() if not k.startswith("SLURM_STEP_")}, "SLURM_STEPID": "0"}


def env(base: dict[str, str] = BASE, drop: tuple[str, ...] = (), **changes: str) -> dict[str, str]:
    out = {k: v for k, v in base.items() if k not in drop}
    out.update(changes)
    return out


# (case id, environ, expected fields)
GOOD = [
    ("two nodes, step vars", env(),
     {"rank": 3, "local_rank": 1, "world_size": 4, "local_world_size": 2, "node_rank": 1,
      "master_addr": "node01", "master_port": 10000 + 4242, "hostnames": ("node01", "node02"), "job_id": "4242"}),
    ("job vars only (no step vars)", JOB_ONLY,
     {"rank": 3, "world_size": 4, "master_addr": "node01", "hostnames": ("node01", "node02")}),
    ("legacy SLURM_NODELIST / SLURM_NNODES / SLURM_NPROCS / SLURM_JOBID",
     {"SLURM_JOBID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
      "SLURM_NODELIST": "cn1", "SLURM_NNODES": "1", "SLURM_NPROCS": "1", "SLURM_TASKS_PER_NODE": "1"},
     {"rank": 0, "world_size": 1, "master_addr": "cn1", "job_id": "7", "master_port": 10007}),
    ("step on a subset: rank 0 on the step's first host, not the job's (Lightning#17228)",
     env(SLURM_JOB_NODELIST="node[01-04]", SLURM_JOB_NUM_NODES="4", SLURM_NTASKS="8",
         SLURM_TASKS_PER_NODE="2(x4)", SLURM_STEP_NODELIST="node[03-04]"),
     {"master_addr": "node03", "hostnames": ("node03", "node04"), "world_size": 4}),
    ("uneven tasks per node 4(x2),3, last node",
     env(SLURM_STEP_NODELIST="gpu[01-03]", SLURM_STEP_NUM_NODES="3", SLURM_STEP_NUM_TASKS="11",
         SLURM_STEP_TASKS_PER_NODE="4(x2),3", SLURM_PROCID="10", SLURM_LOCALID="2", SLURM_NODEID="2"),
     {"world_size": 11, "local_world_size": 3, "node_rank": 2, "master_addr": "gpu01"}),
    ("uneven tasks per node 4(x2),3, first node",
     env(SLURM_STEP_NODELIST="gpu[01-03]", SLURM_STEP_NUM_NODES="3", SLURM_STEP_NUM_TASKS="11",
         SLURM_STEP_TASKS_PER_NODE="4(x2),3", SLURM_PROCID="3", SLURM_LOCALID="3", SLURM_NODEID="0"),
     {"local_world_size": 4, "rank": 3, "local_rank": 3}),
    ("zero padding kept", env(SLURM_STEP_NODELIST="n[008-009]"),
     {"master_addr": "n008", "hostnames": ("n008", "n009")}),
    ("multi-group nodelist",
     env(SLURM_STEP_NODELIST="a7,b[01-02]", SLURM_STEP_NUM_NODES="3", SLURM_STEP_NUM_TASKS="3",
         SLURM_STEP_TASKS_PER_NODE="1(x3)", SLURM_PROCID="2", SLURM_LOCALID="0", SLURM_NODEID="2"),
     {"master_addr": "a7", "hostnames": ("a7", "b01", "b02"), "local_world_size": 1}),
    ("cartesian nodelist",
     env(SLURM_STEP_NODELIST="r[1-2]-n[1-2]", SLURM_STEP_NUM_NODES="4", SLURM_STEP_NUM_TASKS="4",
         SLURM_STEP_TASKS_PER_NODE="1(x4)", SLURM_PROCID="1", SLURM_LOCALID="0", SLURM_NODEID="1"),
     {"master_addr": "r1-n1", "hostnames": ("r1-n1", "r1-n2", "r2-n1", "r2-n2")}),
    ("preset MASTER_PORT wins", env(MASTER_PORT="29500"), {"master_port": 29500}),
    ("preset MASTER_ADDR wins", env(MASTER_ADDR="10.0.0.9"), {"master_addr": "10.0.0.9"}),
    ("blank MASTER_PORT is ignored", env(MASTER_PORT=" "), {"master_port": 14242}),
    ("port wraps modulo 20000", env(SLURM_JOB_ID="123456"), {"master_port": 10000 + 123456 % 20000}),
    ("array task: its own job id",
     env(SLURM_JOB_ID="5007", SLURM_ARRAY_JOB_ID="5000", SLURM_ARRAY_TASK_ID="3"),
     {"master_port": 15007, "array_job_id": "5000", "array_task_id": "3", "job_id": "5007"}),
    ("array tasks sharing nodes get different ports",
     env(SLURM_JOB_ID="5010", SLURM_ARRAY_JOB_ID="5000", SLURM_ARRAY_TASK_ID="4"), {"master_port": 15010}),
    ("restart count and step id", env(SLURM_RESTART_COUNT="2", SLURM_STEP_ID="1"),
     {"restart_count": 2, "step_id": "1"}),
    ("cyclic distribution: rank 0 still on the first node", env(SLURM_DISTRIBUTION="cyclic"),
     {"master_addr": "node01", "distribution": "cyclic"}),
    ("block:cyclic distribution", env(SLURM_DISTRIBUTION="block:cyclic"), {"master_addr": "node01"}),
    ("single node, single task",
     {"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
      "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "1",
      "SLURM_STEP_TASKS_PER_NODE": "1"},
     {"world_size": 1, "local_world_size": 1, "master_addr": "localhost", "restart_count": 0, "step_id": None}),
]


@pytest.mark.parametrize(("environ", "expected"), [c[1:] for c in GOOD], ids=[c[0] for c in GOOD])
def test_derive_dist_env(environ: dict[str, str], expected: dict[str, object]) -> None:
    dist = derive_dist_env(environ)
    assert {key: getattr(dist, key) for key in expected} == expected


# (case id, environ, substrings the one-line error must contain)
BAD = [
    *[(f"missing {field}", env(drop=SLURM_VARIABLES[field]), [SLURM_VARIABLES[field][0], "srun"])
      for field in ("rank", "local_rank", "node_rank", "world_size", "tasks_per_node", "nodelist", "num_nodes",
                    "job_id")],
    ("empty value counts as missing", env(SLURM_PROCID=""), ["SLURM_PROCID", "srun"]),
    ("rank >= world size", env(SLURM_PROCID="4"), ["SLURM_PROCID=4", "SLURM_STEP_NUM_TASKS=4"]),
    ("tasks-per-node sum != ntasks", env(SLURM_STEP_NUM_TASKS="5"), ["sums to 4", "SLURM_STEP_NUM_TASKS=5"]),
    ("nodelist length != num nodes", env(SLURM_STEP_NUM_NODES="3"), ["names 2 hosts", "SLURM_STEP_NUM_NODES=3"]),
    ("tasks-per-node length != num nodes", env(SLURM_STEP_TASKS_PER_NODE="4"), ["covers 1 nodes", "=2"]),
    ("local rank >= local world size", env(SLURM_LOCALID="2"), ["SLURM_LOCALID=2", "2 tasks"]),
    ("node rank >= num nodes", env(SLURM_NODEID="2"), ["SLURM_NODEID=2", "SLURM_STEP_NUM_NODES=2"]),
    ("non-numeric rank", env(SLURM_PROCID="x"), ["SLURM_PROCID='x'"]),
    ("non-numeric job id", env(SLURM_JOB_ID="12a"), ["SLURM_JOB_ID='12a'"]),
    ("MASTER_PORT out of range", env(MASTER_PORT="70000"), ["MASTER_PORT='70000'", "1 and 65535"]),
    ("MASTER_PORT zero", env(MASTER_PORT="0"), ["MASTER_PORT='0'"]),
    ("MASTER_PORT not a number", env(MASTER_PORT="http"), ["MASTER_PORT='http'"]),
    ("malformed nodelist", env(SLURM_STEP_NODELIST="node[01-02"), ["node[01-02", "without"]),
    ("malformed tasks per node", env(SLURM_STEP_TASKS_PER_NODE="2(x)"), ["2(x)"]),
    ("arbitrary distribution needs MASTER_ADDR", env(SLURM_DISTRIBUTION="arbitrary"), ["arbitrary", "MASTER_ADDR"]),
    ("zero world size", env(SLURM_STEP_NUM_TASKS="0"), ["SLURM_STEP_NUM_TASKS='0'", ">= 1"]),
    ("batch script, not under srun (no step id)", env(JOB_ONLY, drop=("SLURM_STEPID",)),
     ["batch script", "SLURM_NTASKS=4", "srun"]),
]


@pytest.mark.parametrize(("environ", "needles"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_derive_dist_env_errors(environ: dict[str, str], needles: list[str]) -> None:
    with pytest.raises(EnvDerivationError) as info:
        derive_dist_env(environ)
    line = info.value.one_line()
    assert "\n" not in line
    for needle in needles:
        assert needle in line


def test_arbitrary_distribution_with_preset_master_addr_is_fine() -> None:
    dist = derive_dist_env(env(SLURM_DISTRIBUTION="arbitrary", MASTER_ADDR="node02"))
    assert dist.master_addr == "node02"


def test_every_task_of_a_step_agrees_on_the_rendezvous() -> None:
    """All 11 tasks of a `4(x2),3` step derive the same address, port and world size."""
    tasks = [(0, 0, 0), (3, 3, 0), (4, 0, 1), (7, 3, 1), (8, 0, 2), (10, 2, 2)]
    step = env(SLURM_STEP_NODELIST="gpu[01-03]", SLURM_STEP_NUM_NODES="3", SLURM_STEP_NUM_TASKS="11",
               SLURM_STEP_TASKS_PER_NODE="4(x2),3")
    seen = {(d.master_addr, d.master_port, d.world_size)
            for d in (derive_dist_env(env(step, SLURM_PROCID=str(r), SLURM_LOCALID=str(lr), SLURM_NODEID=str(n)))
                      for r, lr, n in tasks)}
    assert seen == {("gpu01", 14242, 11)}


@pytest.mark.parametrize(
    ("job_id", "port"),
    [("0", 10000), ("19999", 29999), ("20000", 10000), ("42", 10042), ("47", 10047),
     ("99999999", 10000 + 99999999 % 20000)],
)
def test_master_port_for(job_id: str, port: int) -> None:
    assert master_port_for(job_id) == port
    assert 10000 <= port < 32768  # below the Linux ephemeral range


def test_export_sets_torch_variables_and_leaves_cuda_visible_devices_alone() -> None:
    dist = derive_dist_env(env())
    environ = {"CUDA_VISIBLE_DEVICES": "3", "PATH": "/bin"}
    export_dist_env(dist, environ)
    assert environ == {
        "CUDA_VISIBLE_DEVICES": "3", "PATH": "/bin", "MASTER_ADDR": "node01", "MASTER_PORT": "14242",
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1",
        "GROUP_RANK": "1",
    }


def test_export_without_cuda_visible_devices_does_not_add_it() -> None:
    environ: dict[str, str] = {}
    export_dist_env(derive_dist_env(env()), environ)
    assert "CUDA_VISIBLE_DEVICES" not in environ
    assert environ == dist_env_vars(derive_dist_env(env()))


def test_dist_env_is_frozen_and_knows_its_host() -> None:
    dist = derive_dist_env(env())
    assert isinstance(dist, DistEnv)
    assert dist.hostname == "node02"
    with pytest.raises(AttributeError):
        dist.rank = 0  # type: ignore[misc]


TORCHRUN_STEP = env(SLURM_STEP_NODELIST="gpu[01-03]", SLURM_STEP_NUM_NODES="3", SLURM_STEP_NUM_TASKS="3",
                    SLURM_STEP_TASKS_PER_NODE="1(x3)", SLURM_PROCID="2", SLURM_LOCALID="0", SLURM_NODEID="2")


@pytest.mark.parametrize(
    ("environ", "nproc_arg", "expected"),
    [
        (TORCHRUN_STEP, None, (3, 2, 1, "gpu01:14242")),
        (env(TORCHRUN_STEP, SLURM_GPUS_ON_NODE="8"), None, (3, 2, 8, "gpu01:14242")),
        (env(TORCHRUN_STEP, SLURM_GPUS_ON_NODE="8"), 4, (3, 2, 4, "gpu01:14242")),
        (env(TORCHRUN_STEP, MASTER_PORT="29400"), 2, (3, 2, 2, "gpu01:29400")),
    ],
)
def test_derive_torchrun_args(environ: dict[str, str], nproc_arg: int | None, expected: tuple) -> None:
    args = derive_torchrun_args(environ, nproc_arg)
    assert (args.nnodes, args.node_rank, args.nproc_per_node, args.rdzv_endpoint) == expected
    assert args.rdzv_id == "4242"
    assert f"--rdzv-endpoint={expected[3]}" in args.argv()
    assert f"--nnodes={expected[0]}" in args.argv()


def test_torchrun_mode_refuses_several_tasks_per_node() -> None:
    with pytest.raises(EnvDerivationError, match="one Slurm task per node"):
        derive_torchrun_args(env())


# Environments recorded from real srun tasks on the local cluster (tests/data/slurm_env/JOB_STEP_PROCID.env):
# job 2815402 step 0: -N3 -n5 (tasks per node 3,1(x2)); job 2815403 step 0: `srun -N2 -n3 -r1` on the last
# two of three job nodes (SLURM_NODELIST still names all three); step 1: -n6 --distribution=cyclic;
# 2815452/2815453: the two tasks (1 and 0) of array job 2815452.
# SLURM_TOPOLOGY_ADDR is the task's own host as Slurm reports it: an independent check of the derivation.
RECORDED = Path(__file__).resolve().parent.parent / "data" / "slurm_env"


def _read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _steps() -> dict[str, list[dict[str, str]]]:
    steps: dict[str, list[dict[str, str]]] = {}
    for path in sorted(RECORDED.glob("*.env")):
        job, step, _ = path.stem.split("_")
        steps.setdefault(f"{job}.{step}", []).append(_read_env(path))
    return steps


@pytest.mark.parametrize(("step", "tasks"), sorted(_steps().items()))
def test_recorded_real_steps(step: str, tasks: list[dict[str, str]]) -> None:
    dists = {int(t["SLURM_PROCID"]): derive_dist_env(t) for t in tasks}
    hosts = {int(t["SLURM_PROCID"]): t["SLURM_TOPOLOGY_ADDR"] for t in tasks}
    assert sorted(dists) == list(range(len(tasks)))  # every rank of the step was recorded
    assert {d.world_size for d in dists.values()} == {len(tasks)}
    assert {d.master_addr for d in dists.values()} == {hosts[0]}  # the host rank 0 really ran on
    first = tasks[0]
    key = int(first["SLURM_JOB_ID"])
    step_id = int(first.get("SLURM_STEP_ID", "0"))
    assert {d.master_port for d in dists.values()} == {10000 + (key + 7919 * step_id) % 20000}
    for rank, dist in dists.items():
        assert dist.hostname == hosts[rank]
        local_peers = [r for r, h in hosts.items() if h == hosts[rank]]
        assert dist.local_world_size == len(local_peers)
    assert len({(d.node_rank, d.local_rank) for d in dists.values()}) == len(tasks)


def test_recorded_subset_step_is_the_lightning_17228_case() -> None:
    task = _read_env(RECORDED / "2815403_0_0.env")
    assert task["SLURM_JOB_NODELIST"].startswith("h3-n[01")  # the job's first host is h3-n01 ...
    assert derive_dist_env(task).master_addr == "h3-n02"  # ... but rank 0 of this step runs on h3-n02


def test_recorded_array_tasks_get_different_ports() -> None:
    ports = {derive_dist_env(_read_env(RECORDED / f"{job}_0_0.env")).master_port for job in ("2815452", "2815453")}
    assert ports == {10000 + 2815452 % 20000, 10000 + 2815453 % 20000}


def test_recorded_batch_script_environment_is_refused() -> None:
    """Recorded inside `sbatch -N2 -n3 --wrap ...` without srun: one process, three tasks allocated."""
    environ = _read_env(Path(__file__).resolve().parent.parent / "data" / "slurm_env_batch" / "n2_n3.env")
    assert environ["SLURM_NTASKS"] == "3" and environ["SLURM_PROCID"] == "0"
    with pytest.raises(EnvDerivationError, match="not under srun"):
        derive_dist_env(environ)


def test_an_array_task_and_the_plain_job_with_its_array_sum_get_different_ports() -> None:
    """Array 5000's task 3 (job id 5009) and plain job 5003 on one node: array id + task id would give both
    port 15003; each task's own SLURM_JOB_ID tells them apart."""
    array_task = derive_dist_env(env(SLURM_JOB_ID="5009", SLURM_ARRAY_JOB_ID="5000", SLURM_ARRAY_TASK_ID="3"))
    plain = derive_dist_env(env(SLURM_JOB_ID="5003"))
    assert (array_task.master_port, plain.master_port) == (15009, 15003)
    assert master_port_for("5009", step_id="1") == 15009 + 7919


def test_concurrent_steps_of_one_job_get_different_ports() -> None:
    ports = {master_port_for("4242", step_id=step) for step in (None, "0", "1", "2", "batch")}
    assert len(ports) == 3 and master_port_for("4242") == master_port_for("4242", step_id="batch") == 14242
    assert all(10000 <= p < 30000 for p in ports)


@pytest.mark.parametrize(("extra", "rdzv_id"), [
    ({}, "4242"),
    ({"SLURM_RESTART_COUNT": "2"}, "4242-a2"),
    ({"SLURM_STEP_ID": "3", "SLURM_RESTART_COUNT": "1"}, "4242-s3-a1"),
])
def test_torchrun_rendezvous_id_differs_across_requeues_and_steps(extra: dict[str, str], rdzv_id: str) -> None:
    assert derive_torchrun_args(env(TORCHRUN_STEP, **extra)).rdzv_id == rdzv_id


@pytest.mark.parametrize(("environ", "local_ranks", "expected"), [
    ({}, 2, []),                                            # no GPUs: nothing to say
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 2, []),               # --gpus-per-node 2: every rank sees both
    ({"CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_ID": "7"}, 2, ["for 2 ranks on this node: Slurm binds"]),
    ({"CUDA_VISIBLE_DEVICES": "0"}, 4, ["holds 1 device(s) for 4 ranks on this node: fewer GPUs"]),  # --local
    ({"CUDA_VISIBLE_DEVICES": "0"}, 1, []),
    ({"SLURM_HET_SIZE": "2"}, 1, ["heterogeneous job"]),
])
def test_binding_warnings(environ: dict[str, str], local_ranks: int, expected: list[str]) -> None:
    got = binding_warnings(environ, local_ranks)
    assert len(got) == len(expected) and all(e in g for e, g in zip(expected, got, strict=True))
