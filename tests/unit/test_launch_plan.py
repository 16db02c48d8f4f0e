"""plan(spec) is pure and complete; --dry-run output is pinned by golden files.

To accept a deliberate change of the dry-run output:
    DDPSLURM_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_launch_plan.py
then review `git diff tests/golden/`.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from ddpslurm.errors import UsageError
from ddpslurm.launch.plan import ENV_DEFAULTS, plan
from ddpslurm.launch.spec import make_spec

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
SCRIPT = REPO / "examples" / "train.py"
UPDATE = os.environ.get("DDPSLURM_UPDATE_GOLDEN") == "1"

CASES: dict[str, tuple[list[str], dict]] = {
    "srun_2_nodes": ([], {"nodes": 2}),
    "gpu_full_options": (
        ["--lr", "0.1", "a b", "it's", "$(touch /tmp/pwned)", "`id`", "x;y"],
        {"nodes": 4, "gpus_per_node": 8, "cpus_per_task": 10, "mem": "500G", "partition": "gpu",
         "account": "proj1", "qos": "high", "time": "2-00:00", "constraint": "a100", "exclude": "node[03-04]",
         "sbatch_args": ["mail-type=END", "exclusive="], "max_requeues": 5, "signal_delay_s": 120,
         "job_name": "bert"},
    ),
    "torchrun_3x2": ([], {"nodes": 3, "tasks_per_node": 2, "launcher": "torchrun", "cpus_per_task": 2}),
    "local_2": ([], {"nodes": 1, "tasks_per_node": 2, "local": True}),
    "no_requeue": ([], {"nodes": 2, "max_requeues": 0, "time": "2", "signal_delay_s": 30}),
}


def _normalize(text: str) -> str:
    text = text.replace(shlex.quote(sys.executable), "<PYTHON>").replace(sys.executable, "<PYTHON>")
    return text.replace(str(REPO), "<REPO>")


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_matches_golden(name: str) -> None:
    from ddpslurm.launch.submit import dry_run_text

    args, kwargs = CASES[name]
    spec = make_spec(SCRIPT, args, folder="/jobs", **kwargs)
    text = _normalize(dry_run_text(spec, plan(spec)))
    golden = GOLDEN / f"dry_run_{name}.txt"
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}; create it with DDPSLURM_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == golden.read_text(), (
        f"--dry-run output for {name!r} changed. If deliberate: DDPSLURM_UPDATE_GOLDEN=1 python -m pytest "
        f"{__file__} and review `git diff {golden}`")


def test_plan_is_pure() -> None:
    spec = make_spec(SCRIPT, ["x"], nodes=2, folder="/jobs")
    assert plan(spec) == plan(spec)


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"nodes": 2}, {"nodes": 2, "ntasks_per_node": 1, "time": 60, "signal_delay_s": 90}),
    ({"nodes": 3, "tasks_per_node": 2}, {"nodes": 3, "ntasks_per_node": 2}),
    ({"nodes": 2, "tasks_per_node": 4, "launcher": "torchrun"}, {"ntasks_per_node": 1, "cpus_per_task": 4}),
    ({"nodes": 2, "tasks_per_node": 4, "launcher": "torchrun", "cpus_per_task": 3},
     {"ntasks_per_node": 1, "cpus_per_task": 12}),
    ({"gpus_per_node": 8, "mem": "64G", "partition": "p", "exclude": "n1"},
     {"gpus_per_node": 8, "ntasks_per_node": 8, "mem": "64G", "partition": "p", "exclude": "n1"}),
    ({"time": "0:30:00", "signal_delay_s": 60}, {"time": 30, "signal_delay_s": 60}),
])
def test_slurm_executor_params(kwargs: dict, expected: dict) -> None:
    params = plan(make_spec(SCRIPT, folder="/jobs", **kwargs)).executor_params
    assert {key: params.get(key) for key in expected} == expected
    assert "--kill-on-bad-exit=1" in params["srun_args"]


@pytest.mark.parametrize(("max_requeues", "flag"), [(3, "requeue"), (0, "no-requeue")])
def test_requeue_flag(max_requeues: int, flag: str) -> None:
    params = plan(make_spec(SCRIPT, folder="/jobs", max_requeues=max_requeues)).executor_params
    assert params["additional_parameters"][flag] is True


def test_sbatch_args_pass_through() -> None:
    params = plan(make_spec(SCRIPT, folder="/jobs", sbatch_args=["reservation=r1", "exclusive="])).executor_params
    assert params["additional_parameters"]["reservation"] == "r1"
    assert params["additional_parameters"]["exclusive"] is True


def test_local_plan_runs_all_ranks_on_one_node() -> None:
    result = plan(make_spec(SCRIPT, folder="/jobs", nodes=2, tasks_per_node=3, local=True))
    assert result.executor == "local"
    assert result.executor_params["tasks_per_node"] == 6
    assert result.worker.launcher == "local"


def test_worker_config_carries_the_script_and_defaults() -> None:
    result = plan(make_spec(SCRIPT, ["--a", "b c"], folder="/jobs", nodes=2, signal_delay_s=40, time="2"))
    worker = result.worker
    assert worker.script == str(SCRIPT) and worker.script_args == ("--a", "b c")
    assert worker.folder == "/jobs" and worker.time_limit_s == 120 and worker.signal_delay_s == 40
    assert 0 < worker.grace_s < 40
    assert dict(worker.env_defaults) == {name: value for name, value, _ in ENV_DEFAULTS}
    assert result.signal == "USR2@40"
    assert result.folder == "/jobs/job_%j"


def test_env_defaults_never_turn_on_distributed_debug_detail() -> None:
    names = {name for name, _, _ in ENV_DEFAULTS}
    assert "TORCH_DISTRIBUTED_DEBUG" not in names
    assert "NCCL_DEBUG" in names
    # torch >= 2.2 defaults TORCH_NCCL_ASYNC_ERROR_HANDLING to 3 (and reads the old name as well): forcing
    # 1 would bring back the hang-prone ncclCommAbort teardown.
    assert not names & {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}


@pytest.mark.parametrize(("sbatch_args", "expected"), [
    ((), []),
    (("comment=hello",), []),
    (("gpus-per-task=1",), ["gpus-per-task", "cuda:0"]),
    (("gpu-bind=single:1",), ["gpu-bind"]),
    (("array=0-3",), ["array", "never meet"]),
])
def test_plan_warns_about_requests_that_break_ddp(sbatch_args: tuple[str, ...], expected: list[str]) -> None:
    result = plan(make_spec(SCRIPT, folder="/jobs", nodes=2, sbatch_args=sbatch_args))
    text = " ".join(result.warnings)
    assert all(word in text for word in expected) and bool(result.warnings) == bool(expected)


def test_the_sbatch_script_strips_inherited_rendezvous_variables_and_requeues_from_the_batch_step() -> None:
    result = plan(make_spec(SCRIPT, folder="/jobs", nodes=2))
    setup = result.executor_params["setup"]
    unset = next(line for line in setup if line.startswith("unset "))
    assert {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"} <= set(unset.split())
    supervisor = next(line for line in setup if line.startswith("srun() {"))
    assert "-m ddpslurm.launch.batch --folder /jobs --world-size 2" in supervisor and '-- srun "$@"' in supervisor
    assert not any("--wait" in arg for arg in result.srun_args)
    no_requeue = plan(make_spec(SCRIPT, folder="/jobs", max_requeues=0)).executor_params["setup"]
    supervised = next(line for line in no_requeue if line.startswith("srun() {"))  # still the post-mortem
    assert "--max-requeues 0" in supervised and "--no-analyze" not in supervised
    bare = plan(make_spec(SCRIPT, folder="/jobs", max_requeues=0, analyze=False)).executor_params["setup"]
    assert not any(line.startswith("srun() {") for line in bare)


def test_master_port_is_chosen_by_flag_only() -> None:
    setup = plan(make_spec(SCRIPT, folder="/jobs", master_port=29511)).executor_params["setup"]
    unset = next(i for i, line in enumerate(setup) if line.startswith("unset "))
    assert setup[unset + 1] == "export MASTER_PORT=29511"  # after the unset of the inherited one
    with pytest.raises(UsageError, match="--master-port 80"):
        make_spec(SCRIPT, master_port=80)
