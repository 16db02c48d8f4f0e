"""JobSpec validation: good flags give a spec, bad ones one UsageError/SubmitError with a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.errors import SubmitError, UsageError
from ddpslurm.launch.spec import make_spec
from ddpslurm.sbatch_values import parse_sbatch_args, parse_time


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


@pytest.mark.parametrize(("text", "seconds"), [
    ("1", 60), ("90", 5400), ("0:30", 30), ("10:00", 600), ("1:30:00", 5400), ("2-0", 172800),
    ("1-12:00", 129600), ("1-00:00:01", 86401), (" 5 ", 300),
])
def test_parse_time_accepts_slurm_forms(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "abc", "1h", "1:2:3:4", "-5", "1-", "0:00", "1.5"])
def test_parse_time_rejects_malformed(text: str) -> None:
    with pytest.raises(UsageError, match="--time"):
        parse_time(text)


@pytest.mark.parametrize(("items", "expected"), [
    ([], ()),
    (["mail-type=END"], (("mail-type", "END"),)),
    (["--reservation=r1", "exclusive="], (("reservation", "r1"), ("exclusive", ""))),
    (["mail_user=a@b.c"], (("mail-user", "a@b.c"),)),
    (["comment=a=b"], (("comment", "a=b"),)),
])
def test_parse_sbatch_args(items: list[str], expected: tuple) -> None:
    assert parse_sbatch_args(items) == expected


@pytest.mark.parametrize(("item", "fragment"), [
    ("exclusive", "has no '='"),
    ("=x", "not an sbatch option"),
    ("bad key=1", "not an sbatch option"),
    ("nodes=4", "Use --nodes"),
    ("time=10", "Use --time"),
    ("output=/x", "Use --folder"),
    ("signal=USR1@60", "Use --signal-delay"),
])
def test_parse_sbatch_args_rejects(item: str, fragment: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_sbatch_args([item])
    assert fragment in info.value.one_line()


@pytest.mark.parametrize(("kwargs", "tasks"), [
    ({}, 1), ({"gpus_per_node": 4}, 4), ({"gpus_per_node": 4, "tasks_per_node": 2}, 2),
    ({"gpus_per_node": 0}, 1), ({"tasks_per_node": 3}, 3),
])
def test_tasks_per_node_defaults(script: Path, kwargs: dict, tasks: int) -> None:
    assert make_spec(script, **kwargs).tasks_per_node == tasks


def test_spec_fields(script: Path, tmp_path: Path) -> None:
    spec = make_spec(str(script), ["--lr", "0.1"], nodes=3, tasks_per_node=2, time="1:00:00",
                     folder=tmp_path / "jobs", sbatch_args=["reservation=r"])
    assert spec.script == script.absolute()
    assert spec.script_args == ("--lr", "0.1")
    assert spec.world_size == 6
    assert spec.time_s == 3600 and spec.time_min == 60
    assert spec.folder == (tmp_path / "jobs").absolute()
    assert spec.sbatch_args == (("reservation", "r"),)


def test_time_min_rounds_up(script: Path) -> None:
    assert make_spec(script, time="1:30", signal_delay_s=10).time_min == 2


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"nodes": 0}, "--nodes 0"),
    ({"nodes": -2}, "--nodes -2"),
    ({"tasks_per_node": 0}, "--tasks-per-node 0"),
    ({"gpus_per_node": -1}, "--gpus-per-node -1"),
    ({"cpus_per_task": 0}, "--cpus-per-task 0"),
    ({"max_requeues": -1}, "--max-requeues -1"),
    ({"signal_delay_s": 0}, "--signal-delay 0"),
    ({"time": "5", "signal_delay_s": 300}, "leaves no time"),
    ({"time": "1", "signal_delay_s": 10}, "up to 60s earlier"),
    ({"time": "2", "signal_delay_s": 60}, "--signal-delay 59 or less, or raise --time to 3"),
    ({"time": "1", "signal_delay_s": 1}, "Raise --time to 2 (minutes) or more"),
    ({"launcher": "mpirun"}, "--launcher 'mpirun'"),
    ({"mem": "lots"}, "--mem 'lots'"),
    ({"interface": "eth0; rm -rf /"}, "--interface"),
    ({"job_name": "a b"}, "--job-name"),
    ({"local": True, "launcher": "torchrun"}, "--local"),
])
def test_make_spec_rejects(script: Path, kwargs: dict, fragment: str) -> None:
    with pytest.raises(UsageError) as info:
        make_spec(script, **kwargs)
    line = info.value.one_line()
    assert fragment in line
    assert "\n" not in line and info.value.hint


def test_missing_script(tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="does not exist"):
        make_spec(tmp_path / "nope.py")


def test_script_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="not a file"):
        make_spec(tmp_path)
