"""The flight recorder dumps of a hang (`attempt_N/rank_R.fr_trace.json`, torch's `_dump_fr_trace_json`) ->
the rank that never issued the collective its peers wait in, or the ranks that issued a different one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse.flight_recorder import MAX_BYTES, fr_events, last_collectives
from tests.unit.test_heartbeat_analyze import IN_BACKWARD, job_folder


def entry(seq: int, name: str, sizes: list, group: str = "0", p2p: bool = False, record: int = 0) -> dict:
    """One entry as torch 2.13 writes it (the keys analyze reads, and some it does not)."""
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": p2p, "input_sizes": sizes, "output_sizes": sizes,
            "input_dtypes": ["Float"], "pg_id": int(group) if group.isdigit() else 9, "process_group": [group, "x"],
            "profiling_name": name, "record_id": record, "state": "scheduled", "retired": False, "timeout_ms": 600000,
            "thread_name": "python", "time_created_ns": 1_790_000_000_000_000_000 + seq}


def trace(*entries: dict) -> dict:
    return {"version": "2.10", "comm_lib_version": "", "pg_config": {}, "pg_status": {}, "entries": list(entries)}


def history(last: dict, steps: int = 5, group: str = "0") -> list[dict]:
    """`steps` gradient all-reduces, then `last` (numbered after them)."""
    return [entry(i, "gloo:all_reduce", [[1024]], group) for i in range(1, steps + 1)] + [last]


def add_traces(job: Path, traces: dict[int, dict]) -> Path:
    for rank, data in traces.items():
        (job / "attempt_0" / f"rank_{rank}.fr_trace.json").write_text(json.dumps(data))
    return job


def diagnose(tmp_path: Path, traces: dict[int, dict], hosts: dict[int, str]) -> dict:
    """Every rank's stack is in DDP's backward (stacks alone cannot tell them apart): the traces decide."""
    job = job_folder(tmp_path, dict.fromkeys(hosts, IN_BACKWARD), hosts)
    return analyze_paths([add_traces(job, traces)]).to_dict()


@pytest.mark.parametrize(("odd", "hosts"), [
    (2, {0: "n01", 1: "n01", 2: "n02", 3: "n02"}),
    (0, {0: "gpu-a7", 1: "gpu-b2", 2: "gpu-c9"}),  # rank 0 itself, hosts renamed, another world size
])
@pytest.mark.parametrize("different", [("gloo:broadcast", [[1024]]), ("nccl:all_reduce", [[1025]])])
def test_the_rank_in_a_different_collective_at_the_same_number_is_the_mismatch(tmp_path: Path, odd, hosts,
                                                                               different) -> None:
    name, sizes = different
    traces = {r: trace(*history(entry(6, name if r == odd else "gloo:all_reduce", sizes if r == odd else [[1024]])))
              for r in hosts}
    diagnosis = diagnose(tmp_path, traces, hosts)
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_mismatch", odd)
    assert diagnosis["first_failing_host"] == hosts[odd]
    assert any("flight recorder" in e["text"] and "#6" in e["text"] for e in diagnosis["evidence"])


def test_two_ranks_in_two_collectives_is_a_mismatch_of_no_single_rank(tmp_path: Path) -> None:
    traces = {0: trace(*history(entry(6, "gloo:broadcast", [[4]]))), 1: trace(*history(entry(6, "gloo:all_reduce",
                                                                                           [[4]])))}
    diagnosis = diagnose(tmp_path, traces, {0: "n01", 1: "n02"})
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_mismatch", None)


@pytest.mark.parametrize("behind", [1, 3])
def test_the_rank_whose_last_collective_is_the_lowest_never_issued_the_next(tmp_path: Path, behind: int) -> None:
    hosts = {0: "n01", 1: "n01", 2: "n02", 3: "n02"}
    traces = {r: trace(*history(entry(5, "gloo:all_reduce", [[1024]]), steps=4)) if r == behind else
              trace(*history(entry(6, "gloo:all_reduce", [[1024]]))) for r in hosts}  # #5 for one, #6 for the rest
    diagnosis = diagnose(tmp_path, traces, hosts)
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_timeout", behind)


def test_process_groups_are_compared_apart_and_p2p_is_left_out(tmp_path: Path) -> None:
    """Group 1's numbers are its own; a send/recv (p2p) never counts as the rank's last collective."""
    hosts = {0: "n01", 1: "n02", 2: "n03"}
    traces = {r: trace(*history(entry(6, "gloo:all_reduce", [[8]])), entry(2, "gloo:all_gather", [[8]], group="1"),
                       entry(99, "gloo:send" if r == 1 else "gloo:recv", [[8]], p2p=True)) for r in hosts}
    traces[2]["entries"][-2] = entry(2, "gloo:reduce_scatter", [[8]], group="1")
    diagnosis = diagnose(tmp_path, traces, hosts)
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_mismatch", 2)


def test_the_same_collective_everywhere_says_nothing(tmp_path: Path) -> None:
    hosts = {0: "n01", 1: "n02"}
    traces = {r: trace(*history(entry(6, "gloo:all_reduce", [[1024]]))) for r in hosts}
    diagnosis = diagnose(tmp_path, traces, hosts)
    assert (diagnosis["cause"], diagnosis["first_failing_rank"]) == ("collective_timeout", None)


def test_last_collectives_takes_the_highest_number_per_group() -> None:
    data = trace(entry(3, "gloo:all_reduce", [[1]]), entry(1, "gloo:barrier", [[1]]), entry(7, "gloo:x", [[1]], "5"))
    last = last_collectives(data)
    assert {g: e["collective_seq_id"] for g, e in last.items()} == {"0": 3, "5": 7}


@pytest.mark.parametrize("text", [
    "", "not json", "[1, 2]", '{"entries": 5}', '{"entries": [1, "x", {"collective_seq_id": "7"}]}',
    '{"entries": [{"collective_seq_id": 3, "process_group": [], "profiling_name": "gloo:x"}]}',
    '{"entries": [{"collective_seq_id": true, "pg_id": 0, "profiling_name": "gloo:x"}]}',
    "[" * 100_000,  # nesting deeper than json's recursion limit
    "b'{\\\"entries\\\": []}'",  # a bytes repr, as a careless dump would write it
])
def test_a_file_that_is_not_a_dump_gives_nothing(tmp_path: Path, text: str) -> None:
    path = tmp_path / "rank_3.fr_trace.json"
    path.write_text(text)
    assert fr_events(SourceFile(path=str(path), display=path.name, size=len(text))) == []


def test_a_huge_dump_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.fr_trace.json"
    with open(path, "w") as handle:
        handle.write('{"entries": [')
        handle.truncate(MAX_BYTES + 10)
    assert fr_events(SourceFile(path=str(path), display=path.name, size=MAX_BYTES + 10)) == []


def test_a_dump_with_hostile_names_still_gives_its_event_and_no_surrogate(tmp_path: Path) -> None:
    path = tmp_path / "rank_1.fr_trace.json"
    path.write_text(json.dumps(trace(entry(4, "gloo:all_reduce\x1b[2J\udcff", [[1]], group="\x07pg"))))
    (event,) = fr_events(SourceFile(path=str(path), display=path.name, size=path.stat().st_size))
    assert (event.rank, event.get("seq"), event.get("pg")) == (1, "4", "\x07pg")
    assert event.get("collective").startswith("all_reduce\x1b[2J")  # the backend prefix is gone, the rest kept
    event.text.encode("utf-8")  # a lone surrogate would raise here (and in every writer after it)
