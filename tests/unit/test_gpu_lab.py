"""The GPU lab (slurm/lab/gpu_check.py, ddp_fault.py's --device cuda): its table, its judgement, the cases it keeps,
and what a real NCCL job on an H100 left behind (tests/data/gpu-healthy-nccl, produced by the runner)."""

from __future__ import annotations

import calendar
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "slurm" / "lab"))

import ddp_fault  # noqa: E402
import gpu_check  # noqa: E402

from ddpslurm.analyze.api import analyze_paths  # noqa: E402
from ddpslurm.analyze.model import CAUSES  # noqa: E402
from ddpslurm.analyze.parse.timestamps import parse_time  # noqa: E402

HEALTHY_JOB = REPO / "tests" / "data" / "gpu-healthy-nccl"


@pytest.mark.parametrize("scenario", gpu_check.SCENARIOS, ids=lambda s: s.name)
def test_scenario_is_launchable(scenario: gpu_check.Scenario) -> None:
    """Every scenario names a cause of the vocabulary, a culprit among its ranks, and arguments its script takes."""
    assert scenario.cause is None or scenario.cause in CAUSES
    assert scenario.culprit_rank is None or 0 <= scenario.culprit_rank < scenario.tasks
    assert scenario.script.is_file()
    if scenario.script == gpu_check.FAULT_SCRIPT:
        args = ddp_fault.parse_args(list(scenario.script_args))
        assert args.device == "cuda"
        if args.fault != "none":
            assert args.fault_rank == scenario.culprit_rank


def test_scenario_names_are_unique() -> None:
    names = [s.name for s in gpu_check.SCENARIOS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("argv", [["--backend", "nccl"], ["--fault", "cuda-oom"], ["--fault", "gpu-hang"],
                                  ["--fault", "device-assert", "--device", "cpu"]])
def test_gpu_faults_need_a_gpu(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        ddp_fault.parse_args(argv)
    assert stop.value.code == 2 and "needs --device cuda" in capsys.readouterr().err


def test_judge() -> None:
    failing = gpu_check.Scenario("x", "cuda_oom", 1, 4, 1, gpu_check.FAULT_SCRIPT, (), "d")
    want = gpu_check.expected(failing, "gpu-9")
    assert want == {"cause": "cuda_oom", "first_failing_rank": 1, "first_failing_host": "gpu-9"}
    assert gpu_check.judge(failing, want, dict(want)) == []
    got = {**want, "first_failing_rank": 3}
    assert gpu_check.judge(failing, want, got) == ["first_failing_rank: expected 1, got 3"]
    healthy = gpu_check.Scenario("h", None, None, 2, 1, gpu_check.TRAIN_SCRIPT, (), "d")
    assert gpu_check.expected(healthy, "gpu-9")["first_failing_host"] is None
    ok = {"ranks": [{"rank": 0, "role": "ok"}, {"rank": 1, "role": "ok"}]}
    assert gpu_check.judge(healthy, {}, ok) == []
    assert gpu_check.judge(healthy, {}, {"ranks": [{"rank": 0, "role": "ok"}, {"rank": 1, "role": "victim"}]})


def test_kept_case_has_the_logs_and_a_label_but_no_pickles(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "job_7"
    (job / "attempt_0").mkdir(parents=True)
    (job / "attempt_0" / "rank_0.log").write_text("hello\n")
    (job / "7_submitted.pkl").write_bytes(b"\x80\x04")
    (job / "checkpoints").mkdir()
    (job / "checkpoints" / "last.pt").write_bytes(b"x")
    scenario = gpu_check.SCENARIOS[1]
    found = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "cuda": "13.0", "nccl": "2.28.9", "gpus": 1}
    case = gpu_check.keep_case(scenario, job, tmp_path / "cases", gpu_check.expected(scenario, "vm"), found, {})
    assert case.name == f"gpu-lab-{scenario.name.replace('_', '-')}"
    assert sorted(p.relative_to(case).as_posix() for p in case.rglob("*") if p.is_file()) == [
        "attempt_0/rank_0.log", "label.json"]
    label = json.loads((case / "label.json").read_text())
    assert label["cause"] == scenario.cause and "NCCL 2.28.9" in label["source"]


def test_without_a_gpu_it_says_so(tmp_path: Path) -> None:
    """On a machine without a GPU (CI) the runner stops with one line, before any job."""
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--out", str(tmp_path), "healthy_nccl"])
    assert "torch sees no GPU" in str(stop.value)
    assert not (tmp_path / "jobs").exists()


def test_unknown_scenario_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_check.main(["no_such_thing"])
    assert "no scenario no_such_thing" in capsys.readouterr().err


def test_a_healthy_real_nccl_job_has_no_failing_rank() -> None:
    """A job that completed on an H100 (NCCL 2.28.9, every INFO line stamped): NCCL's chatter (no IB device, no
    plugin, dlvsym failures, 'Could not get speed') is no failure."""
    got = analyze_paths([HEALTHY_JOB]).to_dict()
    assert got["first_failing_rank"] is None
    assert got["ranks"] and all(row["role"] == "ok" for row in got["ranks"])
    assert got["summary"].startswith("Every rank (1) ended normally"), got["summary"]
    assert got["cause"] == "none" and got["evidence"] == [] and got["confidence"] == "high"


def test_a_job_with_a_rank_that_left_no_exit_record_is_not_called_normal(tmp_path: Path) -> None:
    """The same healthy job with rank 0's exit record gone: nothing says it ended, so no 'ended normally'."""
    import shutil

    job = tmp_path / "job"
    shutil.copytree(HEALTHY_JOB, job)
    (job / "attempt_0" / "rank_0.exit.json").unlink()
    got = analyze_paths([job]).to_dict()
    assert "ended normally" not in got["summary"] and got["cause"] != "none"


def test_nccl_info_lines_carry_their_time() -> None:
    """The worker's NCCL_DEBUG_TIMESTAMP_LEVELS=ALL stamps INFO lines; the analyzer reads the stamp."""
    log = (HEALTHY_JOB / "attempt_0" / "rank_0.log").read_text().splitlines()
    info = next(line for line in log if "NCCL INFO" in line and "Init START" in line)
    got = parse_time(info, None)
    assert got is not None and got[1] == "iso"
    assert calendar.timegm((2026, 11, 27, 0, 0, 0, 0, 0, 0)) < got[0] < calendar.timegm((2026, 11, 28, 0, 0, 0))


def test_versions_are_the_doctor_probes() -> None:
    """The runner records what `ddpslurm doctor`'s probe reads (asked in a child: the runner never imports torch),
    and a GPU's name only where the probe counts one."""
    from ddpslurm.doctor.probe import software

    found = gpu_check.versions()
    expected, gpus = software()
    assert {k: found[k] for k in expected} == expected
    assert found["gpus"] == gpus
    assert (found["gpu"] is None) == (not gpus)
