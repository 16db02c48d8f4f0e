"""Fewer than --nodes MIN left: the join timeout, the agents' give-up records, the batch step's decision.

Pure functions and a temporary folder; the real agents giving up on the real cluster, and the requeue, are in
tests/integration/test_inplace_restart.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.launch import batch, below_min, restarts
from ddpslurm.launch.below_min import REQUEUE, TIMEOUT, decide, gave_up_entry, join_timeout_s
from ddpslurm.launch.torchrun_agent import elastic_argv, join_timeout

FIXED = ["--nnodes=3", "--node-rank=1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=n1:10077",
         "--rdzv-id=77"]


@pytest.mark.parametrize(("environ", "expected"), [({}, below_min.DEFAULT_JOIN_TIMEOUT_S),
                                                   ({below_min.JOIN_TIMEOUT_ENV: ""}, below_min.DEFAULT_JOIN_TIMEOUT_S),
                                                   ({below_min.JOIN_TIMEOUT_ENV: " 45 "}, 45)])
def test_join_timeout(environ: dict[str, str], expected: int) -> None:
    assert join_timeout_s(environ) == expected


@pytest.mark.parametrize("bad", ["0", "-3", "1.5", "soon"])
def test_a_bad_join_timeout_is_named_and_the_agent_keeps_the_default(bad: str, capsys) -> None:
    with pytest.raises(ValueError, match=below_min.JOIN_TIMEOUT_ENV):
        join_timeout_s({below_min.JOIN_TIMEOUT_ENV: bad})
    assert join_timeout({below_min.JOIN_TIMEOUT_ENV: bad}) == below_min.DEFAULT_JOIN_TIMEOUT_S
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and repr(bad) in err


def test_only_a_node_range_gets_the_join_timeout() -> None:
    ranged = elastic_argv(FIXED, nodes_in_step=3, max_restarts=1, min_nodes=2, join_timeout_s=33)
    assert "--rdzv-conf=join_timeout=33" in ranged and ranged[-1] == "--max-restarts=1"
    assert not any(a.startswith("--rdzv-conf") for a in elastic_argv(FIXED, nodes_in_step=3, max_restarts=2,
                                                                      min_nodes=0, join_timeout_s=33))


@pytest.mark.parametrize(("error", "kind"), [("RendezvousTimeoutError", TIMEOUT),
                                             ("RendezvousClosedError", below_min.CLOSED),
                                             ("RendezvousConnectionError", None), ("ValueError", None)])
def test_kind_of_torchs_rendezvous_errors(error: str, kind: str | None) -> None:
    assert below_min.kind_of(error) == kind


def test_torchs_rendezvous_errors_carry_the_names_the_table_knows() -> None:
    api = pytest.importorskip("torch.distributed.elastic.rendezvous.api")
    for name in below_min.ERROR_KINDS:
        assert issubclass(getattr(api, name), api.RendezvousError)


def _gave_up(host: str, error: str = "RendezvousTimeoutError", min_nodes: int = 2) -> dict:
    return gave_up_entry(host=host, error_type=error, message="", min_nodes=min_nodes, join_timeout=30, starts=1,
                         unix=10.0)


HOSTS = ["n1", "n2", "n3"]


@pytest.mark.parametrize(("records", "attempt", "max_requeues", "action", "lost", "words"), [
    # n1 timed out, n2 found it closed; n3 left no record: lost
    ({"n1": _gave_up("n1"), "n2": _gave_up("n2", "RendezvousClosedError")}, 0, 3, REQUEUE, ("n3",),
     ["2 of 3 node(s) left", "MIN 2", "after 30s", "lost: n3"]),
    ({"n1": _gave_up("n1", min_nodes=3)}, 2, 3, REQUEUE, ("n2", "n3"), ["1 of 3", "MIN 3"]),
    # the requeue budget is spent: say so, requeue nothing
    ({"n1": _gave_up("n1")}, 3, 3, below_min.NONE, ("n2", "n3"), ["reached --max-requeues 3"]),
    # a closed rendezvous alone is the job's own end (another agent's failure or exit), not too few nodes
    ({"n1": _gave_up("n1", "RendezvousClosedError")}, 0, 3, below_min.NONE, (), []),
    ({}, 0, 3, below_min.NONE, (), []),
])
def test_decide(records: dict, attempt: int, max_requeues: int, action: str, lost: tuple, words: list[str]) -> None:
    found = decide(records, hosts=HOSTS, attempt=attempt, max_requeues=max_requeues)
    assert (found.action, found.lost) == (action, lost)
    assert all(word in found.reason for word in words), found.reason
    assert bool(found.reason) == bool(words)


def test_records_round_trip_and_status_line(tmp_path: Path) -> None:
    job = tmp_path / "job_77"
    for host in ("n1", "n2"):
        (job / "attempt_0" / host).mkdir(parents=True)
    (job / "attempt_1").mkdir()
    below_min.write_gave_up(job / "attempt_0" / "n1", _gave_up("n1"))
    assert below_min.read_gave_up(job / "attempt_0") == {"n1": _gave_up("n1")}
    decision = decide(below_min.read_gave_up(job / "attempt_0"), hosts=["n1", "n2"], attempt=0, max_requeues=1)
    below_min.write_record(job / "attempt_0", decision, True)
    entries = below_min.summary(job)
    assert entries == [{"attempt": 0, "requeued": True, "reason": decision.reason, "lost_nodes": ["n2"]}]
    assert below_min.summary_line(entries) == f"below --nodes MIN: attempt 0 requeued: {decision.reason}"
    found = restarts.summary(job)  # the requeued attempt 1 runs; status still tells why attempt 0 ended
    assert found is not None and found["attempt"] == 1 and found["below_min"] == entries
    assert restarts.summary_line(found).splitlines()[1] == below_min.summary_line(entries)


def test_after_step_leaves_every_other_end_alone(tmp_path: Path) -> None:
    attempt = tmp_path / "job_77" / "attempt_0"
    (attempt / "n1").mkdir(parents=True)
    env = {"SLURM_JOB_NODELIST": "n[1-2]"}
    assert batch.requeue_below_min("77", attempt, attempt=0, max_requeues=3, environ=env) is False
    below_min.write_gave_up(attempt / "n1", _gave_up("n1", "RendezvousClosedError"))
    assert batch.requeue_below_min("77", attempt, attempt=0, max_requeues=3, environ=env) is False
    assert below_min.read_record(attempt) is None  # nothing decided, nothing written (no Slurm asked)


def test_after_step_at_the_cap_records_why_not(tmp_path: Path) -> None:
    attempt = tmp_path / "job_77" / "attempt_3"
    (attempt / "n1").mkdir(parents=True)
    below_min.write_gave_up(attempt / "n1", _gave_up("n1"))
    env = {"SLURM_JOB_NODELIST": "n[1-2]"}
    assert batch.requeue_below_min("77", attempt, attempt=3, max_requeues=3, environ=env) is False
    record = below_min.read_record(attempt)
    assert record is not None and record["requeued"] is False and record["lost_nodes"] == ["n2"]
    assert "reached --max-requeues 3" in record["reason"]
