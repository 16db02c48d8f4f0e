"""The diagnosis engine stage by stage: timeline (pure), each evidence producer, and the combiner.

Events are built by hand with the kinds, roles, fields and `accuses` the signatures give them, so each test
names the phenomenon it checks, not a log file.
"""

from __future__ import annotations

import random
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest

from ddpslurm.analyze.diagnose import barriers, collectives, job_setup, own_reports, peers, producers
from ddpslurm.analyze.diagnose.combiner import combine
from ddpslurm.analyze.diagnose.resolve import expand_ranks, is_host_name, resolve
from ddpslurm.analyze.diagnose.timeline import JobTimeline, build_timeline, stopped_early
from ddpslurm.analyze.model import Event

T0 = 1_700_000_000.0


def ev(kind: str, role: str | None = None, rank: int | None = None, *, host: str | None = None,
       cause: str | None = None, accuses: str | None = None, priority: int = 0, time: float | None = None,
       file: str | None = None, line: int = 1, text: str = "", extra: dict[str, str] | None = None,
       **fields: str) -> Event:
    """One event as the scanner would emit it (accuses defaults as the signature loader would); `extra` holds
    fields whose names clash with the arguments (`host`, `rank`)."""
    fields = {**fields, **(extra or {})}
    if role is not None and accuses is None:
        accuses = "self" if role != "victim" else ("peer" if any(k.startswith("peer_") for k in fields) else "none")
    items = tuple(sorted(fields.items())) + ((("accuses", accuses),) if accuses else ())
    return Event(file=file or (f"r{rank}.log" if rank is not None else "slurm.out"), line=line, kind=kind,
                 text=text or kind, rank=rank, host=host, time=time, time_family="iso" if time else None,
                 cause=cause, role=role, signature=f"sig-{kind}", priority=priority, fields=items)


def timeline(events: list[Event], world: int | None = None) -> JobTimeline:
    events, facts = resolve(events, [], [], {"world_size": world} if world else {})
    return build_timeline(events, facts, [], [])


def watchdog(rank: int, host: str = "n1", done: int = 89, time: float | None = None) -> Event:
    return ev("watchdog_timeout", "victim", rank, host=host, cause="collective_timeout", priority=12,
              seq=str(done + 1), last_completed=str(done), time=time)


def oom(rank: int, host: str = "n1", time: float | None = None) -> Event:
    return ev("exception", "culprit", rank, host=host, cause="cuda_oom", priority=80, time=time)


def srun(tasks: str, status: str, host: str = "n1", line: int = 1, cause: str = "unknown") -> Event:
    text = f"srun: error: {host}: task(s) {tasks}: {status}"
    return ev("slurm_task", "either", None, host=None, cause=cause, priority=4, tasks=tasks, file="slurm.out",
              line=line, text=text, extra={"host": host})


def ranks_of(votes: list[producers.Vote]) -> dict[int | None, float]:
    out: dict[int | None, float] = {}
    for v in votes:
        out[v.rank] = out.get(v.rank, 0.0) + v.weight
    return out


# ---------------------------------------------------------------------------------------------- timeline
def test_srun_task_lines_keep_their_order_and_the_teardown_marker() -> None:
    tl = timeline([srun("1", "Killed", line=1),
                   ev("signal", None, None, file="slurm.out", line=2,
                      text="slurmstepd: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***"),
                   srun("0", "Terminated", line=3)])
    assert [(t.ranks, t.status, t.before_teardown, t.own_death) for t in tl.tasks] == \
        [((1,), "Killed", True, True), ((0,), "Terminated", False, False)]


def test_a_startup_connect_error_followed_by_init_is_recovered() -> None:
    refused = ev("socket", "either", 2, cause="network_unreachable", priority=55, line=3)
    init = ev("nccl_init", None, 2, line=9, nccl_rank="2", nranks="4")
    tl = timeline([refused, init, oom(1)])
    assert tl.rank(2).recovered == [refused] and tl.rank(2).own_failures == []


def test_a_connect_refusal_followed_by_the_store_barrier_or_another_error_was_retried_through() -> None:
    refused = ev("socket", "either", 2, cause="network_unreachable", priority=55, line=3)
    barrier = ev("store_barrier", "victim", 2, cause="rendezvous_timeout", line=9)
    nccl = ev("exception", "either", 2, cause="nccl_internal_error", line=9)
    same = ev("exception", "either", 2, cause="network_unreachable", line=9)
    assert timeline([refused, barrier]).rank(2).recovered == [refused]
    assert timeline([refused, nccl]).rank(2).recovered == [refused]
    assert timeline([refused, same]).rank(2).recovered == []  # its final error is the same failure


@pytest.mark.parametrize(("sign", "recovered", "recovered_when_first"), [
    (dict(kind="store_barrier", role="victim", cause="rendezvous_timeout"), True, False),  # a store wait
    (dict(kind="nccl_init", role=None), True, True),  # init done: the job initialized, every rank connected
    (dict(kind="exception", role="either", cause="nccl_internal_error"), False, False),  # either side of it
])
def test_a_connect_refusal_that_cannot_be_ordered_is_retried_through_when_the_rank_got_connected(
        sign: dict, recovered: bool, recovered_when_first: bool) -> None:
    """The refusal has no time and sits in the rank's other file: its order with the rank's later lines is
    unknown. A store wait or an init could only happen once the connect went through; another error could be
    either side of it. A store wait known to come first says nothing of after."""
    refused = ev("socket", "either", 2, cause="network_unreachable", priority=55, file="r2.out", line=1)
    kind, role = sign.pop("kind"), sign.pop("role")
    later = ev(kind, role, 2, file="r2.err", line=7, time=T0, **sign)
    assert timeline([refused, later]).rank(2).recovered == ([refused] if recovered else [])
    before = ev(kind, role, 2, file="r2.out", line=0, **sign)
    assert timeline([before, refused]).rank(2).recovered == ([refused] if recovered_when_first else [])


def test_a_log_that_goes_on_past_the_others_did_not_stop_early() -> None:
    last = {0: ("step N loss N",), 1: ("RuntimeError: timeout",), 2: ("RuntimeError: timeout",),
            3: ("RuntimeError: timeout",)}
    assert stopped_early(last, {0: 500, 1: 100, 2: 100, 3: 100}) == set()
    last[2] = ("step N loss N",)
    assert stopped_early(last, {0: 500, 1: 100, 2: 40, 3: 100}) == {2}


READY = "[rank N] index ready: N samples; calling init_process_group (world_size=N)"
OTHER_LINES = ("UserWarning: TypedStorage is deprecated", "wandb: Syncing run N", "NCCL INFO Bootstrap : Using ethN:N",
               "Downloading shards: N%", "INFO:root:cache hit ratio N", "[W socket.cpp:N] connect retry N",
               "slurmstepd: notice: cgroup N", "tokenizers: The current process just got forked", "tqdm N%|",
               "FutureWarning: `resume_download` is deprecated", "Loading checkpoint shards: N/N", "ip: N")


@pytest.mark.parametrize("ranks", [8, 9, 33])
@pytest.mark.parametrize("seed", range(6))
def test_lines_printed_after_the_common_end_do_not_make_a_log_end_early(ranks: int, seed: int) -> None:
    """Every rank but one reaches the line most logs end on; around it the ranks print other lines (a library's
    warning, a notice, a line every rank prints): only the rank whose last lines lack that line stopped early,
    wherever the other lines fall and whichever rank it is."""
    rng = random.Random(seed)
    silent = rng.randrange(ranks)
    everyone = rng.choice(OTHER_LINES)
    tails = {}
    for r in range(ranks):
        tail = ["[rank N] building index from /data/train.lmdb"] + ([] if r == silent else [READY])
        for line in [everyone, *rng.sample(OTHER_LINES, rng.randrange(3))]:
            tail.insert(rng.randrange(1, len(tail) + 1), line)
        tails[r] = tuple(tail[-6:])
    counts = {r: 10 for r in range(ranks)}
    assert stopped_early(tails, counts) == {silent}
    other = (silent + 1) % ranks
    tails[other] = tails[silent]  # a second rank that stopped at the same place
    assert stopped_early(tails, counts) == {silent, other}


def test_no_line_most_ranks_hold_tells_nothing() -> None:
    tails = {r: (f"line of kind {chr(97 + r)}",) for r in range(5)}
    assert stopped_early(tails, dict.fromkeys(range(5), 10)) == set()


@pytest.mark.parametrize(("text", "expected"), [
    ("2-7", [2, 3, 4, 5, 6, 7]), ("0,3-5", [0, 3, 4, 5]), ("6, 7", [6, 7]), ("7-2", []),
    ("0-99999999999", []), ("x", []),
])
def test_expand_ranks_is_bounded(text: str, expected: list[int]) -> None:
    assert expand_ranks(text, limit=1000) == expected


def test_a_world_size_read_in_a_log_never_enumerates_ranks() -> None:
    barrier = ev("store_barrier", "victim", 0, cause="rendezvous_timeout", priority=15,
                 world_size="99999999999", worker_count="1")
    tracemalloc.start()
    tl = timeline([barrier])
    verdict = combine(tl)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert tl.world_size == 1 and verdict.rank is None and peak < 20 << 20


def test_a_failure_on_a_line_cut_mid_way_is_weak(tmp_path: Path) -> None:
    from ddpslurm.analyze.diagnose.engine import cut_last_lines, weaken_cut_lines
    from ddpslurm.analyze.model import FileSummary, SourceFile

    cut, whole = tmp_path / "r1.log", tmp_path / "r2.log"
    cut.write_text("step 1\ntorch.distributed.DistBackendError: [Rank 1] Watch")
    whole.write_text("step 1\nValueError: bad batch\n")
    events = [ev("exception", "culprit", 1, cause="user_code_exception", file="r1.log", line=2),
              ev("exception", "culprit", 2, cause="user_code_exception", file="r2.log", line=2)]
    sources = [SourceFile(path=str(cut), display="r1.log"), SourceFile(path=str(whole), display="r2.log")]
    summaries = [FileSummary(file="r1.log", lines=2), FileSummary(file="r2.log", lines=2)]
    found = cut_last_lines(events, sources, summaries)
    assert found == {("r1.log", 2)}
    assert [e.role for e in weaken_cut_lines(events, found)] == ["either", "culprit"]


def test_the_scan_tells_which_logs_end_mid_line(tmp_path: Path) -> None:
    """The scan notes each file's last byte, so the engine opens no file again to find the cut ones (32k files
    of a 16k-rank job); where the scan did not tell, the engine looks at the file itself."""
    from ddpslurm.analyze.diagnose.engine import cut_last_lines
    from ddpslurm.analyze.model import SourceFile
    from ddpslurm.analyze.parse.scan import scan_file
    from ddpslurm.analyze.rules.loading import load_signatures

    cut, whole = tmp_path / "r1.log", tmp_path / "r2.log"
    cut.write_text("step 1\ntorch.distributed.DistBackendError: [Rank 1] Watch")
    whole.write_text("step 1\nValueError: bad batch\n")
    sources = [SourceFile(path=str(p), display=p.name, size=p.stat().st_size, rank=r)
               for r, p in ((1, cut), (2, whole))]
    scanned = [scan_file(source, load_signatures()) for source in sources]
    summaries = [summary for _events, summary in scanned]
    assert [s.ends_with_newline for s in summaries] == [False, True]
    events = [e for found, _summary in scanned for e in found]
    cut.write_text("step 1\nrewritten since\n")  # what the scan saw decides, not the file's bytes now
    assert cut_last_lines(events, sources, summaries) == {("r1.log", 2)}
    # a big log read in ranges by several workers: its last range tells
    from ddpslurm.analyze.model import FileSummary
    from ddpslurm.analyze.parse.file_ranges import merge_parts

    parts = [([], FileSummary(file="big.log", lines=5)), ([], FileSummary(file="big.log", lines=3,
                                                                            ends_with_newline=False))]
    assert merge_parts(parts)[1].ends_with_newline is False


def test_huge_numbers_anywhere_stay_bounded() -> None:
    """A launcher line claiming a billion ranks, a rank prefix of 11 digits and 400 huge srun ranges."""
    events = [ev("rank_info", None, 0, host="n1", world_size="999999999"),
              ev("watchdog_timeout", "victim", 99999999999, cause="collective_timeout", last_completed="1"),
              watchdog(0), watchdog(1, done=88),
              *[srun(f"{i * 10**8}-{i * 10**8 + 10**8 - 1}", "Killed", line=i) for i in range(400)]]
    tracemalloc.start()
    verdict = combine(timeline(events))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200 << 20, f"{peak >> 20} MiB"
    assert verdict.cause in ("collective_timeout", "host_oom")


@pytest.mark.parametrize(("name", "ok"), [("gpu-a01", True), ("node03.cluster", True), ("2815412.batch", False),
                                          ("10.0.0.5", False), ("fe80::1%ib0", False), ("123", False),
                                          ("0c41e7b2", False), ("3f4e5a6b7c8d", False), ("dgx-a08", True),
                                          ("xxxxxxxx", False), ("****", False), ("<hostname>", False),
                                          ("[redacted]", False), ("HOSTNAME", False), ("xx", True),
                                          ("xnode-1", True)])
def test_only_node_names_are_hosts(name: str, ok: bool) -> None:
    assert is_host_name(name) is ok


# ---------------------------------------------------------------------------------------------- producers
def test_own_failure_votes_for_the_reporter_with_its_time() -> None:
    votes = own_reports.own_failures(timeline([oom(3, time=T0), watchdog(0)]))
    assert [(v.rank, v.cause, v.own, v.time) for v in votes] == [(3, "cuda_oom", True, T0)]


def test_srun_first_death_weighs_most_and_a_victims_exit_little() -> None:
    tl = timeline([srun("1", "Killed", line=1), srun("0", "Exited with exit code 1", line=2),
                   ev("peer_lost", "victim", 0, peer_ip="10.0.0.2", cause="unknown")])
    weights = ranks_of(own_reports.srun_task_deaths(tl))
    assert weights[1] == 40.0 and weights[0] < 5.0


def test_a_rank_that_started_and_vanished_is_suspect_only_while_the_others_left_records() -> None:
    start = [ev("start", None, r, host="n1") for r in range(4)]
    exits = [ev("exit", None, r, host="n1", status="exception") for r in (0, 2, 3)]
    assert ranks_of(own_reports.vanished_ranks(timeline(start + exits))) == {1: 25.0}
    assert own_reports.vanished_ranks(timeline(start)) == []


def test_a_peer_named_by_an_address_no_record_maps_names_nobody() -> None:
    lost = [ev("peer_lost", "victim", r, host="n1", peer_ip="10.1.2.3") for r in range(3)]
    assert peers.named_peers(timeline(lost)) == []
    named = [ev("peer_lost", "victim", r, host="n1", peer_host="n2") for r in range(3)]
    assert [(v.host, v.rank) for v in peers.named_peers(timeline(named))] == [("n2", None)]


def test_timeouts_point_at_the_absent_and_the_lagging_rank() -> None:
    tl = timeline([watchdog(r) for r in (0, 1, 3)], world=4)
    assert ranks_of(collectives.timeout_reporters(tl)) == {2: 30.0}
    lag = timeline([watchdog(0), watchdog(1), watchdog(2, done=87), watchdog(3)], world=4)
    assert ranks_of(collectives.timeout_reporters(lag)) == {2: 30.0}


def enqueued(rank: int, last: int, *, seq: int | None = None, pg: str = "0") -> Event:
    """A rank's line with its last enqueued work in process group `pg`: its watchdog timeout in work `seq`, or
    (`seq` None) the flight recorder's dump signal that reached it."""
    if seq is None:
        return ev("dump_signal", "victim", rank, host="n1", cause="collective_timeout", priority=2, pg=pg,
                  last_enqueued=str(last), last_completed=str(last - 1))
    return ev("watchdog_timeout", "victim", rank, host="n1", cause="collective_timeout", priority=12, pg=pg,
              seq=str(seq), last_enqueued=str(last), last_completed=str(seq - 1))


def never_issued(tl: JobTimeline) -> dict[int | None, float]:
    return ranks_of([v for v in collectives.timeout_reporters(tl) if v.producer == "never issued"])


@pytest.mark.parametrize(("behind", "pg"), [({5}, "0"), ({2, 9}, "0"), ({0}, "3")])
def test_a_rank_whose_last_enqueued_work_is_before_the_timed_out_one_never_issued_it(behind: set[int],
                                                                                    pg: str) -> None:
    """The ranks that timed out in work 41 had enqueued it; one the dump signal reached with work 40 as its last
    never issued it: the others waited for it, whether they or the store told it the most."""
    events = [enqueued(r, 40, pg=pg) if r in behind else
              enqueued(r, 41, seq=41, pg=pg) if r % 2 else enqueued(r, 41, pg=pg) for r in range(12)]
    assert never_issued(timeline(events, world=12)) == {r: 30.0 / len(behind) for r in behind}


@pytest.mark.parametrize("events", [
    # most ranks behind the one that timed out: what they issued differs, no rank is late (one TP group's log)
    [enqueued(7, 56117, seq=56117), *[enqueued(r, 56116) for r in range(7)]],
    # behind in another process group than the one whose collective timed out
    [*[enqueued(r, 41, seq=41, pg="0") for r in range(1, 8)], enqueued(0, 40, pg="1")],
    # no timeout at all: only dump signals, nothing says which work the others waited in
    [*[enqueued(r, 41) for r in range(1, 8)], enqueued(0, 40)],
    # every rank enqueued the work they timed out in (a network fault, not a late rank)
    [enqueued(r, 41, seq=41) for r in range(8)],
])
def test_no_rank_is_made_behind(events: list[Event]) -> None:
    assert never_issued(timeline(events, world=8)) == {}


def old_watchdog(rank: int, seq: int, op: str = "ALLREDUCE", numel: str | None = None, pg: str | None = None) -> Event:
    """A watchdog timeout in the format that names the work's type (and, from torch 2.1, its size)."""
    fields = {"seq": str(seq), "op": op, **({"numel_in": numel} if numel else {}), **({"pg": pg} if pg else {})}
    return ev("watchdog_timeout", "victim", rank, host=f"n{rank // 4}", cause="collective_timeout", priority=10,
              **fields)


def test_unnamed_groups_are_not_compared_when_a_rank_times_out_in_several_works() -> None:
    """Before torch 2.2 the line names no process group; a rank that timed out in works 96117 and 96125 is in
    two groups, so another rank's work 64088 is another group's number, not a rank 32,000 collectives behind."""
    several = [old_watchdog(0, 96117), old_watchdog(0, 96125), old_watchdog(7, 64088)]
    assert ranks_of(collectives.timeout_reporters(timeline(several))) == {}
    one_each = [old_watchdog(r, 90) for r in (0, 1, 2)] + [old_watchdog(3, 87)]
    assert ranks_of(collectives.timeout_reporters(timeline(one_each))) == {3: 30.0}


def test_lowest_completed_is_compared_within_each_named_group() -> None:
    """Work numbers of different process groups say nothing of each other: group 3's low numbers are its own."""
    events = [enqueued(r, 500, seq=500, pg="0") for r in range(4)] + [enqueued(r, 20, seq=20, pg="3") for r in (4, 5)]
    assert ranks_of(collectives.timeout_reporters(timeline(events, world=6))) == {}
    events.append(enqueued(6, 18, seq=18, pg="3"))
    assert ranks_of([v for v in collectives.timeout_reporters(timeline(events, world=7))
                     if v.producer == "lowest completed"]) == {6: 30.0}


def mismatch(tl: JobTimeline) -> list[tuple[str, int | None, str | None]]:
    return [(v.producer, v.rank, v.cause) for v in collectives.timeout_reporters(tl)
            if v.cause == "collective_mismatch"]


@pytest.mark.parametrize("renumber", [0, 8])
def test_ranks_timed_out_in_one_work_of_different_collectives_disagreed_on_what_to_call(renumber: int) -> None:
    r0, r1, r5 = 0 + renumber, 1 + renumber, 5 + renumber
    events = [old_watchdog(r1, 3742816, "_ALLGATHER_BASE"), old_watchdog(r0, 3742816, "REDUCE"),
              old_watchdog(r5, 3742816, "_ALLGATHER_BASE")]
    assert mismatch(timeline(events)) == [("mismatched collectives", None, "collective_mismatch"),
                                         ("odd collective", r0, "collective_mismatch")]
    verdict = combine(timeline(events))
    assert (verdict.cause, verdict.rank) == ("collective_mismatch", r0)


def test_a_fixed_size_collective_of_different_sizes_is_a_mismatch_without_a_rank_when_one_against_one() -> None:
    events = [old_watchdog(1, 2109, "_ALLGATHER_BASE", "262711296"), old_watchdog(0, 2109, "_ALLGATHER_BASE", "40960")]
    assert mismatch(timeline(events)) == [("mismatched collectives", None, "collective_mismatch")]
    verdict = combine(timeline(events))
    assert (verdict.cause, verdict.rank) == ("collective_mismatch", None)


@pytest.mark.parametrize("events", [
    # point-to-point works pair a send with a receive: different types by design
    [old_watchdog(0, 12, "SEND"), old_watchdog(1, 12, "RECV"), old_watchdog(2, 12, "RECV")],
    # all-to-all and the list form of all-gather may be uneven: their sizes differ by rank
    [old_watchdog(0, 12, "ALLTOALL_BASE", "64"), old_watchdog(1, 12, "ALLTOALL_BASE", "96")],
    [old_watchdog(0, 12, "ALLGATHER", "64"), old_watchdog(1, 12, "ALLGATHER", "96")],
    # different works (one rank behind): the lowest-completed rule's, not a mismatch
    [old_watchdog(0, 12, "ALLREDUCE"), old_watchdog(1, 11, "BROADCAST"), old_watchdog(2, 12, "ALLREDUCE")],
    # the same work number in two named groups: each group's own
    [old_watchdog(0, 12, "ALLREDUCE", pg="0"), old_watchdog(1, 12, "_ALLGATHER_BASE", pg="2")],
    # an unnamed group while a rank times out in several works: groups cannot be told apart
    [old_watchdog(0, 12, "ALLREDUCE"), old_watchdog(0, 40, "ALLREDUCE"), old_watchdog(1, 12, "_ALLGATHER_BASE")],
    # they agree
    [old_watchdog(r, 12, "ALLREDUCE", "1024") for r in range(3)],
])
def test_no_mismatch_is_made_of(events: list[Event]) -> None:
    assert mismatch(timeline(events)) == []


@pytest.mark.parametrize("rank", [3, 12])
def test_a_line_that_accuses_its_host_names_no_rank_whichever_printed_it(rank: int) -> None:
    """NCCL's duplicate-GPU check names a pair on a node: the rank an srun label gave the line is not the culprit."""
    dup = ev("nccl_warn", "culprit", rank, host="g7", cause="duplicate_gpu", priority=80, accuses="host",
             other_rank="0")
    votes = own_reports.detectors_and_hosts(timeline([dup]))
    assert [(v.producer, v.rank, v.host, v.cause) for v in votes] == [("host report", None, "g7", "duplicate_gpu")]
    assert own_reports.own_failures(timeline([dup])) == []
    verdict = combine(timeline([dup, ev("nccl_init", None, rank + 1, host="g7", nccl_rank=str(rank + 1))]),
                      frozenset({"duplicate_gpu"}))
    assert (verdict.cause, verdict.rank, verdict.host) == ("duplicate_gpu", None, "g7")


@pytest.mark.parametrize("host", ["nid001277", "gpu-b07"])
def test_a_host_less_node_report_takes_the_one_host_its_cause_s_other_votes_name(host: str) -> None:
    """slurmstepd's OOM line names no host; srun's line for the tasks it killed does: one event, one node."""
    oom = ev("oom_kill", "culprit", None, cause="host_oom", priority=92, file="slurm.out", line=1)
    events = [oom, srun("1-3", "Out Of Memory", host=host, line=2, cause="host_oom")]
    verdict = combine(timeline(events), frozenset({"host_oom"}))
    assert (verdict.cause, verdict.rank, verdict.host) == ("host_oom", None, host)
    two = [oom, srun("0-3", "Out Of Memory", host="n1", line=2, cause="host_oom"),
           srun("4-7", "Out Of Memory", host="n2", line=2, cause="host_oom")]
    assert combine(timeline(two), frozenset({"host_oom"})).host is None
    # ranks failing of it on a host the logs do not tell may be elsewhere: no host
    unknown = [ev("nccl_warn", "culprit", r, cause="nccl_internal_error", priority=20) for r in (54, 55)]
    known = ev("nccl_warn", "culprit", 52, host="ip-0a0c04e3", cause="nccl_internal_error", priority=20)
    assert combine(timeline([*unknown, known]), frozenset({"nccl_internal_error"})).host is None


def wrapper_report(reporter: int, named: int) -> Event:
    """ProcessGroupWrapper's symmetric report on `reporter`: its collective differs from `named`'s."""
    return ev("mismatch_report", "victim", reporter, host=f"n{reporter // 4}", cause="collective_mismatch",
              priority=70, accuses="none", reporter=str(reporter), named_rank=str(named))


@pytest.mark.parametrize(("reports", "rank"), [
    ([(2, 3)], None),  # one report: it says only that two ranks differ
    ([(0, 3), (1, 3), (2, 3), (3, 0)], 3),  # most reporters name rank 3, which names a peer too
    ([(0, 1), (1, 0)], None),  # one against one
    ([(4, 9), (5, 9), (6, 2), (7, 2)], None),  # a split
])
def test_mismatch_reports_name_the_rank_most_reporters_name_never_a_reporter(reports: list, rank: int | None) -> None:
    tl = timeline([wrapper_report(r, q) for r, q in reports])
    verdict = combine(tl)
    assert (verdict.cause, verdict.rank) == ("collective_mismatch", rank)


def announce(rank: int, world: int, label: int) -> Event:
    return ev("rank_announce", "either", None, cause="unknown", line=label * 10 + rank, global_rank=str(rank),
              member=str(rank + 1), world_size=str(world))


@pytest.mark.parametrize("base", [0, 4])
def test_ranks_announced_twice_while_others_never_are_is_a_rank_layout_mismatch(base: int) -> None:
    """Two nodes each counting from `base`: ranks base..base+3 twice, the rest of the 8 never."""
    events = [announce(base + r, 8, node) for node in (0, 1) for r in range(4)]
    votes = job_setup.duplicate_ranks(timeline(events))
    assert [(v.producer, v.rank, v.cause) for v in votes] == [("duplicate ranks", None, "rank_config_mismatch")]
    assert combine(timeline(events)).cause == "rank_config_mismatch"


@pytest.mark.parametrize("events", [
    [announce(r, 8, 0) for r in range(8)],  # each once
    [announce(r, 4, attempt) for attempt in (0, 1) for r in range(4)],  # twice each, none missing (two attempts)
    [announce(r, 8, 0) for r in range(3)],  # a part of the world, each once (a log cut short)
    [announce(1, 8, 0), announce(1, 4, 1)],  # worlds disagree: not one launch's numbers
])
def test_no_duplicate_ranks_are_made_of(events: list[Event]) -> None:
    assert job_setup.duplicate_ranks(timeline(events)) == []


@pytest.mark.parametrize(("fields", "attempt_mark", "cause", "rank"), [
    ({"world_size": "4", "worker_count": "3"}, False, "rendezvous_timeout", 3),
    ({"world_size": "4", "worker_count": "8"}, False, "rank_config_mismatch", None),
    ({"world_size": "4", "worker_count": "8"}, True, "stale_rendezvous_state", None),
])
def test_store_barrier_arithmetic(fields: dict[str, str], attempt_mark: bool, cause: str, rank: int | None) -> None:
    events = [ev("store_barrier", "victim", r, cause="rendezvous_timeout", priority=15, **fields) for r in range(3)]
    if attempt_mark:
        events.append(ev("slurm_job", "culprit", None, cause="preempted", priority=100, accuses="job"))
    votes = barriers.barrier_counts(timeline(events))
    assert [(v.cause, v.rank) for v in votes] == [(cause, rank)]


@pytest.mark.parametrize("seed", range(4))
def test_ranks_that_waited_in_the_store_for_a_key_joined_it(seed: int) -> None:
    """The store's host counts the clients that joined; a rank that waited in the store for a key (a store get that
    timed out) was connected to it, so the missing client is the rank that shows no sign of the store, whichever
    rank that is."""
    rng = random.Random(seed)
    world = rng.randrange(4, 12)
    host, late = rng.sample(range(world), 2)
    events = [ev("store_barrier", "victim", host, cause="rendezvous_timeout", world_size=str(world),
                 worker_count=str(world - 1), timeout_s="16")]
    events += [ev("store_barrier", "victim", r, cause="rendezvous_timeout", key="/default_pg/0//cpu//0/0",
                  key_rank="0") for r in range(world) if r not in (host, late)]
    votes = barriers.barrier_counts(timeline(events, world=world))
    assert [(v.cause, v.rank) for v in votes] == [("rendezvous_timeout", late)]


def test_a_rank_the_world_cannot_have_is_the_misconfigured_one() -> None:
    events = [ev("store_barrier", "victim", r, cause="rendezvous_timeout", world_size="2", worker_count="3",
                 extra={"rank": str(r)}) for r in (0, 2)]
    votes = barriers.barrier_counts(timeline(events))
    assert [(v.cause, v.rank) for v in votes] == [("rank_config_mismatch", 2)]


def test_the_pid_the_agent_did_not_sigterm_had_died_first() -> None:
    inits = [ev("nccl_init", None, None, host="n1", nccl_rank=str(r), nranks="4") for r in range(4)]
    inits = [replace(e, pid=100 + r) for r, e in enumerate(inits)]
    terms = [replace(ev("agent_sigterm", "victim", None, host="n1"), pid=100 + r)
             for r in (0, 1, 3)]
    assert ranks_of(own_reports.agent_teardown(timeline(inits + terms))) == {2: 35.0}


@pytest.mark.parametrize(("unsignalled", "expected"), [(None, {}), (1, {1: 35.0})])
def test_agent_lines_of_no_known_host_speak_for_the_hosts_no_other_line_speaks_for(unsignalled, expected) -> None:
    """Three nodes' agents write one log without hosts. n1's worker pids are its own, so its agent's lines are placed
    on n1; n2 and n3 run containers whose workers have the same pids, so their agents' lines stay of no known host.
    Those account for n2's and n3's workers, not for n1's: none of n1's ranks was spared by them."""
    pids = [100 + r for r in range(4)] + [200 + r for r in range(4)] * 2
    inits = [replace(ev("nccl_init", None, None, host=f"n{1 + r // 4}", nccl_rank=str(r), nranks="12"), pid=pid)
             for r, pid in enumerate(pids)]
    terms = [replace(ev("agent_sigterm", "victim", None, host=None), pid=pid)
             for r, pid in enumerate(pids) if r != unsignalled]
    assert ranks_of(own_reports.agent_teardown(timeline(inits + terms))) == expected


def test_the_minority_version_names_its_host() -> None:
    events = [ev("nccl_warn", "culprit", r, host=f"n{r // 2}", cause="nccl_version_mismatch",
                 version="21805" if r < 4 else "21903", peer_rank="0" if r >= 4 else "4",
                 peer_version="21805" if r >= 4 else "21903") for r in range(6)]
    votes = job_setup.odd_versions(timeline(events))
    assert [(v.host, v.cause) for v in votes] == [("n2", "nccl_version_mismatch")]


def test_a_loopback_pick_across_hosts_is_a_wrong_interface() -> None:
    picks = [ev("interface", "either", r, host=f"n{r}", cause="unknown", ifname="lo" if r == 1 else "eth0",
                ip="127.0.0.1" if r == 1 else f"10.0.0.{r}") for r in range(3)]
    votes = job_setup.interface_picks(timeline([*picks, watchdog(0, host="n0")]))
    assert [(v.rank, v.cause) for v in votes] == [(1, "wrong_interface")]
    single_host = [ev("interface", "either", r, host="n0", cause="unknown", ifname="lo") for r in range(2)]
    assert job_setup.interface_picks(timeline([*single_host, watchdog(0, host="n0")])) == []


def test_nccl_rejecting_every_task_from_k_up_is_a_world_size_smaller_than_the_launch() -> None:
    invalid = ev("exception", "either", None, cause="nccl_internal_error", priority=30,
                 text="RuntimeError: NCCL error in: NCCLUtils.hpp:82, invalid argument, NCCL version 2.4.8")
    tasks = [srun("2-7", "Exited with exit code 1", host="c0", line=2), srun("8-15", "Exited with exit code 1",
                                                                            host="c1", line=3)]
    votes = job_setup.ranks_beyond_world(timeline([invalid, *tasks]))
    assert [(v.rank, v.cause) for v in votes] == [(None, "rank_config_mismatch")]
    assert combine(timeline([invalid, *tasks])).rank is None
    assert job_setup.ranks_beyond_world(timeline([invalid, srun("8-15", "Exited with exit code 1", line=2),
                                                  srun("0-3", "Exited with exit code 1", line=3)])) == []


# ---------------------------------------------------------------------------------------------- combiner
def test_time_orders_two_own_failures() -> None:
    verdict = combine(timeline([oom(5, time=T0 + 30), oom(2, time=T0)]))
    assert (verdict.rank, verdict.decided_by, verdict.confidence) == (2, "time", "high")


def test_ranks_failing_alike_at_once_is_no_single_rank() -> None:
    alike = [oom(r, host="n7", time=T0 + r * 0.1) for r in range(4)]
    verdict = combine(timeline(alike))
    assert (verdict.rank, verdict.host, verdict.cause, verdict.decided_by) == (None, None, "cuda_oom", "systemic")
    on_node = combine(timeline(alike), node_causes=frozenset({"cuda_oom"}))  # a cause that lives on a node
    assert (on_node.rank, on_node.host) == (None, "n7")


def test_a_tie_between_pointers_names_nobody() -> None:
    verdict = combine(timeline([watchdog(r) for r in (0, 1)], world=4))
    assert verdict.rank is None and verdict.cause == "collective_timeout"


def test_the_headline_kill_names_the_killed_rank_not_the_sigtermed_one() -> None:
    """srun's 'task 1: Killed' first, rank 1 without exit record, rank 0 SIGTERMed by the step's teardown."""
    events = [ev("start", None, 0, host="n1"), ev("start", None, 1, host="n2"),
              srun("1", "Killed", host="n2", line=1, cause="host_oom"),
              ev("signal", None, None, file="slurm.out", line=2, text="srun: Job step aborted: Waiting up to 32 s"),
              srun("0", "Terminated", host="n1", line=3),
              ev("peer_lost", "victim", 0, host="n1", peer_ip="10.9.9.2"),
              ev("exit", None, 0, host="n1", status="stopped")]
    verdict = combine(timeline(events))
    assert (verdict.rank, verdict.host, verdict.cause) == (1, "n2", "host_oom")


def test_slurm_ends_the_job_unless_a_rank_failed_before() -> None:
    limit = ev("slurm_job", "culprit", None, cause="slurm_time_limit", priority=100, accuses="job", time=T0 + 600)
    assert combine(timeline([limit, watchdog(0, time=T0 + 601)])).cause == "slurm_time_limit"
    verdict = combine(timeline([limit, oom(3, time=T0)]))
    assert (verdict.cause, verdict.rank) == ("cuda_oom", 3)


def test_a_preemption_followed_by_a_new_attempt_is_not_the_end() -> None:
    preempt = ev("slurm_job", "culprit", None, cause="preempted", priority=100, accuses="job", line=1,
                 file="j.out")
    marker = ev("attempt_start", None, None, line=5, file="j.out", attempt="1")
    init_later = ev("nccl_init", None, 0, line=5, file="j.out", nccl_rank="0", nranks="2")
    crash = ev("exception", "culprit", 1, cause="user_code_exception", priority=0, line=9, file="j.out")
    assert combine(timeline([preempt, crash])).cause == "preempted"
    assert combine(timeline([preempt, init_later, crash])).cause == "preempted"  # file order alone: not a restart
    assert combine(timeline([preempt, marker, crash])).rank == 1
    timed = [replace(preempt, time=T0, time_family="iso"),
             replace(init_later, time=T0 + 60, time_family="iso"), crash]
    assert combine(timeline(timed)).rank == 1


def test_a_desync_report_names_the_odd_rank_among_alike_reports() -> None:
    events = [ev("exception", "culprit", r, cause="collective_mismatch", priority=70, peer_rank="3" if r != 3
                 else "0") for r in range(8)]
    verdict = combine(timeline(events))
    assert (verdict.rank, verdict.cause) == (3, "collective_mismatch")


def test_a_detector_is_not_the_offender() -> None:
    detected = ev("mismatch_detected", "culprit", 2, cause="collective_mismatch", priority=70, accuses="none")
    verdict = combine(timeline([detected, watchdog(0), watchdog(1)]))
    assert verdict.rank != 2 and verdict.cause == "collective_mismatch"


def test_a_node_report_explains_the_ranks_weaker_error() -> None:
    xid = ev("gpu", "culprit", None, host="g7", cause="gpu_hardware", priority=93)
    illegal = ev("exception", "culprit", 12, host="g7", cause="user_code_exception", priority=55)
    verdict = combine(timeline([xid, illegal, watchdog(0, host="g6")]))
    assert (verdict.rank, verdict.cause) == (12, "gpu_hardware")
