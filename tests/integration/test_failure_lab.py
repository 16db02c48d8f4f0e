"""The failure lab (slurm/failure-lab): its scenario table, its committed cases, and a few scenarios live.

The live tests re-create fast scenarios on the real cluster through `ddpslurm submit` (with real gloo
DDP ranks and real faults), then check that `ddpslurm analyze` names the cause and the culprit that the
injection put there. The label is written from the injection, so a wrong diagnosis fails the test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "analyzer" / "cases"


def _load_lab():
    spec = importlib.util.spec_from_file_location("ddpslurm_failure_lab", REPO / "slurm" / "lab" / "lab.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


lab = _load_lab()
SCENARIOS = lab.load_scenarios()
LIVE = [s for s in SCENARIOS if s.live]
LAB_CASES = sorted(CASES.glob("lab-*/label.json"))


# --- the table and the pure helpers (no cluster) ------------------------------------------------------


def test_scenario_table_covers_many_causes_with_culprits_off_rank_zero_and_off_the_first_node() -> None:
    causes = {s.cause for s in SCENARIOS}
    assert len(causes) >= 15
    off_first = [s for s in SCENARIOS if s.culprit_rank and s.culprit_rank >= s.tasks_per_node]
    assert len(off_first) >= 5
    assert 3 <= len(LIVE) <= 5


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"name": "a", "cause": "no_such_cause", "description": "", "culprit_rank": 0}, "vocabulary"),
        ({"name": "a", "cause": "segfault", "description": "", "culprit_rank": 6}, "not one of its 6 ranks"),
        ({"name": "a", "cause": "segfault", "description": "", "culprit_rank": 0, "hook": "nuke"}, "unknown hook"),
        ({"name": "a", "cause": "segfault", "description": "", "culprit_rank": 0, "colour": "red"}, "unknown keys"),
    ],
)
def test_bad_scenario_rows_are_refused(row: dict, message: str) -> None:
    with pytest.raises(lab.LabError, match=message):
        lab.parse_scenarios({"defaults": {"nodes": 3, "tasks_per_node": 2}, "scenario": [row]})


def test_duplicate_scenario_names_are_refused() -> None:
    row = {"name": "a", "cause": "segfault", "description": "", "culprit_rank": 0}
    with pytest.raises(lab.LabError, match="duplicate"):
        lab.parse_scenarios({"scenario": [row, row]})


@pytest.mark.parametrize(
    ("value", "expected"), [("none", None), (0, 0), (5, 5)],
)
def test_culprit_rank_none_means_no_rank_at_fault(value: object, expected: int | None) -> None:
    row = {"name": "a", "cause": "slurm_cancelled", "description": "", "culprit_rank": value}
    assert lab.parse_scenarios({"defaults": {"nodes": 3, "tasks_per_node": 2}, "scenario": [row]})[0].culprit_rank \
        == expected


@pytest.mark.parametrize(
    ("tasks_per_node", "rank", "host"),
    [(2, 0, "n1"), (2, 1, "n1"), (2, 3, "n2"), (2, 5, "n3"), (1, 2, "n3"), (3, 4, "n2")],
)
def test_host_of_rank_follows_block_distribution(tasks_per_node: int, rank: int, host: str) -> None:
    assert lab.host_of_rank(["n1", "n2", "n3"], tasks_per_node, rank) == host


def test_host_of_rank_outside_the_allocation_is_an_error() -> None:
    with pytest.raises(lab.LabError):
        lab.host_of_rank(["n1", "n2"], 2, 4)


@pytest.mark.parametrize(
    ("existing", "expected"),
    [([], "lab-segfault-1"), (["lab-segfault-1"], "lab-segfault-2"), (["lab-segfault-2"], "lab-segfault-1"),
     (["lab-segfault-1", "lab-segfault-x", "lab-segfaults-2"], "lab-segfault-2")],
)
def test_next_case_dir_takes_the_first_free_number(tmp_path: Path, existing: list[str], expected: str) -> None:
    for name in existing:
        (tmp_path / name).mkdir()
    assert lab.next_case_dir(tmp_path, "segfault").name == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--fault-arg", "{node3}"], ("--fault-arg", "c-n03")), (["x{node1}y"], ("xc-n01y",)),
     (["{nodes}"], ("{nodes}",))],
)
def test_substitute_names_cluster_nodes(args: list[str], expected: tuple[str, ...]) -> None:
    assert lab.substitute(args, ["c-n01", "c-n02", "c-n03"]) == expected


@pytest.mark.parametrize(
    ("line", "kept"),
    [("[2026-11-22T17:59:43.444] [2815412.0] error: StepId=2815412.0 exceeded memory limit", True),
     ("[2026-11-22T17:59:18.725] _slurm_rpc_submit_batch_job: JobId=2815412 InitPrio=1", True),
     ("[2026-11-22T17:59:19.227] Launching batch job 2815412 for UID 0", True),
     ("[2026-11-22T17:59:19.227] Launching batch job 28154120 for UID 0", False),
     ("[2026-11-22T17:59:19.227] Launching batch job 12815412 for UID 0", False),
     ("[2026-11-22T17:59:19.227] sched: Allocate JobId=2815413 NodeList=lab-n[01-03]", False)],
)
def test_job_lines_keeps_only_the_jobs_own_lines(line: str, kept: bool) -> None:
    assert lab.job_lines([line + "\n"], "2815412") == ([line + "\n"] if kept else [])


@pytest.mark.parametrize(
    ("rows", "expected"),
    [("FAILED|1:0|lab-n[01-02]|00:00:09\n",
      {"state": "FAILED", "exit_code": "1:0", "nodelist": "lab-n[01-02]", "elapsed": "00:00:09"}),
     ("REQUEUED|0:0|lab-n[01-03]|00:00:20\nCANCELLED by 0|0:0|None assigned|00:00:00\n",
      {"state": "REQUEUED", "exit_code": "0:0", "nodelist": "lab-n[01-03]", "elapsed": "00:00:20",
       "final_state": "CANCELLED by 0"}),
     ("CANCELLED by 0|0:0|None assigned|00:00:00\n",
      {"state": "CANCELLED by 0", "exit_code": "0:0", "nodelist": "", "elapsed": "00:00:00"})],
)
def test_job_record_is_the_run_that_held_nodes(rows: str, expected: dict) -> None:
    assert lab.job_record(rows) == expected


def test_job_record_without_rows_is_an_error() -> None:
    with pytest.raises(lab.LabError, match="no job row"):
        lab.job_record("sacct: error: something\n")


def test_rank_pid_reads_the_latest_attempts_start_record(tmp_path: Path) -> None:
    for attempt, pid in ((0, 111), (2, 333), (10, 1010)):
        folder = tmp_path / f"attempt_{attempt}"
        folder.mkdir()
        (folder / "rank_3.start.json").write_text(json.dumps({"pid": pid, "host": f"h{attempt}"}))
    assert lab.rank_pid(tmp_path, 3) == (1010, "h10")
    with pytest.raises(lab.LabError, match="no start record of rank 4"):
        lab.rank_pid(tmp_path, 4)


def _settled(pid: int) -> None:
    """Wait until `pid` has finished its exec: Popen returns when the close-on-exec pipe closes, which the kernel
    does before it sets up the new program's arguments and environment (/proc/PID/environ is empty until then)."""
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{pid}/environ").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_process_job_id_reads_the_environment_of_a_live_process() -> None:
    proc = subprocess.Popen(["sleep", "30"], env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242"})
    try:
        _settled(proc.pid)
        assert lab.process_job_id(proc.pid) == "4242"
    finally:
        proc.kill()
        proc.wait()
    assert lab.process_job_id(proc.pid) is None  # reaped: no /proc entry
    bare = subprocess.Popen(["sleep", "30"], env={"PATH": "/usr/bin:/bin"})
    try:
        _settled(bare.pid)
        assert lab.process_job_id(bare.pid) is None
    finally:
        bare.kill()
        bare.wait()


def test_copy_job_leaves_out_pickles_and_checkpoints(tmp_path: Path) -> None:
    job = tmp_path / "job_7"
    (job / "attempt_0").mkdir(parents=True)
    (job / "checkpoints").mkdir()
    (job / "checkpoints" / "last.pt").write_bytes(b"x" * 100)
    (job / "7_submitted.pkl").write_bytes(b"pickle")
    (job / "7_0_log.out").write_text("hello\n")
    (job / "attempt_0" / "rank_0.log").write_text("log\n")
    size = lab.copy_job(job, tmp_path / "case")
    kept = sorted(str(p.relative_to(tmp_path / "case")) for p in (tmp_path / "case").rglob("*") if p.is_file())
    assert kept == ["7_0_log.out", "attempt_0/rank_0.log"]
    assert size == len("hello\n") + len("log\n")


# --- the committed lab cases --------------------------------------------------------------------------


@pytest.mark.parametrize("label_path", LAB_CASES, ids=[p.parent.name for p in LAB_CASES])
def test_committed_lab_case_is_labelled_from_its_injection(label_path: Path) -> None:
    label = json.loads(label_path.read_text())
    case = label_path.parent
    assert case.name.startswith(f"lab-{label['cause']}-")
    assert label["cause"] in lab.CAUSES
    assert label["source"].startswith("lab: real failure on the local cluster")
    assert label["first_failing_rank"] == label["injected"]["rank"]
    assert label["first_failing_host"] == label["injected"].get("host")
    assert not list(case.rglob("*.pkl")), "submitit pickles must not be kept"
    size = sum(p.stat().st_size for p in case.rglob("*") if p.is_file())
    assert size < 400 * 1024
    logs = [p for p in case.rglob("*") if p.suffix in (".log", ".out", ".err")]
    assert logs, "a case holds the job's logs"


# --- live scenarios on the real cluster ---------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("scenario", LIVE, ids=[s.name for s in LIVE])
def test_live_scenario_is_diagnosed_as_injected(slurm_cluster, scenario, tmp_path: Path) -> None:
    cluster = lab.Cluster(slurm_cluster.name)
    case = lab.run_scenario(cluster, scenario, tmp_path, log=lambda _: None)
    label = json.loads((case / "label.json").read_text())
    assert label["cause"] == scenario.cause and label["first_failing_rank"] == scenario.culprit_rank
    (case / "label.json").unlink()  # analyze sees the logs only
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", "--json", str(case)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == (
        label["cause"], label["first_failing_rank"], label["first_failing_host"]), got.get("summary")
    pure = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", "--json", str(case)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "DDPSLURM_PURE_SCAN": "1"})
    assert pure.returncode == 0, pure.stderr
    assert json.loads(pure.stdout) == got, "the pure-Python scanner, the reference, reads the job otherwise"
