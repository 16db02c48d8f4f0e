"""`ddpslurm analyze` on the job folder layout of issue 43: rank files in per-host folders (`attempt_N/<host>/`),
one node file per node beside them; the older layout (every rank file straight in `attempt_N/`) still reads the same."""

from __future__ import annotations

import json
from pathlib import Path, PurePath

import pytest

from ddpslurm import jobfolder
from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.read.discover import discover
from ddpslurm.analyze.read.file_names import path_info
from ddpslurm.launch.node_live import node_record

RAISED = """Traceback (most recent call last):
  File "/home/me/train.py", line 12, in <module>
    main()
  File "/home/me/train.py", line 9, in main
    raise ValueError("bad batch at step 3")
ValueError: bad batch at step 3
"""


@pytest.mark.parametrize(("parts", "rank", "host", "attempt", "kind"), [
    (("attempt_0", "gpu-a", "rank_3.log"), 3, "gpu-a", 0, "log"),  # a host name with no digit: the folder says so
    (("attempt_2", "n01", "rank_12.exit.json"), 12, "n01", 2, "exit_record"),
    (("attempt_2", "n01", "rank_12.start.json"), 12, "n01", 2, "start_record"),
    (("attempt_1", "rank_3.log"), 3, None, 1, "log"),  # the older layout
    (("attempt_0", "0", "stdout.log"), None, None, 0, "log"),  # torchrun's --log-dir: local rank 0, not a host
])
def test_path_info_reads_host_folders(parts, rank, host, attempt, kind) -> None:
    info = path_info(PurePath(*parts))
    assert (info.rank, info.host, info.attempt, info.kind) == (rank, host, attempt, kind)


def _job(root: Path, layout: str) -> Path:
    """`node`: the records in the node files only (issue 43's last form); `new`: per-rank record files in the host
    folders beside node files holding an end's summary; `old`: every rank file straight in the attempt folder."""
    job = root / "job_5"
    attempt = jobfolder.attempt_folder(job, 0)
    for rank, host in ((0, "n1"), (1, "n2")):
        paths = jobfolder.rank_paths(attempt, rank, host if layout != "old" else None)
        text = RAISED if rank == 1 else "step 1\nstep 2\n"
        paths["log"].parent.mkdir(parents=True, exist_ok=True)
        paths["log"].write_text(text)
        status = "exception" if rank == 1 else "signal"
        record = {"schema": 1, "kind": "exit", "rank": rank, "host": host, "pid": 10, "job_id": "5", "attempt": 0,
                  "status": status, "exit_code": 1, "signal": None, "exception": None,
                  "time": f"2026-12-02T10:00:0{rank}.000000+00:00", "unix": 1.78e9 + rank}
        start = {"schema": 1, "kind": "start", "rank": rank, "host": host, "world_size": 2, "unix": 1.78e9 - 9}
        if layout == "node":
            state = {"rank": rank, "start": start, "exit": record}
        else:
            jobfolder.write_json(paths["exit"], record)
            state = {"rank": rank, "exit": {"status": status, "exit_code": 1}}
        if layout != "old":
            jobfolder.write_json(jobfolder.node_file_path(attempt, host), node_record(host, {rank: state}, 3, 5.0,
                                                                                      1.78e9))
    return job


@pytest.mark.parametrize("layout", ["node", "new", "old"])
def test_a_failing_rank_in_its_host_folder_is_named_with_its_host(tmp_path: Path, layout: str) -> None:
    got = analyze_paths([str(_job(tmp_path, layout))]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("user_code_exception", 1, "n2")
    assert not got["skipped"]


def test_node_files_hold_records_not_logs(tmp_path: Path) -> None:
    job = _job(tmp_path, "new")
    kinds = {Path(s.path).name: s.kind for s in discover([str(job)])}
    assert kinds["node_n1.json"] == kinds["node_n2.json"] == "node_record"
    assert kinds["rank_1.log"] == "log" and kinds["rank_1.exit.json"] == "exit_record"
    assert json.loads((job / "attempt_0" / "node_n2.json").read_text())["kind"] == "node"


def test_a_node_files_records_are_read_as_the_ranks_own_files_would_be(tmp_path: Path) -> None:
    """The exit events from the node files' records equal those from the same records in files of their own (only the
    file they cite differs); the older node files' summaries give none."""
    from ddpslurm.analyze.parse.records import record_events
    from ddpslurm.analyze.rules.loading import load_signatures

    sigs = load_signatures(())
    by_layout = {}
    for layout in ("node", "new"):
        job = _job(tmp_path / layout, layout)
        sources = [s for s in discover([str(job)]) if s.kind in ("node_record", "exit_record")]
        events = [e for s in sources for e in record_events(s, sigs)[0]]
        by_layout[layout] = sorted((e.kind, e.rank, e.cause, e.text) for e in events if e.kind != "start")
    assert by_layout["node"] == by_layout["new"] and by_layout["node"]
    job = _job(tmp_path / "summary", "new")
    node = next(s for s in discover([str(job)]) if s.kind == "node_record")
    assert record_events(node, sigs) == ([], {})


@pytest.mark.parametrize("host_folders", [True, False])
def test_a_record_in_both_its_node_file_and_its_own_file_is_read_once(tmp_path: Path, host_folders: bool) -> None:
    """An agent that confirmed a rank's exit after the rank's own wait ran out: the record is in both files, and
    analyze reads it once (from the node file), in either layout of the rank's own file; another attempt's node file
    does not hide it."""
    from ddpslurm.analyze.parse.records import all_record_events
    from ddpslurm.analyze.rules.loading import load_signatures

    job = _job(tmp_path, "node")
    attempt = jobfolder.attempt_folder(job, 0)
    node = json.loads(jobfolder.node_file_path(attempt, "n2").read_text())
    record = node["ranks"]["1"]["exit"]
    own = jobfolder.rank_paths(attempt, 1, "n2" if host_folders else None)["exit"]
    own.parent.mkdir(parents=True, exist_ok=True)
    jobfolder.write_json(own, record)
    other = jobfolder.attempt_folder(job, 1)
    other.mkdir(parents=True)
    jobfolder.write_json(jobfolder.node_file_path(other, "n2"), node)
    sigs = load_signatures(())
    sources = [s for s in discover([str(job)]) if s.kind in ("node_record", "exit_record", "start_record")]
    events, _facts, _notes = all_record_events(sources, sigs)
    exits = [(e.file, e.rank) for e in events if e.kind != "start" and e.rank == 1]
    assert len(exits) == 2  # attempt 0's, once (its node file), and attempt 1's node file
    assert all("node_n2.json" in file for file, _rank in exits)
    jobfolder.node_file_path(attempt, "n2").unlink()
    sources = [s for s in discover([str(job)]) if s.kind in ("node_record", "exit_record", "start_record")]
    events, _facts, _notes = all_record_events(sources, sigs)
    assert [e.file for e in events if e.kind != "start" and e.rank == 1 and "rank_1" in e.file]  # its own file then


def test_the_restart_bookkeeping_is_not_read_as_a_log(tmp_path: Path) -> None:
    """restarts.json, rendezvous_gave_up.json and below_min.json hold torch's error texts that the agents' logs hold
    too: read as logs they would be evidence twice (at line 1 of a JSON file)."""
    job = _job(tmp_path, "node")
    attempt = jobfolder.attempt_folder(job, 0)
    text = {"message": "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: join timeout"}
    for path in (attempt / "n1" / jobfolder.RESTARTS_FILE, attempt / "n1" / jobfolder.GAVE_UP_FILE,
                 attempt / jobfolder.BELOW_MIN_FILE):
        jobfolder.write_json(path, text)
    kinds = {Path(s.path).name: s.kind for s in discover([str(job)])}
    assert {kinds[jobfolder.RESTARTS_FILE], kinds[jobfolder.GAVE_UP_FILE], kinds[jobfolder.BELOW_MIN_FILE]} == {
        "hang_record"}
    got = analyze_paths([str(job)]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == ("user_code_exception", 1)
