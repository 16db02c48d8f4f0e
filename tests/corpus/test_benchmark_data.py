"""The benchmark's generated job is a valid corpus-style case: right layout, rank mapping, and diagnosable.

Also pins `benchmarks/case_index.py`'s layout detection, which the case index in analyzer/cases/README.md uses.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_big_job = _load("make_big_job")
case_index = _load("case_index")


@pytest.fixture(scope="module")
def small_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("big_job")
    planted = make_big_job.generate(out, ranks=16, gb=0.004, gpn=8, seed=3)
    return out, planted


def test_generated_layout_and_rank_mapping(small_job: tuple[Path, dict]) -> None:
    out, planted = small_job
    outs = sorted(out.glob("*_log.out"))
    assert len(outs) == 16 and len(list(out.glob("*_log.err"))) == 16
    for path in outs:
        task = int(path.name.split("_")[1])
        text = path.read_text()
        complete = re.findall(r"rank (\d+) nranks 16 .* - Init COMPLETE", text)
        assert complete == [str(task)], f"{path.name}: Init COMPLETE names {complete}"
        assert f"hostname={make_big_job.host_of(task, 8)}," in text
    total = sum(p.stat().st_size for p in out.glob("*_log.*"))
    assert total >= 0.004e9
    culprit_err = (out / f"{make_big_job.JOB_ID}_{planted['first_failing_rank']}_log.err").read_text()
    assert "torch.OutOfMemoryError: CUDA out of memory" in culprit_err
    victims = [p for p in out.glob("*_log.err") if "Watchdog caught collective operation timeout" in p.read_text()]
    assert len(victims) == 15


def test_generated_job_is_diagnosed_as_planted(small_job: tuple[Path, dict]) -> None:
    from ddpslurm.analyze.api import analyze_paths

    out, planted = small_job
    got = analyze_paths([out]).to_dict()
    want = json.loads((out / "PLANTED.json").read_text())
    assert want == planted
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == \
        (want["cause"], want["first_failing_rank"], want["first_failing_host"]), got["summary"]


@pytest.mark.parametrize(("files", "expected"), [
    (["job_7/attempt_0/rank_0.log", "job_7/attempt_0/rank_0.start.json"], "ddpslurm job folder"),
    (["run_x/attempt_0/1/stderr.log", "run_x/attempt_0/1/error.json"], "torchrun --log-dir + error.json"),
    (["run_x/attempt_0/0/stdout.log"], "torchrun --log-dir"),
    (["12_0_log.out", "12_0_log.err"], "submitit folder"),
    (["slurm-99.out"], "slurm-J.out"),
    (["slurm-99.out", "journalctl-k-n1.txt"], "slurm-J.out + journalctl"),
    (["pasted.log"], "pasted log (pasted.log)"),
])
def test_case_layout(tmp_path: Path, files: list[str], expected: str) -> None:
    for name in [*files, "label.json"]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
    assert case_index.layout(tmp_path) == expected


@pytest.mark.parametrize(("layout", "scenario", "gpn", "culprit"), [
    ("submitit", "straggler", 8, 11), ("torchrun", "oom", 8, 9), ("merged", "straggler", 4, 6),
    ("submitit", "memkill", 8, 8), ("submitit", "memkill", 8, 15), ("merged", "memkill", 4, 5),
    ("submitit", "memkill", 1, 3), ("submitit", "ibfail", 4, 6), ("merged", "ibfail", 2, 15),
    ("submitit", "segv", 4, 6), ("merged", "segv", 2, 15), ("submitit", "segv", 4, 0),
    ("submitit", "inithang", 8, 11), ("merged", "inithang", 4, 0), ("submitit", "inithang", 1, 15),
    ("submitit", "latelost", 4, 6), ("merged", "latelost", 2, 15), ("torchrun", "latelost", 8, 9),
    ("submitit", "desync", 4, 6), ("merged", "desync", 2, 15), ("torchrun", "desync", 8, 9),
    ("submitit", "desync", 8, 0),
])
def test_every_scenario_and_layout_is_diagnosed_as_planted(tmp_path: Path, layout: str, scenario: str, gpn: int,
                                                           culprit: int) -> None:
    """What analyze_scale.py measures at 16k ranks, at 16: the culprit at a node's first or last GPU included."""
    from ddpslurm.analyze.api import analyze_paths

    planted = make_big_job.generate(tmp_path, ranks=16, gb=0.002, gpn=gpn, seed=5, layout=layout, culprit=culprit,
                                    scenario=scenario)
    got = analyze_paths([tmp_path]).to_dict()
    want_rank = None if scenario == "ibfail" else culprit  # a failed HCA: its node, no rank (it reported nothing)
    assert (planted["first_failing_rank"], planted["first_failing_host"]) == (want_rank, make_big_job.host_of(culprit,
                                                                                                            gpn))
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == \
        (planted["cause"], want_rank, planted["first_failing_host"]), got["summary"]


def test_memkill_terminates_every_other_task_once() -> None:
    """srun's lines name each task but the culprit exactly once, as ranges per node."""
    from ddpslurm.analyze.diagnose.resolve import expand_ranks

    for gpn, culprit in ((8, 0), (8, 7), (8, 12), (4, 5), (1, 3)):
        lines = make_big_job.killed_srun_lines(16, gpn, culprit, "Out Of Memory")
        assert lines[0].endswith(f"task {culprit}: Out Of Memory")
        ended = [r for line in lines for m in re.finditer(r"tasks? ([\d,-]+): Terminated$", line)
                 for r in expand_ranks(m[1])]
        assert sorted(ended) == [r for r in range(16) if r != culprit], (gpn, culprit)


@pytest.mark.parametrize("scenario", ["memkill", "ibfail", "segv", "inithang"])
def test_srun_scenarios_are_refused_where_srun_tasks_are_nodes(tmp_path: Path, scenario: str) -> None:
    with pytest.raises(ValueError, match="torchrun"):
        make_big_job.generate(tmp_path, ranks=32, gb=0.001, gpn=8, seed=1, layout="torchrun", scenario=scenario)


@pytest.mark.parametrize("scenario", ["ibfail", "segv"])
def test_peer_scenarios_need_peers_on_two_other_nodes(tmp_path: Path, scenario: str) -> None:
    with pytest.raises(ValueError, match="3 nodes"):
        make_big_job.generate(tmp_path, ranks=16, gb=0.001, gpn=8, seed=1, scenario=scenario)


def test_inithang_stops_every_rank_at_nccl_init(tmp_path: Path) -> None:
    """The culprit logs no NCCL line; every other rank's NCCL lines end at `Init START`; Slurm's time limit ends it."""
    make_big_job.generate(tmp_path, ranks=16, gb=0.002, gpn=4, seed=5, culprit=6, scenario="inithang")
    for r in range(16):
        out = (tmp_path / f"{make_big_job.JOB_ID}_{r}_log.out").read_text().splitlines()
        nccl = [line for line in out if "NCCL" in line]
        assert (nccl == []) if r == 6 else nccl[-1].endswith("Init START"), r
    assert "DUE TO TIME LIMIT" in (tmp_path / f"{make_big_job.JOB_ID}_0_log.err").read_text()


def test_segv_lets_the_other_tasks_end_on_their_own() -> None:
    """No --kill-on-bad-exit: srun names the dead task first, then every other task once, aborted by its watchdog,
    and never says it aborted the step."""
    from ddpslurm.analyze.diagnose.resolve import expand_ranks

    lines = make_big_job.srun_lines(16, 4, 9, "submitit", "segv")
    assert lines[0].endswith("task 9: Segmentation fault (core dumped)")
    ended = [r for line in lines[1:] for m in re.finditer(r"tasks? ([\d,-]+): Aborted \(core dumped\)$", line)
             for r in expand_ranks(m[1])]
    assert sorted(ended) == [r for r in range(16) if r != 9]
    assert not any("Job step aborted" in line for line in lines)


def test_a_refused_job_leaves_an_earlier_one_in_its_folder(tmp_path: Path) -> None:
    make_big_job.generate(tmp_path, ranks=16, gb=0.001, gpn=8, seed=1)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="3 nodes"):
        make_big_job.generate(tmp_path, ranks=16, gb=0.001, gpn=8, seed=1, scenario="ibfail")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_desync_leaves_half_the_ranks_without_a_timeout_of_their_own(tmp_path: Path) -> None:
    """The ranks of odd nodes and the culprit log only the dump signal the store brought them, so the culprit is
    not the one rank absent from the timeouts; its last enqueued work, one behind the others', is what names it."""
    make_big_job.generate(tmp_path, ranks=16, gb=0.002, gpn=4, seed=5, culprit=6, scenario="desync")
    for r in range(16):
        err = (tmp_path / f"{make_big_job.JOB_ID}_{r}_log.err").read_text()
        assert ("Watchdog caught" in err) == (r // 4 % 2 == 0 and r != 6), r
        assert f"Last enqueued NCCL work: {80000 if r == 6 else 80001}," in err, r
        assert ("from this local rank" in err) == ("Watchdog caught" in err), r


def test_desync_needs_two_nodes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 nodes"):
        make_big_job.generate(tmp_path, ranks=16, gb=0.001, gpn=16, seed=1, scenario="desync")


@pytest.mark.parametrize("scenario", ["desync", "latelost"])
def test_torchrun_srun_lines_name_each_node_once(scenario: str) -> None:
    """Under torchrun srun's tasks are the nodes' agents: one exit line per node, the first watchdog's node first."""
    lines = make_big_job.srun_lines(32, 8, 9, "torchrun", scenario)
    assert [re.search(r"task (\d+):", line)[1] for line in lines] == ["0", "1", "2", "3"]
    assert make_big_job.srun_lines(32, 8, 0, "torchrun", scenario)[0].endswith("task 0: Exited with exit code 1")
