"""`ddpslurm status` of a `submit --local` job, from its records (pure) and its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpslurm import jobfolder
from ddpslurm.launch.local_status import local_job_folder, status_from_records
from ddpslurm.scheduler.states import JobState

JOB = {"job_id": "4242", "executor": "local", "world_size": 2, "submit_unix": 100.0, "spec": {"job_name": "t"}}


def _exit(code: int, unix: float = 110.0) -> dict:
    return {"exit_code": code, "unix": unix}


@pytest.mark.parametrize(("exits", "alive", "state", "code"), [
    ([_exit(0), _exit(0)], False, JobState.COMPLETED, 0),
    ([_exit(0), _exit(2)], False, JobState.FAILED, 2),
    ([_exit(0), None], True, JobState.RUNNING, None),
    ([_exit(0), None], False, JobState.FAILED, None),  # killed: a rank left no exit record
])
def test_state_from_the_records(exits: list, alive: bool, state: JobState, code: int | None) -> None:
    status = status_from_records(JOB, exits, [{"host": "h1"}, None], alive, now=130.0)
    assert (status.state, status.exit_code, status.terminal) == (state, code, state is not JobState.RUNNING)
    assert status.nodelist == "h1" and status.name == "t" and status.source == "local"
    if state is JobState.FAILED and code is None:
        assert status.reason and "rank(s) 1 ended without an exit record" in status.reason
    assert status.elapsed_s == (10 if code is not None else 30)


def test_only_a_local_jobs_folder_is_taken(tmp_path: Path) -> None:
    local, slurm = jobfolder.job_folder(tmp_path, "4242"), jobfolder.job_folder(tmp_path, "77")
    for folder, executor in ((local, "local"), (slurm, "slurm")):
        folder.mkdir(parents=True)
        jobfolder.job_record_path(folder).write_text(json.dumps({"executor": executor}))
    assert local_job_folder(str(local)) == local.resolve()
    assert local_job_folder("4242", root=str(tmp_path)) == local.resolve()
    assert local_job_folder(str(slurm)) is None and local_job_folder("77", root=str(tmp_path)) is None
    assert local_job_folder("999", root=str(tmp_path)) is None
