"""The scan side at scale: small files batched per worker task, repeated victim facts and NCCL rank facts kept once,
a log file's own rank not held per file, the progress bar."""

from __future__ import annotations

import functools
import gc
import os
import pty
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.diagnose.resolve import resolve
from ddpslurm.analyze.model import Event, SourceFile
from ddpslurm.analyze.parse import (
    file_scan,
    file_summary,
    line_streams,
    scan,
    scan_tasks,
    shared_values,
)
from ddpslurm.analyze.parse.repeated_facts import without_repeats, without_told_facts
from ddpslurm.analyze.read import blocks, files, read_ahead
from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.errors import AnalyzeInputError

WATCHDOG = ("[rank{r}]:[E612 10:24:03.2 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank {r}] failure "
            "detected by watchdog at work sequence id: 9 PG status: last enqueued work: 9, last completed work: 8\n")


def test_small_files_are_batched_and_a_big_range_is_alone(monkeypatch) -> None:
    monkeypatch.setattr(scan_tasks, "BATCH_BYTES", 100)
    monkeypatch.setattr(scan_tasks, "BATCH_FILES", 3)
    jobs = [(i, (SourceFile(path=f"f{i}", display=f"f{i}", size=size), None, 0, None, False))
            for i, size in enumerate([500, 30, 30, 30, 30, 90, 5])]
    got = [[i for i, _ in task] for task in scan_tasks.batches(jobs)]
    assert got == [[0], [1, 2, 3], [4], [5, 6]]


def test_parallel_batches_give_the_events_of_a_sequential_scan(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(scan_tasks, "BATCH_FILES", 7)
    sigs = load_signatures()
    sources = []
    for r in range(40):
        path = tmp_path / f"5_{r}_log.err"
        path.write_text("step 1\n" + WATCHDOG.format(r=r) * 2)
        sources.append(SourceFile(path=str(path), display=str(path), rank=r, size=path.stat().st_size))
    seen: list[tuple[int, int]] = []
    parallel = scan.scan_files(sources, sigs, workers=2, progress=lambda n, files=0: seen.append((n, files)))
    sequential = scan.scan_files(sources, sigs, workers=1)
    key = lambda results: [[(e.line, e.kind, e.rank, e.text) for e in evs] for evs, _ in results]  # noqa: E731
    assert key(parallel) == key(sequential)
    assert [len(evs) for evs, _ in parallel] == [1] * 40  # the repeated line is one fact
    assert sum(f for _, f in seen) == 40 and sum(n for n, _ in seen) == sum(s.size for s in sources)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
@pytest.mark.parametrize("threads", [0, 4])
def test_read_ahead_asks_for_each_range_from_its_start_up_to_its_cap(tmp_path: Path, monkeypatch, threads: int) -> None:
    """One by one, or side by side in threads where opening is a round trip: the same files opened, the same ranges."""
    from concurrent.futures import ThreadPoolExecutor

    asked: list[tuple[int, int, int]] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: asked.append((offset, length, advice)))
    monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", 1000)
    path = tmp_path / "a.log"
    path.write_bytes(b"x\n" * 1500)
    whole = SourceFile(path=str(path), display="a.log", size=3000)
    jobs = [(whole, None, 0, None, False), (whole, None, 2500, 2900, False), (whole, None, 100, 2500, False),
            (SourceFile(path=str(tmp_path / "gone.log"), display="gone.log", size=50), None, 0, None, False),
            (SourceFile(path=str(path), display="a.log", size=0), None, 0, None, False)]
    if threads:
        with ThreadPoolExecutor(threads) as pool:
            fds = read_ahead.read_ahead(jobs, pool)
    else:
        fds = read_ahead.read_ahead(jobs)
    opened = [o for o in fds if o is not None]
    for o in opened:
        os.close(o.fd)
    willneed = os.POSIX_FADV_WILLNEED
    assert sorted(asked) == [(0, 1000, willneed), (100, 1000, willneed), (2500, 400, willneed)]
    assert len(opened) == 3 and fds[3:] == [None, None]  # the missing file and the empty one are left to the scan
    # threads read each file's attributes too, for the scan to use instead of asking again
    inode = path.stat().st_ino if threads else None
    assert [o.attributes.st_ino if o.attributes else None for o in opened] == [inode] * 3


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no fifos on this platform")
def test_read_ahead_of_a_fifo_neither_blocks_nor_raises(tmp_path: Path) -> None:
    """A log replaced by a fifo after discovery: opened without blocking, its advice refused (ESPIPE) and passed, and
    the scan through that open file reports it unread."""
    import signal

    fifo = tmp_path / "3_0_log.out"
    os.mkfifo(fifo)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("read_ahead blocked on a fifo"))
    signal.alarm(5)
    try:
        job = (SourceFile(path=str(fifo), display="f", size=10), None, 0, None, False)
        events, summary = scan_tasks.scan_task(
            [job], lambda args, opened: scan.scan_file(args[0], load_signatures(), opened=opened))[0]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert events == [] and summary.error == "not a regular file"


def _watchdog_logs(folder: Path, ranks: int) -> list[SourceFile]:
    """One small log per rank (a watchdog timeout each), displayed as r0, r1, ..."""
    sources = []
    for r in range(ranks):
        path = folder / f"5_{r}_log.err"
        path.write_text(WATCHDOG.format(r=r))
        sources.append(SourceFile(path=str(path), display=f"r{r}", rank=r, size=path.stat().st_size))
    return sources


def test_a_sequential_scan_asks_for_each_task_before_reading_its_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(scan_tasks, "BATCH_FILES", 3)
    order: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr(scan_tasks, "read_ahead", lambda batch, pool=None: order.append(
        ("ahead", tuple(j[0].display for j in batch))) or [None] * len(batch))
    real = scan_tasks.scan_file
    monkeypatch.setattr(scan_tasks, "scan_file", lambda source, *a, **k: order.append(("scan", (source.display,))) or
                        real(source, *a, **k))
    results = scan.scan_files(_watchdog_logs(tmp_path, 7), load_signatures(), workers=1)
    assert [[e.rank for e in evs] for evs, _ in results] == [[r] for r in range(7)]
    ahead = lambda *names: ("ahead", names)  # noqa: E731
    scanned = lambda name: ("scan", (name,))  # noqa: E731
    assert order == [ahead("r0", "r1", "r2"), scanned("r0"), scanned("r1"), scanned("r2"), ahead("r3", "r4", "r5"),
                     scanned("r3"), scanned("r4"), scanned("r5"), ahead("r6"), scanned("r6")]


def test_a_worker_task_asks_for_its_files_before_reading_them(tmp_path: Path, monkeypatch) -> None:
    """A task of a worker's: its scan jobs (`scan_job`, no progress told) run by `scan_task`."""
    order: list[str] = []
    monkeypatch.setattr(scan_tasks, "read_ahead", lambda batch, pool=None: order.append(f"ahead {len(batch)}") or
                        [None] * len(batch))
    real = scan_tasks.scan_file
    monkeypatch.setattr(scan_tasks, "scan_file", lambda source, *a, **k: order.append(source.display) or
                        real(source, *a, **k))
    batch = [(source, None, 0, None, False) for source in _watchdog_logs(tmp_path, 3)]
    results = scan_tasks.scan_task(batch, functools.partial(scan_tasks.scan_job, load_signatures(), None))
    assert order == ["ahead 3", "r0", "r1", "r2"]
    assert [[e.rank for e in evs] for evs, _ in results] == [[0], [1], [2]]


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not os.path.isdir("/proc/self/fd"),
                    reason="no posix_fadvise, or no /proc/self/fd to count open files in")
@pytest.mark.parametrize("slow", [False, True])
def test_each_file_of_a_task_is_opened_once_and_closed(tmp_path: Path, monkeypatch, slow: bool) -> None:
    """The scan reads through the file `read_ahead` opened (an open is a metadata round trip on Lustre or NFS),
    and every file is closed after, a file a failed scan never reached included; the same where opening was timed
    slow and threads open the files side by side."""
    monkeypatch.setattr(read_ahead, "OPENS_TIMED", [read_ahead.READ_AHEAD_FILES, 1.0 if slow else 0.0])
    monkeypatch.setattr(scan_tasks, "READ_AHEAD_FILES", 2)  # (after the reading above: two runs of two, and a third)
    monkeypatch.setattr(read_ahead, "READ_AHEAD_FILES", 2)
    pools: list[object] = []
    real_ahead = read_ahead.read_ahead
    monkeypatch.setattr(scan_tasks, "read_ahead",
                        lambda batch, pool=None: pools.append(pool) or real_ahead(batch, pool))
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(os.fspath(path)) or real_open(path, *a, **k))
    stat_by: list[str] = []
    real_fstat = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: stat_by.append(threading.current_thread().name) or real_fstat(fd))
    batch = [(source, None, 0, None, False) for source in _watchdog_logs(tmp_path, 5)]
    before = len(os.listdir("/proc/self/fd"))
    results = scan_tasks.scan_task(batch,
                                   lambda args, opened: scan.scan_file(args[0], load_signatures(), opened=opened))
    assert [[e.rank for e in evs] for evs, _ in results] == [[0], [1], [2], [3], [4]]
    assert sorted(opened) == sorted(str(job[0].path) for job in batch)
    # each file's attributes read once: by the thread that opened it where opening is slow, else by the scan
    assert len(stat_by) == 5 and all(name.startswith("ddpslurm-open") == slow for name in stat_by)
    assert len(os.listdir("/proc/self/fd")) == before
    assert len(pools) == 3 and all((pool is not None) == slow for pool in pools)

    def fails_on_the_second(args, opened):
        if args[0].rank == 1:
            raise RuntimeError("a bug")
        return scan.scan_file(args[0], load_signatures(), opened=opened)

    with pytest.raises(RuntimeError):
        scan_tasks.scan_task(batch, fails_on_the_second)
    assert len(os.listdir("/proc/self/fd")) <= before + 1  # at most the one handed to the failed scan


@pytest.mark.parametrize(("count", "seconds", "slow"), [(0, 0.0, False), (63, 1.0, False), (64, 64 * 60e-6, True),
                                                      (64, 64 * 10e-6, False), (200, 1.0, True)])
def test_opening_is_slow_where_the_first_files_took_a_round_trip_each(monkeypatch, count: int, seconds: float,
                                                                     slow: bool) -> None:
    """A network file system's open (0.1-1 ms) against a local disk's (microseconds), judged once 64 were timed."""
    monkeypatch.setattr(read_ahead, "OPENS_TIMED", [count, seconds])
    assert read_ahead.opens_slow() is slow


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
def test_the_first_files_opened_one_by_one_are_timed_and_a_scan_starts_the_count_again(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    monkeypatch.setattr(read_ahead, "OPENS_TIMED", [0, 0.0])
    monkeypatch.setattr(scan_tasks, "READ_AHEAD_FILES", 3)
    monkeypatch.setattr(read_ahead, "READ_AHEAD_FILES", 3)
    jobs = [(source, None, 0, None, False) for source in _watchdog_logs(tmp_path, 4)]
    for fds in (read_ahead.read_ahead(jobs[:2]), read_ahead.read_ahead(jobs[2:3]), read_ahead.read_ahead(jobs[3:])):
        for opened in fds:
            os.close(opened.fd)
    timed = read_ahead.OPENS_TIMED
    assert timed[0] == 3 and timed[1] > 0  # the fourth came after the reading was made
    timed[1] = 99.0  # as if those had been a slow file system's
    scan.scan_files([job[0] for job in jobs], load_signatures(), workers=1)
    timed = read_ahead.OPENS_TIMED
    assert timed[0] == 3 and timed[1] < 99.0  # timed afresh: this scan's own first files


def test_a_long_task_asks_for_its_files_a_window_ahead(monkeypatch) -> None:
    """No more than two windows of files are open at once (a task holds up to 256), and each window is asked for
    while the one before it is scanned."""
    monkeypatch.setattr(scan_tasks, "READ_AHEAD_FILES", 2)
    order: list[str] = []
    monkeypatch.setattr(scan_tasks, "read_ahead", lambda batch, pool=None: order.append(
        "ahead " + " ".join(j[0].display for j in batch)) or [None] * len(batch))
    batch = [(SourceFile(path=f"r{r}", display=f"r{r}", size=10), None, 0, None, False) for r in range(5)]
    done = scan_tasks.scan_task(batch, lambda args, fd: order.append(args[0].display) or ([], args[0].display))
    assert [name for _, name in done] == ["r0", "r1", "r2", "r3", "r4"]
    assert order == ["ahead r0 r1", "ahead r2 r3", "r0", "r1", "ahead r4", "r2", "r3", "r4"]


def test_only_repeated_victim_facts_are_dropped() -> None:
    def ev(line: int, role: str, sig: str, rank: int = 1, fields: tuple = ()) -> Event:
        return Event(file="f", line=line, kind="k", text="t", rank=rank, role=role, signature=sig, fields=fields)
    events = [ev(1, "victim", "a"), ev(2, "victim", "a"), ev(3, "victim", "a", rank=2),
              ev(4, "victim", "a", fields=(("seq", "9"),)), ev(5, "culprit", "c"), ev(6, "culprit", "c")]
    assert [e.line for e in without_repeats(events)] == [1, 3, 4, 5, 6]


def _victim(line: int, sig: str = "v1", time: float | None = None, who: int = 4, **fields: str) -> Event:
    return Event(file="f", line=line, kind="watchdog_timeout", text="t", rank=who, time=time, role="victim",
                 cause="collective_timeout", signature=sig, fields=tuple(fields.items()))


def test_a_victim_line_that_says_no_more_than_an_earlier_one_of_its_rank_is_dropped() -> None:
    """torch's watchdog tells one timeout in three wordings: a later one with no field and no time of its own
    adds nothing; one with a new field, its own time or another rank does."""
    first = _victim(2, time=5.0, seq="9", op="ALLREDUCE", rank="4")
    generic = _victim(5, "generic", time=5.0)
    progress = _victim(3, "v2", time=5.0, seq="9", last_completed="8")
    later = _victim(9, "generic", time=7.0)
    other_rank = _victim(6, "generic", time=5.0, who=5)
    assert without_repeats([first, progress, generic, later, other_rank]) == [first, progress, later,
                                                                                   other_rank]


@pytest.mark.parametrize(("fields", "dropped"), [({"seq": "9"}, False), ({"seq": "9", "rank": "4"}, True)])
def test_a_victim_read_by_its_file_task_id_is_news_unless_its_text_names_the_rank(fields, dropped) -> None:
    """The rank of a line without a rank prefix comes from the file's srun task id, which numbers nodes under
    torchrun: it repeats a prefixed line of that rank only when its own text names the rank."""
    first = _victim(2, time=5.0, seq="9", rank="4")
    untimed = _victim(8, **fields, srun_task="4")
    assert without_repeats([first, untimed]) == ([first] if dropped else [first, untimed])


def _fact(line: int, kind: str = "nccl_init", pid: int = 7, time: float | None = None, **fields: str) -> Event:
    return Event(file="f", line=line, kind=kind, text="t", host="node-a", pid=pid, time=time,
                 fields=tuple(sorted(fields.items())))


def test_an_nccl_fact_that_repeats_an_earlier_one_of_its_process_is_dropped() -> None:
    start, complete = _fact(2, nccl_rank="5", nranks="8", comm="0xa"), _fact(9, nccl_rank="5", nranks="8", comm="0xa")
    comm, tree = _fact(3, "nccl_rank_map", nccl_rank="5", nranks="8"), _fact(4, "nccl_rank_map", nccl_rank="5")
    assert without_told_facts([start, comm, tree, complete]) == [start]  # an Init line tells a rank map
    assert without_told_facts([comm, tree]) == [comm]
    init_after = _fact(9, nccl_rank="5", nranks="8")
    assert without_told_facts([comm, init_after]) == [comm, init_after]  # a rank map does not tell an Init


def test_an_interface_pick_that_repeats_an_earlier_one_of_its_process_is_dropped() -> None:
    """NCCL's bootstrap line and its transport's out-of-band line name one interface: one pick, whatever else
    each line lists; another interface or address of the same process is news."""
    boot = _fact(3, "interface", ifname="ib0", ip="10.0.0.5", via="Bootstrap", ifnames="ib0")
    oob = _fact(6, "interface", ifname="ib0", ip="10.0.0.5", via="NET/IB", ifnames="ib0,mlx5_0")
    other = _fact(7, "interface", ifname="lo", ip="127.0.0.1", via="NET/Socket")
    assert without_told_facts([boot, oob, other]) == [boot, other]
    assert without_told_facts([boot, _fact(8, "interface", pid=8, ifname="ib0", ip="10.0.0.5")])[1].pid == 8


@pytest.mark.parametrize("later", [
    _fact(9, nccl_rank="5", nranks="8", comm="0xb"),  # another communicator
    _fact(9, nccl_rank="5", nranks="8", comm="0xa", cuda_dev="1"),  # tells more
    _fact(9, pid=8, nccl_rank="5", nranks="8", comm="0xa"),  # another process
    _fact(9, "interface", nccl_rank="5", nranks="8", comm="0xa"),  # another kind of fact
    _fact(9, time=1.0e9, nccl_rank="5", nranks="8", comm="0xa"),  # a time of its own
])
def test_an_nccl_fact_that_tells_something_else_is_kept(later: Event) -> None:
    start = _fact(2, nccl_rank="5", nranks="8", comm="0xa")
    assert without_told_facts([start, later]) == [start, later]


def test_an_nccl_fact_after_a_failure_is_kept_as_a_sign_of_life() -> None:
    start, complete = _fact(2, nccl_rank="5", nranks="8", comm="0xa"), _fact(9, nccl_rank="5", nranks="8", comm="0xa")
    failure = Event(file="f", line=5, kind="socket", text="t", role="either", cause="network_unreachable")
    assert without_told_facts([start, complete, failure]) == [start, complete, failure]  # emitted late
    timed = _fact(1, time=1.0e9, nccl_rank="5", nranks="8", comm="0xa")
    assert without_told_facts([timed, complete]) == [timed, complete]  # an untimed line compares by place


NCCL_INIT = ("{host}:{pid}:{pid} [0] NCCL INFO ncclCommInitRank comm 0x55{comm} rank {rank} nranks {n} cudaDev 0 "
             "nvmlDev 0 busId 18000 commId 0x5f1d - Init {phase}\n")


@settings(max_examples=25, deadline=None)
@given(rank=st.integers(0, 65535), host=st.from_regex(r"[a-z]{1,8}-[0-9]{1,4}", fullmatch=True),
       pid=st.integers(100, 4_000_000), comms=st.integers(1, 3), noise=st.integers(0, 3))
def test_a_scanned_log_tells_each_communicator_once_per_process(tmp_path_factory, rank, host, pid, comms,
                                                                 noise) -> None:
    head = f"{host}:{pid}:{pid} [0] NCCL INFO"
    rank_maps = [f"{head} comm 0x55{{c}} rank {rank} nRanks {rank + 1} nNodes 1 localRanks 1 localRank 0 MNNVL 0\n",
                 f"{head} Trees [0] -1/-1/-1->{rank}->-1 [1] -1/-1/-1->{rank}->-1\n"]
    lines = []
    for c in range(comms):
        lines.append(NCCL_INIT.format(host=host, pid=pid, comm=c, rank=rank, n=rank + 1, phase="START"))
        lines += [line.format(c=c) for line in rank_maps]
        lines += [f"{head} Connected all rings step {i}\n" for i in range(noise)]
        lines.append(NCCL_INIT.format(host=host, pid=pid, comm=c, rank=rank, n=rank + 1, phase="COMPLETE"))
    folder = tmp_path_factory.mktemp("told")
    (folder / "node.log").write_text("".join(lines))
    (folder / "old.log").write_text("".join(line.format(c=0) for line in rank_maps * 2))  # no Init lines
    sigs = load_signatures()
    events, _ = scan.scan_file(SourceFile(path=str(folder / "node.log"), display="node.log"), sigs)
    assert [e.get("comm") for e in events] == [f"0x55{c}" for c in range(comms)]  # its Init lines tell the rest
    assert {e.get("init") for e in events} == {"complete"}  # each START told its COMPLETE came
    assert {(e.kind, e.host, e.pid, e.get("nccl_rank")) for e in events} == {("nccl_init", host, pid, str(rank))}
    events, _ = scan.scan_file(SourceFile(path=str(folder / "old.log"), display="old.log"), sigs)
    assert [(e.kind, e.get("nccl_rank"), e.get("nranks")) for e in events] == [("nccl_rank_map", str(rank),
                                                                                 str(rank + 1))]


@pytest.mark.parametrize(("phases", "want"), [
    (["START"], ["start"]),  # still waiting for its peers when the log ends
    (["COMPLETE"], ["complete"]),  # NCCL 2.18 and older print no START
    (["START", "COMPLETE", "START"], ["complete", "start"]),  # a second communicator never finished
])
def test_an_init_line_tells_whether_nccl_finished_it(tmp_path: Path, phases: list[str], want: list[str]) -> None:
    comms = [0, 0, 1] if len(phases) == 3 else [0] * len(phases)
    path = tmp_path / "node.log"
    path.write_text("".join(NCCL_INIT.format(host="n1", pid=77, comm=c, rank=3, n=8, phase=phase)
                            for c, phase in zip(comms, phases, strict=True)))
    events, _ = scan.scan_file(SourceFile(path=str(path), display="node.log"), load_signatures())
    assert [e.get("init") for e in events] == want


def test_interleaved_ranks_each_finish_their_own_init(tmp_path: Path) -> None:
    """A merged log: rank 1 finishes its init, rank 2 (another process, same comm pointer by chance) does not."""
    path = tmp_path / "slurm-9.out"
    path.write_text("".join(NCCL_INIT.format(host=h, pid=p, comm=0, rank=r, n=2, phase=phase)
                            for h, p, r, phase in (("n1", 5, 1, "START"), ("n2", 6, 2, "START"),
                                                   ("n1", 5, 1, "COMPLETE"))))
    events, _ = scan.scan_file(SourceFile(path=str(path), display="slurm-9.out"), load_signatures())
    assert {(e.host, e.get("init")) for e in events} == {("n1", "complete"), ("n2", "start")}


@pytest.mark.parametrize(("kind", "seen"), [("log", {9}), ("json", {4, 9})])
def test_a_log_file_does_not_hold_its_own_rank_among_the_ranks_its_lines_name(tmp_path: Path, kind, seen) -> None:
    path = tmp_path / "5_4_log.err"
    path.write_text(WATCHDOG.format(r=4) + WATCHDOG.format(r=9))
    source = SourceFile(path=str(path), display=str(path), rank=4, kind=kind)
    events, summary = scan.scan_file(source, load_signatures())
    assert set(summary.ranks_seen) == seen
    _, facts = resolve(events, [source], [summary], {})
    assert facts.present == {4, 9}  # a log file's own rank is present by its name


def _run_in_pty(code) -> bytes:
    pid, fd = pty.fork()
    if pid == 0:  # the child's fds 0-2 are the terminal; pytest's capture objects are not
        sys.stderr = os.fdopen(2, "w")
        code()
        sys.stderr.flush()
        os._exit(0)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return out


def _many_logs(folder: Path) -> Path:
    """A job of more logs than a progress bar is shown for (2,000 files), 18,900 bytes in all."""
    for rank in range(2001):
        (folder / f"5_{rank}_log.out").write_text(f"step {rank}\n")
    return folder


def test_progress_bar_counts_files_and_bytes_on_a_terminal(tmp_path: Path) -> None:
    from ddpslurm.analyze.api import analyze_paths

    job = _many_logs(tmp_path)
    out = _run_in_pty(lambda: analyze_paths([job], workers=1, progress=True))
    assert b"0/2,001 files" in out and b"2,001/2,001 files" in out and b"18.9/18.9 kB" in out


def test_no_progress_bar_when_not_asked_or_not_a_terminal(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    from ddpslurm.analyze.api import analyze_paths

    job = _many_logs(tmp_path)
    assert b"files" not in _run_in_pty(lambda: analyze_paths([job], workers=1, progress=False))
    assert not os.isatty(2)  # pytest's stderr is not a terminal
    analyze_paths([job], workers=1, progress=True)
    assert "scanning logs" not in capfd.readouterr().err


def test_an_event_pickles_with_every_field() -> None:
    import dataclasses
    import pickle

    from ddpslurm.analyze.model import Event

    values = {f.name: (f"v{i}" if f.type in ("str", "str | None") else i + 300) for i, f in
              enumerate(dataclasses.fields(Event))}
    values.update(time=1.5e9, fields=(("rank", "3"),))
    event = Event(**values)
    loaded = pickle.loads(pickle.dumps(event))
    assert loaded == event and type(loaded) is Event
    assert [getattr(loaded, name) for name in values] == list(values.values())


def test_new_event_is_the_frozen_event_its_dataclass_builds() -> None:
    """`new_event` (the hot paths' constructor) takes the dataclass's fields in order with its defaults, and gives
    an event equal to `Event(...)`, hashed alike, and as frozen."""
    import dataclasses
    import inspect

    from ddpslurm.analyze.model import Event, new_event

    params = inspect.signature(new_event).parameters
    fields = dataclasses.fields(Event)
    assert list(params) == [f.name for f in fields]
    assert [p.default for p in params.values()] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        else (f.default if f.default is not dataclasses.MISSING else f.default_factory()) for f in fields]
    values = [f"v{i}" if i % 2 else i for i in range(len(fields))]
    made, built = new_event(*values), Event(*values)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert new_event("f", 1, "k", "t") == Event("f", 1, "k", "t")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.rank = 3  # type: ignore[misc]


def test_moved_is_the_event_replaced_at_another_line() -> None:
    """`moved` (merging a file's ranges) changes the line and fields and keeps every other field."""
    import dataclasses

    from ddpslurm.analyze.model import Event, moved

    fields = dataclasses.fields(Event)
    values = {f.name: f"v{i}" if i % 2 else i for i, f in enumerate(fields)}
    event = Event(**values)
    new_fields = (("traceback_line", "12"),)
    assert moved(event, 99, new_fields) == dataclasses.replace(event, line=99, fields=new_fields)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab\r \t", max_size=30), max_size=12), st.integers(0, 8), st.booleans())
def test_last_lines_are_the_blocks_last_lines(lines: list[str], count: int, long_head: bool) -> None:
    block = ("x" * (5 * blocks.MAX_LINE) + "\n" if long_head else "") + "".join(f"{ln}\n" for ln in lines)
    window = block.encode()[-4 * blocks.MAX_LINE:]
    expected = window.split(b"\n")[:-1][-count:] if count else []
    assert file_summary.last_lines(block.encode(), count) == expected
    reused = bytearray(block.encode() + b"a stale line\nof the buffer's last read")  # a reader's reused buffer
    assert file_summary.last_lines(reused, count, len(block.encode())) == expected


_TAIL_LINE = st.one_of(st.sampled_from(["submitit INFO (2025-03-14 06:00:00,005) - Exiting after successful completion",
                                          "ddpslurm: rank 3 exited 0", "", "  ", "\x1b[31mloss 0.25\x1b[0m"]),
                       st.text(alphabet="ab 7:\r", max_size=20))


@settings(max_examples=300, deadline=None)
@given(st.lists(_TAIL_LINE, min_size=1, max_size=14))
def test_a_file_without_a_kept_tail_has_the_same_last_line_shape(tmp_path_factory: pytest.TempPathFactory,
                                                                 lines: list[str]) -> None:
    """Files past the first TAIL_FILES keep no tail: the last line's shape is read decoding from the end only as far
    as needed (past ddpslurm's and submitit's own lines), and is the shape the kept tail gives."""
    path = tmp_path_factory.mktemp("tail") / "0_log.out"
    path.write_bytes("".join(f"{ln}\n" for ln in lines).encode())
    source = SourceFile(path=str(path), display=str(path), rank=0, size=path.stat().st_size)
    sigs = load_signatures()
    _, kept = scan.scan_file(source, sigs, keep_tail=True)
    _, bare = scan.scan_file(source, sigs, keep_tail=False)
    assert bare.last_line == kept.last_line
    assert bare.tail == ()
    assert kept.last_line == file_summary.last_line_shape(list(kept.tail))


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cycle_collector_is_paused_while_analyzing_and_left_as_it_was(tmp_path: Path, enabled: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpslurm.analyze import api

    (tmp_path / "slurm-1.out").write_text("[rank3]: torch.OutOfMemoryError: CUDA out of memory.\n")
    seen = []
    real = api.diagnose

    def diagnose(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "diagnose", diagnose)
    (gc.enable if enabled else gc.disable)()
    try:
        assert api.analyze_paths([tmp_path]).to_dict()["first_failing_rank"] == 3
        assert gc.isenabled() is enabled
        with pytest.raises(AnalyzeInputError):
            api.analyze_paths([tmp_path / "missing"])
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert seen == [False]


def test_a_merged_log_keeps_every_process_rank_map_fact_past_ten_thousand(tmp_path: Path) -> None:
    """One slurm-%j.out for a 10k-rank job: every process's NCCL rank is told once, none dropped at a cap."""
    n = 10_050
    path = tmp_path / "slurm-1.out"
    with path.open("w") as handle:
        for r in range(n):
            handle.write(f"node{r // 8:05d}:{100000 + r}:{100000 + r} [{r % 8}] NCCL INFO Channel 00/0 : {r}[{r % 8}]"
                         f" -> {(r + 1) % n}[{(r + 1) % 8}] [send] via NET/IB/0\n")
            if r % 1000 == 7:  # the same process again, another channel: already told
                handle.write(f"node{r // 8:05d}:{100000 + r}:{100000 + r} [{r % 8}] NCCL INFO Channel 01/0 : "
                             f"{r}[{r % 8}] -> {(r + 1) % n}[{(r + 1) % 8}] [send] via NET/IB/1\n")
    events, _ = scan.scan_file(SourceFile(path=str(path), display=path.name, size=path.stat().st_size),
                               load_signatures())
    told = {(e.host, e.pid, e.get("nccl_rank")) for e in events if e.kind == "nccl_rank_map"}
    assert len(events) == len(told) == n
    assert (f"node{(n - 1) // 8:05d}", 100000 + n - 1, str(n - 1)) in told


def test_the_ranks_a_file_names_are_kept_up_to_the_bound_resolve_keeps(tmp_path: Path, monkeypatch) -> None:
    from ddpslurm.analyze.diagnose import resolve as resolve_module

    assert line_streams.MAX_RANK_LIST == resolve_module.MAX_RANK_LIST  # a file's rank set and the job's share one bound
    monkeypatch.setattr(line_streams, "MAX_RANK_LIST", 50)
    path = tmp_path / "slurm-1.out"
    path.write_text("".join(WATCHDOG.format(r=r) for r in range(60)))
    _, summary = scan.scan_file(SourceFile(path=str(path), display=path.name, size=path.stat().st_size),
                                load_signatures())
    assert summary.ranks_seen == set(range(50))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["step 1 loss 0.5", "submitit INFO - Starting with JobEnvironment(job_id=1, ...)",
                                 "x JobEnvironment(JobEnvironment( y", "", "JobEnvironment(", "JobEnvironment",
                                 "JJobEnvironment(", "J" * 40, "Job" * 30 + "Environment("]), max_size=12),
       st.integers(min_value=0, max_value=400))
def test_head_starts_finds_the_lines_an_automaton_of_the_head_anchors_finds(lines: list[str], limit: int) -> None:
    from ddpslurm.analyze.read.prefilter import candidate_starts

    block = "".join(f"{line}\n" for line in lines).encode()
    end = min(limit, len(block))
    end = block.rfind(b"\n", 0, end) + 1  # blocks are whole lines
    assert file_scan.head_starts(block, end) == candidate_starts(block, file_scan.HEAD_ANCHOR_BYTES, end)


@pytest.mark.parametrize("text", ["a\nb\n", "a\nb", "", "\n", "x" * 70_000 + "\n", "x" * 70_000],
                         ids=["ends", "cut", "empty", "newline", "overlong-ends", "overlong-cut"])
def test_the_last_byte_a_read_covered_tells_whether_the_file_ends_a_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "r.log"
    path.write_text(text)
    with files.Reader(str(path), 10.0) as reader:
        asked_first = reader.ends_with_newline()  # nothing read yet: the file is asked
        for _block in blocks.iter_blocks(reader):
            pass
        covered = reader.last_byte is not None
        assert reader.ends_with_newline() is asked_first is (text == "" or text.endswith("\n"))
    assert covered is (text != "")


def test_a_file_grown_after_it_was_opened_is_judged_on_its_size_then(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_text("cut here")
    with files.Reader(str(path), 10.0) as reader:
        with path.open("a") as grow:
            grow.write("\nmore\n")
        for _block in blocks.iter_blocks(reader):
            pass
        assert reader.ends_with_newline() is False


def test_canonical_fields_share_equal_pairs_and_keep_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_values, "CANONICAL", {})
    a = shared_values.canonical_fields((("rank", "7"), ("op", "ALLREDUCE")))
    b = shared_values.canonical_fields(tuple((k, "".join(v)) for k, v in (("seq", "9"), ("op", "ALLREDUCE"))))
    assert a == (("rank", "7"), ("op", "ALLREDUCE")) and b == (("seq", "9"), ("op", "ALLREDUCE"))
    assert a[1] is b[1]
    assert shared_values.canonical_fields((("rank", "7"), ("op", "ALLREDUCE"))) is a


def test_canonical_fields_forget_everything_at_the_limit_rather_than_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_values, "CANONICAL", {})
    monkeypatch.setattr(shared_values, "MAX_CANONICAL", 10)
    for rank in range(50):
        fields = shared_values.canonical_fields((("rank", str(rank)), ("op", "ALLREDUCE")))
        assert fields == (("rank", str(rank)), ("op", "ALLREDUCE"))
        assert len(shared_values.CANONICAL) <= 10


def test_spawned_workers_scan_the_jobs_they_are_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked workers inherit the job list and are sent ranges of it; where there is no fork (Windows), spawned
    workers are sent the list once as they start: the same results either way, in the order of the files."""
    sources = []
    for rank in range(5):
        path = tmp_path / f"job_{rank}_log.err"
        path.write_text("step 1\n" * rank + WATCHDOG.format(r=rank))
        sources.append(SourceFile(path=str(path), display=path.name, rank=rank, size=path.stat().st_size))
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(scan_tasks, "BATCH_FILES", 2)  # three tasks
    held = [sys.getrefcount(source) for source in sources]
    forked = scan.scan_files(sources, load_signatures(), workers=2)
    assert [[e.rank for e in events] for events, _ in forked] == [[0], [1], [2], [3], [4]]
    assert [summary.lines for _, summary in forked] == [1, 2, 3, 4, 5]
    monkeypatch.delattr(os, "fork")
    assert scan.scan_files(sources, load_signatures(), workers=2) == forked
    assert [sys.getrefcount(source) for source in sources] == held  # the parent keeps none of the jobs it sent


def test_a_scan_worker_killed_leaves_its_files_to_the_main_process(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker the kernel kills (its OOM killer, here SIGKILL) must not hang the analysis (a pool waits forever for
    a task whose worker died): the files not received are read by the main process, and the report says so."""
    import signal

    from ddpslurm.analyze.api import analyze_paths

    for rank in range(6):
        (tmp_path / f"job_{rank}_log.err").write_text("step 1\n" * rank + WATCHDOG.format(r=rank))
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(scan_tasks, "BATCH_FILES", 2)
    whole = analyze_paths([tmp_path], workers=2)
    parent, real = os.getpid(), scan_tasks.scan_file

    def killed_in_a_worker(source: SourceFile, *args, **kwargs):
        if source.display.endswith("_3_log.err") and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(source, *args, **kwargs)
    monkeypatch.setattr(scan_tasks, "scan_file", killed_in_a_worker)
    after = analyze_paths([tmp_path], workers=2)
    assert after.to_dict()["ranks"] == whole.to_dict()["ranks"]
    assert (after.cause, after.first_failing_rank) == (whole.cause, whole.first_failing_rank)
    assert any("scan worker process ended abruptly" in note for note in after.notes)
    assert not any("scan worker" in note for note in whole.notes)


def test_evolve_is_dataclasses_replace() -> None:
    """`evolve` (the hot paths' `replace`) changes exactly the fields named, each one alone and several at once."""
    import dataclasses

    from ddpslurm.analyze.model import Event, evolve

    fields = [f.name for f in dataclasses.fields(Event)]
    e = Event(*[f"v{i}" if i % 2 else i for i in range(len(fields))])
    for i, name in enumerate(fields):
        assert evolve(e, **{name: f"new{i}"}) == dataclasses.replace(e, **{name: f"new{i}"})
    several = {"rank": 7, "time": 1.5, "fields": (("a", "b"),)}
    assert evolve(e, **several) == dataclasses.replace(e, **several)
    assert evolve(e) == e and evolve(e) is not e
    with pytest.raises(KeyError):
        evolve(e, no_such_field=1)
