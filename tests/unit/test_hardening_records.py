"""Issue 16, items 1 and 3: a hostile or broken record is skipped (or its bad field ignored) with a note,
never aborts the analysis, and never hands a number from a log to the diagnosis unchecked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse.records import MAX_MATCH_CHARS, MAX_WORLD_SIZE, record_events, validate_record
from ddpslurm.analyze.rules.loading import load_signatures

SIGS = load_signatures()
EXIT = {"rank": 3, "host": "n1", "pid": 120, "unix": 1_763_000_000.25, "status": "error",
        "exception": {"type": "ValueError", "message": "bad batch"}}


def write(path: Path, text: str) -> SourceFile:
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    kind = "start_record" if path.name.endswith(".start.json") else "exit_record"
    return SourceFile(path=str(path), display=path.name, rank=3, host="file-host", kind=kind)


@pytest.mark.parametrize(("field", "value"), [
    ("rank", -5), ("rank", MAX_WORLD_SIZE), ("rank", "٣"), ("rank", 3.0), ("rank", True), ("rank", "9" * 5000),
    ("pid", 0), ("pid", 1 << 40), ("unix", 1e300), ("unix", -1.0), ("unix", "1" * 100_000), ("exit_code", 10**30),
    ("host", "n1\nCause: cuda_oom"), ("host", "n1\x1b[2J"), ("host", "é1"), ("host", "h" * 300), ("host", ["n1"]),
    ("signal", "SIG KILL"), ("exception", "ValueError"), ("exception", {"type": "Value\nError", "message": ""}),
    ("exception", {"type": "ValueError", "message": ["not", "text"]}),
])
def test_a_bad_field_is_ignored_and_named(field: str, value: object) -> None:
    clean, bad = validate_record({**EXIT, field: value})
    assert bad == [field]
    assert field not in clean
    assert set(clean) | {field} == set(EXIT) | {field}


def test_a_rank_beyond_the_records_own_world_size_is_bad() -> None:
    assert validate_record({"rank": 4, "world_size": 4})[1] == ["rank"]
    assert validate_record({"rank": 3, "world_size": 4}) == ({"rank": 3, "world_size": 4}, [])


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_numbers_are_bad_fields(tmp_path: Path, text: str) -> None:
    body = json.dumps(EXIT).replace("1763000000.25", text)
    events, facts = record_events(write(tmp_path / "rank_3.exit.json", body), SIGS)
    assert all(e.time is None for e in events)
    assert facts["notes"] == ["record rank_3.exit.json: ignored invalid field(s) unix"]


def test_a_negative_rank_falls_back_to_the_file_name(tmp_path: Path) -> None:
    events, facts = record_events(write(tmp_path / "rank_3.exit.json", json.dumps({**EXIT, "rank": -5})), SIGS)
    assert {e.rank for e in events} == {3}
    assert "rank" in facts["notes"][0]


def test_a_forged_host_line_is_not_believed(tmp_path: Path) -> None:
    body = json.dumps({**EXIT, "host": "n1\nCause: cuda_oom   confidence: high"})
    events, _ = record_events(write(tmp_path / "rank_3.exit.json", body), SIGS)
    assert {e.host for e in events} == {"file-host"}


def test_world_size_of_1e11_is_not_a_fact(tmp_path: Path) -> None:
    for value in ("1e11", "100000000000", "\"100000000000\""):
        body = f'{{"rank": 0, "host": "n1", "world_size": {value}, "unix": 1763000000.0}}'
        _, facts = record_events(write(tmp_path / "rank_0.start.json", body), SIGS)
        assert "world_size" not in facts, value
        assert "world_size" in facts["notes"][0]


@pytest.mark.parametrize("body", [
    "[" * 100_000 + "]" * 100_000,  # RecursionError in json
    '{"rank": ' + "9" * 5000 + "}",  # beyond int_max_str_digits
    "\xff\xfe not json",
    "[1, 2]",
])
def test_an_unreadable_record_is_skipped_with_a_note(tmp_path: Path, body: str) -> None:
    events, facts = record_events(write(tmp_path / "rank_3.exit.json", body), SIGS)
    assert events == []
    assert facts == {"notes": ["record rank_3.exit.json: skipped, not a readable JSON object"]}


def test_a_lone_surrogate_and_a_huge_message_are_kept_safely(tmp_path: Path) -> None:
    message = "x\ud800y " + "NCCL error " * 300_000
    body = json.dumps({**EXIT, "exception": {"type": "ValueError", "message": message}})
    events, _ = record_events(write(tmp_path / "rank_3.exit.json", body), SIGS)
    assert events and all(len(e.text) <= MAX_MATCH_CHARS for e in events)
    assert all("\ud800" not in e.text for e in events)
    assert any("x\\ud800y" in e.text for e in events)


def test_job_record_world_size_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "ddpslurm.json"
    source = SourceFile(path=str(path), display="ddpslurm.json", kind="job_record")
    for spec, world in [({"nodes": 2, "tasks_per_node": 4}, 8), ({"nodes": 1 << 19, "tasks_per_node": 1 << 19}, None),
                        ({"world_size": 1e11}, None), ({"world_size": -1}, None), ({"world_size": 16}, 16)]:
        path.write_text(json.dumps({"spec": spec}))
        assert record_events(source, SIGS)[1].get("world_size") == world, spec


@pytest.mark.parametrize("record", [
    {**EXIT, "rank": -5}, {**EXIT, "unix": 1e300}, {**EXIT, "host": "a\u009b2Jb"},
    {**EXIT, "exception": {"type": "ValueError", "message": "x\ud800" + "y" * (3 << 20)}},
])
def test_the_whole_analysis_survives_a_bad_record(tmp_path: Path, record: dict) -> None:
    (tmp_path / "rank_3.exit.json").write_text(json.dumps(record), encoding="utf-8")
    (tmp_path / "rank_3.log").write_text("step 1\n")
    diagnosis = analyze_paths([tmp_path])
    assert diagnosis.cause == "user_code_exception"
    assert diagnosis.first_failing_rank == 3


def test_a_fifo_named_like_a_record_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "rank_3.exit.json"
    os.mkfifo(fifo)  # nobody writes it: an open() without O_NONBLOCK or a read would block forever
    source = SourceFile(path=str(fifo), display=fifo.name, rank=3, kind="exit_record")
    events, facts = record_events(source, SIGS)
    assert events == [] and "not a readable JSON object" in facts["notes"][0]
