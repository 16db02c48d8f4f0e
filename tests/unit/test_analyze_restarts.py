"""`analyze` of a job that restarted in place (`submit --max-restarts N`): the run that ended the job by default, an
earlier restart with `--restart K`, never the runs mixed.

The job folders are made the way the node agents leave them (`ddpslurm.launch.restarts.set_aside` and
`append_record`, records from `ddpslurm.launch.records`, node files from `node_live.node_record`): each restart
renumbers the ranks, and a node lost in a restart keeps that restart's files under the usual names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path, PurePath

import pytest

from ddpslurm import jobfolder
from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.read.discover import discover, latest_restarts, restart_of, select_run
from ddpslurm.analyze.read.file_names import path_info
from ddpslurm.errors import UsageError
from ddpslurm.launch import records, restarts
from ddpslurm.launch.node_live import node_record
from tests.corpus.test_cases import validate_schema, vocabulary

T0 = 1.78e9


def raised(kind: str, message: str) -> str:
    return ("step 1\nstep 2\nTraceback (most recent call last):\n  File \"/home/u/fit.py\", line 40, in <module>\n"
            f"    loss = step(batch)\n  File \"/home/u/fit.py\", line 22, in step\n    raise {kind}(\"{message}\")\n"
            f"{kind}: {message}\n")


def write_run(attempt: Path, world: dict[int, str], t: float, culprit: tuple[int, str, str] | None) -> None:
    """One run's rank logs and node files: ranks `world` (rank -> host), `culprit` (rank, type, message) raising."""
    by_host: dict[str, dict[int, dict]] = {}
    for rank, host in sorted(world.items()):
        paths = jobfolder.rank_paths(attempt, rank, host)
        paths["log"].parent.mkdir(parents=True, exist_ok=True)
        paths["log"].write_text(raised(*culprit[1:]) if culprit and rank == culprit[0] else "step 1\nstep 2\n")
        local = sorted(r for r, h in world.items() if h == host).index(rank)
        start = records.start_record(rank=rank, local_rank=local, node_rank=0, world_size=len(world),
                                     local_world_size=2, host=host, pid=4000 + rank, job_id="31", step_id="0",
                                     attempt=int(attempt.name.split("_")[1]), launcher="torchrun",
                                     master_addr="gpu-b07", master_port=10031, unix=t, versions={}, env={})
        state: dict = {"rank": rank, "start": start}
        if culprit and rank == culprit[0]:
            state["exit"] = records.exit_record(rank=rank, host=host, pid=4000 + rank, job_id="31",
                                                attempt=start["attempt"], status="exception", exit_code=1,
                                                unix=t + 7, exception={"type": culprit[1], "message": culprit[2]})
        by_host.setdefault(host, {})[rank] = state
    for host, states in by_host.items():
        jobfolder.write_json(jobfolder.node_file_path(attempt, host), node_record(host, states, 4, 5.0, t + 8))


def restart(attempt: Path, hosts: list[str], k: int, reason: str, t: float) -> None:
    """What each agent of `hosts` does as restart `k` starts: restart k-1's files set aside, an entry recorded."""
    for host in hosts:
        folder = jobfolder.host_folder(attempt, host)
        moved = restarts.set_aside(folder, k - 1, jobfolder.node_file_path(attempt, host))
        restarts.append_record(folder, restarts.restart_entry(restart=k, max_restarts=3, host=host, reason=reason,
                                                              failed=[], moved=moved, unix=t))


HOSTS = ["gpu-b07", "gpu-b11", "gpu-c02"]


def restarted_job(root: Path, attempt: int = 0) -> Path:
    """Restart 0: rank 1 (gpu-b07) raises, all nodes restart. Restart 1: node gpu-c02 is lost mid-run (its agent
    never sets restart 1 aside). Restart 2, on 4 ranks renumbered over the two nodes left: rank 2 (gpu-b11) raises,
    the job ends."""
    job = root / "job_31"
    folder = jobfolder.attempt_folder(job, attempt)
    six = {r: HOSTS[r // 2] for r in range(6)}
    write_run(folder, six, T0, (1, "RuntimeError", "first start broke"))
    restart(folder, HOSTS, 1, restarts.WORKER_FAILED, T0 + 10)
    write_run(folder, six, T0 + 20, None)
    restart(folder, HOSTS[:2], 2, restarts.MEMBERSHIP_CHANGED, T0 + 40)
    write_run(folder, {r: HOSTS[r // 2] for r in range(4)}, T0 + 50, (2, "ValueError", "final run broke"))
    jobfolder.write_json(job / "ddpslurm.json", {"spec": {"max_restarts": 3}})
    return job


@pytest.mark.parametrize(("parts", "rank", "host", "restart", "kind"), [
    (("attempt_0", "gpu-b07", "rank_3.log"), 3, "gpu-b07", None, "log"),
    (("attempt_0", "gpu-b07", "restart_2", "rank_3.log"), 3, "gpu-b07", 2, "log"),
    (("attempt_1", "gpu-b07", "restart_0", "rank_3.exit.json"), 3, "gpu-b07", 0, "exit_record"),
    (("attempt_1", "nodea", "restart_12", "rank_0.start.json"), 0, "nodea", 12, "start_record"),
    (("attempt_0", "gpu-b07", "restart_1", "node_gpu-b07.json"), None, "gpu-b07", 1, "log"),
    (("attempt_0", "node_gpu-b07.json"), None, None, None, "log"),
])
def test_path_info_of_restart_folders(parts, rank, host, restart, kind) -> None:
    info = path_info(PurePath(*parts))
    assert (info.rank, info.host, info.restart, info.kind) == (rank, host, restart, kind)


def test_discover_numbers_each_file_by_its_restart(tmp_path: Path) -> None:
    job = restarted_job(tmp_path)
    sources = discover([str(job)])
    latest = latest_restarts(sources)
    assert latest == {(0, "gpu-b07"): 2, (0, "gpu-b11"): 2, (0, "gpu-c02"): 1}
    by_name = {os.path.relpath(s.path, job): (s.kind, restart_of(s, latest)) for s in sources}
    assert by_name["attempt_0/gpu-b07/restart_0/node_gpu-b07.json"] == ("node_record", 0)
    assert by_name["attempt_0/gpu-b07/restart_1/rank_1.log"] == ("log", 1)
    assert by_name["attempt_0/gpu-b07/rank_1.log"] == ("log", 2)
    assert by_name["attempt_0/node_gpu-b11.json"] == ("node_record", 2)
    # the lost node's usual names are its last restart's, not the final run's
    assert by_name["attempt_0/gpu-c02/rank_5.log"] == ("log", 1)
    assert by_name["attempt_0/node_gpu-c02.json"] == ("node_record", 1)
    assert by_name["attempt_0/gpu-b07/restarts.json"] == ("hang_record", 2)  # bookkeeping, no evidence
    assert by_name["ddpslurm.json"] == ("job_record", None)


def test_the_run_that_ended_the_job_is_diagnosed_by_default(tmp_path: Path) -> None:
    got = analyze_paths([str(restarted_job(tmp_path))]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("user_code_exception", 2,
                                                                                      "gpu-b11")
    assert {r["rank"] for r in got["ranks"]} == {0, 1, 2, 3}
    assert {r["host"] for r in got["ranks"]} == {"gpu-b07", "gpu-b11"}  # the node lost earlier is not in it
    assert all("restart_" not in e["file"] for e in got["evidence"])
    assert got["run"] == {"attempt": 0, "restart": 2, "restarts": [0, 1, 2], "final_restart": 2}
    assert validate_schema(got, set(vocabulary())) == []
    note = next(n for n in got["notes"] if "restarted in place" in n)
    assert "2 time(s)" in note and "--restart K" in note and "restart_<K>" in note


def test_an_earlier_restart_is_diagnosed_on_its_own(tmp_path: Path) -> None:
    job = restarted_job(tmp_path)
    got = analyze_paths([str(job)], restart="0").to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("user_code_exception", 1,
                                                                                      "gpu-b07")
    assert {r["rank"] for r in got["ranks"]} == set(range(6))
    assert got["evidence"] and all("/gpu-b07/restart_0/" in e["file"] for e in got["evidence"])
    assert got["run"]["restart"] == 0 and any("not the run that ended it" in n for n in got["notes"])
    # restart 1: the lost node's files (its usual names) with the others' restart_1/
    lost = analyze_paths([str(job)], restart=1).to_dict()
    assert {r["host"] for r in lost["ranks"]} == set(HOSTS) and {r["rank"] for r in lost["ranks"]} == set(range(6))
    assert lost["cause"] != "user_code_exception" and not any("broke" in e["text"] for e in lost["evidence"])


def test_all_restarts_together_and_all_attempts(tmp_path: Path) -> None:
    job = restarted_job(tmp_path)
    together = analyze_paths([str(job)], restart="all").to_dict()
    assert together["run"]["restart"] == "all" and any("read together" in n for n in together["notes"])
    everything = analyze_paths([str(job)], attempt="all").to_dict()
    assert everything["run"]["attempt"] == "all" and any("--attempt all" in n for n in everything["notes"])
    with pytest.raises(UsageError, match="a restart is one attempt's"):
        analyze_paths([str(job)], attempt="all", restart="1")
    with pytest.raises(UsageError, match=r"restart 3 is not in attempt 0 \(restarts found: 0, 1, 2"):
        analyze_paths([str(job)], restart="3")


def test_the_attempt_chosen_has_its_own_restarts(tmp_path: Path) -> None:
    """Attempt 0 restarted in place then the job was requeued; attempt 1 ran once: the last attempt by default (no
    `run` field: nothing restarted in it), attempt 0's last restart with --attempt 0."""
    job = restarted_job(tmp_path)
    write_run(jobfolder.attempt_folder(job, 1), {0: "gpu-c02", 1: "gpu-c02"}, T0 + 900,
              (0, "KeyError", "'epoch' after requeue"))
    got = analyze_paths([str(job)]).to_dict()
    assert (got["first_failing_rank"], got["first_failing_host"]) == (0, "gpu-c02")
    assert "run" not in got and not any("restarted in place" in n for n in got["notes"])
    older = analyze_paths([str(job)], attempt="0").to_dict()
    assert (older["first_failing_rank"], older["first_failing_host"], older["run"]["restart"]) == (2, "gpu-b11", 2)
    assert analyze_paths([str(job)], attempt="0", restart="0").to_dict()["first_failing_host"] == "gpu-b07"
    with pytest.raises(UsageError, match=r"restart 1 is not in attempt 1 \(restarts found: 0;"):
        analyze_paths([str(job)], restart="1")


def test_a_job_that_never_restarted_keeps_its_json(tmp_path: Path) -> None:
    job = tmp_path / "job_8"
    write_run(jobfolder.attempt_folder(job, 0), {0: "n1", 1: "n2"}, T0, (1, "ValueError", "bad"))
    got = analyze_paths([str(job)]).to_dict()
    assert "run" not in got and (got["first_failing_rank"], got["first_failing_host"]) == (1, "n2")
    asked = analyze_paths([str(job)], restart="0").to_dict()  # the only run, asked for: named, no note
    assert asked["run"] == {"attempt": 0, "restart": 0, "restarts": [0], "final_restart": 0}
    assert asked["notes"] == got["notes"]
    loose = tmp_path / "pasted.log"
    loose.write_text(raised("ValueError", "bad"))
    with pytest.raises(UsageError, match="no in-place restarts"):
        analyze_paths([str(loose)], restart="2")
    assert analyze_paths([str(loose)], restart="last").to_dict()["run"] == {
        "attempt": None, "restart": None, "restarts": [], "final_restart": None}


def test_select_run_keeps_the_attempts_own_files(tmp_path: Path) -> None:
    """hang.json, requeue.json (no host) and the job folder's files are in every restart's selection."""
    job = restarted_job(tmp_path)
    (job / "attempt_0" / "requeue.json").write_text("{}")
    (job / "31_0_log.err").write_text("srun: error: gpu-c02: task 2: Killed\n")
    sources = discover([str(job)])
    for wanted in ("0", "1", "2"):
        names = {os.path.relpath(s.path, job) for s in select_run(sources, None, wanted)[0]}
        assert {"attempt_0/requeue.json", "31_0_log.err", "ddpslurm.json"} <= names


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_restart_option(tmp_path: Path) -> None:
    job = restarted_job(tmp_path)
    done = cli(str(job), "--restart", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["first_failing_host"] == "gpu-b07"
    for bad, text in (("soon", "--restart 'soon' is not a number"), ("9", "restart 9 is not in attempt 0")):
        failed = cli(str(job), "--restart", bad)
        lines = [ln for ln in failed.stderr.splitlines() if ln.strip()]
        assert failed.returncode == 2 and len(lines) == 1 and text in lines[0], failed.stderr


def test_markdown_names_the_run(tmp_path: Path) -> None:
    from ddpslurm.analyze.report.text import to_markdown

    job = restarted_job(tmp_path / "a")
    assert "**Run:** attempt 0, restart 2 (the run that ended it)" in to_markdown(analyze_paths([str(job)]))
    assert "restart 0 (the run that ended it is restart 2)" in to_markdown(analyze_paths([str(job)], restart=0))
    assert "all its in-place restarts (0 to 2)" in to_markdown(analyze_paths([str(job)], restart="all"))
    plain = tmp_path / "b" / "job_8"
    write_run(jobfolder.attempt_folder(plain, 0), {0: "n1", 1: "n2"}, T0, (1, "ValueError", "bad"))
    assert "**Run:**" not in to_markdown(analyze_paths([str(plain)]))
