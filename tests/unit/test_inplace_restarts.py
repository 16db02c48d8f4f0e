"""`submit --max-restarts N` and `--nodes MIN:MAX`: the spec, the sbatch/srun/torchrun argv, the restart records.

Pure functions and a temporary folder only; torchrun restarting real workers on the real cluster is in
tests/integration/test_inplace_restart.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpslurm import jobfolder
from ddpslurm.errors import UsageError
from ddpslurm.launch import restarts
from ddpslurm.launch.plan import plan
from ddpslurm.launch.spec import make_spec, parse_nodes
from ddpslurm.launch.submit import dry_run_text
from ddpslurm.launch.torchrun_agent import elastic_argv
from ddpslurm.launch.worker import torchrun_argv

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
FIXED = ["--nnodes=3", "--node-rank=1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=n1:10077",
         "--rdzv-id=77"]


def step_env(nodes: int, node: int) -> dict[str, str]:
    """A one-task-per-node Slurm step's variables as slurmstepd sets them on node `node`."""
    return {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": f"n[1-{nodes}]",
            "SLURM_STEP_TASKS_PER_NODE": f"1(x{nodes})", "SLURM_NODEID": str(node), "SLURM_PROCID": str(node),
            "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": str(nodes), "SLURM_STEP_NUM_NODES": str(nodes)}


@pytest.mark.parametrize(("raw", "expected"), [(4, (None, 4)), ("4", (None, 4)), ("2:4", (2, 4)), ("2-4", (2, 4)),
                                               (" 1 : 3 ", (1, 3)), ("3:3", (None, 3))])
def test_parse_nodes(raw: int | str, expected: tuple[int | None, int]) -> None:
    assert parse_nodes(raw) == expected


@pytest.mark.parametrize("raw", ["4:2", "0:2", "a", "2:", ":3", "2:3:4", "-1"])
def test_parse_nodes_refuses(raw: str) -> None:
    with pytest.raises(UsageError) as error:
        parse_nodes(raw)
    assert raw.strip() in error.value.one_line() and "\n" not in error.value.one_line()


def test_max_restarts_selects_torchrun_and_refuses_srun_and_local() -> None:
    assert make_spec(TRAIN, nodes=2, max_restarts=2).launcher == "torchrun"
    assert make_spec(TRAIN, nodes="2:4").launcher == "torchrun"
    assert make_spec(TRAIN, nodes=2).launcher == "srun"
    assert make_spec(TRAIN, nodes=2, max_restarts=1, launcher="torchrun").max_restarts == 1
    with pytest.raises(UsageError, match="--max-restarts needs --launcher torchrun"):
        make_spec(TRAIN, nodes=2, max_restarts=1, launcher="srun")
    with pytest.raises(UsageError, match="--nodes MIN:MAX needs --launcher torchrun"):
        make_spec(TRAIN, nodes="1:2", launcher="srun")
    with pytest.raises(UsageError, match="cannot run with --local"):
        make_spec(TRAIN, nodes=1, max_restarts=1, local=True)
    with pytest.raises(UsageError, match="--max-restarts -1"):
        make_spec(TRAIN, nodes=1, max_restarts=-1)


def test_node_range_plan_sbatch_and_srun() -> None:
    spec = make_spec(TRAIN, nodes="2:4", max_restarts=3, tasks_per_node=2)
    made = plan(spec)
    params = made.executor_params
    assert params["additional_parameters"]["nodes"] == "2-4"  # what becomes `#SBATCH --nodes=2-4`
    assert params["additional_parameters"]["no-kill"] is True  # a failed node does not revoke the allocation
    assert params["nodes"] == 2  # submitit counts its tasks from it: never more than Slurm gives
    assert made.srun_args == ("--kill-on-bad-exit=1", "--no-kill")
    assert (made.worker.max_restarts, made.worker.min_nodes, made.worker.nodes) == (3, 2, 4)
    text = dry_run_text(spec, made)
    assert "#SBATCH --nodes=2-4" in text and "#SBATCH --no-kill" in text
    assert "--nnodes=2:<nodes Slurm gave, 2..4>" in text and "--max-restarts=3" in text
    assert "DDPSLURM_RESTART_COUNT" in text


def test_plain_submit_is_unchanged() -> None:
    made = plan(make_spec(TRAIN, nodes=2, launcher="torchrun"))
    assert made.srun_args == ("--kill-on-bad-exit=1",)
    assert "nodes" not in made.executor_params["additional_parameters"] and made.executor_params["nodes"] == 2
    assert (made.worker.max_restarts, made.worker.min_nodes) == (0, 0)
    plain = make_spec(TRAIN, nodes=2)
    assert "in-place restarts" not in dry_run_text(plain, plan(plain))


def test_elastic_argv() -> None:
    assert elastic_argv(FIXED, nodes_in_step=3, max_restarts=0, min_nodes=0) == [*FIXED, "--max-restarts=0"]
    assert elastic_argv(FIXED, nodes_in_step=3, max_restarts=2, min_nodes=0) == [*FIXED, "--max-restarts=2"]
    ranged = elastic_argv(FIXED, nodes_in_step=3, max_restarts=1, min_nodes=2)
    assert ranged[0] == "--nnodes=2:3" and not any(a.startswith(("--node-rank", "--nnodes=3")) for a in ranged)
    assert ranged[-1] == "--max-restarts=1" and "--rdzv-endpoint=n1:10077" in ranged
    # Slurm gave fewer nodes than MIN (it never does for --nodes=MIN-MAX, but a step may be narrower): no MIN > MAX
    assert elastic_argv(FIXED, nodes_in_step=1, max_restarts=0, min_nodes=2)[0] == "--nnodes=1:1"


def test_torchrun_argv_of_a_node_range_step() -> None:
    cfg = plan(make_spec(TRAIN, nodes="2:4", max_restarts=2)).worker
    argv = torchrun_argv(cfg, step_env(3, 2))  # Slurm gave 3 of 2..4 nodes; this is the third
    assert argv[:argv.index("--module")] == ["--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                                             "--rdzv-endpoint=n1:10077", "--rdzv-id=77",
                                             "--rdzv-conf=join_timeout=120", "--max-restarts=2"]
    fixed = torchrun_argv(plan(make_spec(TRAIN, nodes=3, launcher="torchrun")).worker, step_env(3, 2))
    assert fixed[:fixed.index("--module")] == ["--nnodes=3", "--node-rank=2", "--nproc-per-node=1",
                                               "--rdzv-backend=c10d", "--rdzv-endpoint=n1:10077", "--rdzv-id=77",
                                               "--max-restarts=0"]


def _job(tmp_path: Path, max_restarts: int) -> tuple[Path, Path]:
    job = tmp_path / "job_77"
    host = job / "attempt_0" / "n1"
    host.mkdir(parents=True)
    jobfolder.write_json(job / "ddpslurm.json", {"spec": {"max_restarts": max_restarts}})
    return job, host


def test_set_aside_moves_one_restart_and_copies_the_node_file(tmp_path: Path) -> None:
    job, host = _job(tmp_path, 2)
    for name in ("rank_0.log", "rank_1.log", "rank_1.exit.json", "nccl_trace_rank_1"):
        (host / name).write_text(name)
    node_file = job / "attempt_0" / "node_n1.json"
    node_file.write_text(json.dumps({"ranks": {}}))
    assert restarts.set_aside(host, 0, node_file) == 5
    kept = restarts.restart_folder(host, 0)
    assert sorted(p.name for p in kept.iterdir()) == ["nccl_trace_rank_1", "node_n1.json", "rank_0.log",
                                                      "rank_1.exit.json", "rank_1.log"]
    assert [p.name for p in host.iterdir()] == ["restart_0"] and node_file.is_file()
    # the set-aside restart reads as an attempt folder of its own, and readers of the attempt do not see it
    assert set(jobfolder.rank_record_paths(kept, jobfolder.EXIT_SUFFIX)) == {1}
    assert jobfolder.rank_record_paths(job / "attempt_0", jobfolder.LOG_SUFFIX) == {}
    assert restarts.set_aside(host, 1) == 0 and not restarts.restart_folder(host, 1).exists()


def test_records_and_status_summary(tmp_path: Path) -> None:
    job, host = _job(tmp_path, 3)
    assert restarts.summary(job) == {"attempt": 0, "restarts": 0, "max_restarts": 3, "world_size": None,
                                     "last_reason": None, "below_min": []}
    for k, reason in ((1, restarts.WORKER_FAILED), (2, restarts.MEMBERSHIP_CHANGED)):
        restarts.append_record(host, restarts.restart_entry(restart=k, max_restarts=3, host="n1", reason=reason,
                                                            failed=[{"rank": 1, "exit_code": -9}], moved=2,
                                                            unix=100.0 + k))
    assert [e["restart"] for e in restarts.read_records(host)] == [1, 2]
    other = job / "attempt_0" / "n2"  # the node whose worker failed at restart 2: its reason is the cause
    other.mkdir()
    restarts.append_record(other, restarts.restart_entry(restart=2, max_restarts=3, host="n2",
                                                         reason=restarts.WORKER_FAILED, failed=[], moved=1, unix=1.0))
    assert restarts.summary(job)["last_reason"] == restarts.WORKER_FAILED
    (other / "restarts.json").unlink()
    jobfolder.write_json(host / "rank_0.start.json", {"kind": "start", "rank": 0, "world_size": 2, "unix": 5.0})
    found = restarts.summary(job)
    assert found == {"attempt": 0, "restarts": 2, "max_restarts": 3, "world_size": 2,
                     "last_reason": restarts.MEMBERSHIP_CHANGED, "below_min": []}
    assert restarts.summary_line(found) == ("restarts in place: 2 of 3 used in attempt 0, last: membership changed; "
                                            "world size now 2")


def test_no_summary_for_a_job_without_restarts(tmp_path: Path) -> None:
    job, _ = _job(tmp_path, 0)
    assert restarts.summary(job) is None
    assert restarts.summary(tmp_path / "missing") is None


def test_first_summary_takes_the_first_folder_that_has_one(tmp_path: Path) -> None:
    job, _ = _job(tmp_path, 2)
    assert restarts.first_summary([tmp_path / "missing", job])["max_restarts"] == 2
    assert restarts.first_summary([tmp_path / "missing"]) is None
