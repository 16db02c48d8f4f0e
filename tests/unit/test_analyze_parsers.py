"""Streaming parsers: tracebacks per rank stream, torchelastic blocks, NCCL rank map, line caps, prefilter."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse.scan import scan_file
from ddpslurm.analyze.parse.tracebacks import TracebackAssembler
from ddpslurm.analyze.read.blocks import iter_blocks
from ddpslurm.analyze.read.files import is_binary
from ddpslurm.analyze.read.prefilter import candidate_starts
from ddpslurm.analyze.rules.loading import load_signatures


@pytest.fixture(scope="module")
def sigs():
    return load_signatures(use_env=False)


def scan_text(tmp_path: Path, sigs, text: str, name: str = "job.log", rank: int | None = None):
    path = tmp_path / name
    path.write_text(text)
    return scan_file(SourceFile(path=str(path), display=name, rank=rank, size=path.stat().st_size), sigs)


INTERLEAVED = """\
[rank1]: Traceback (most recent call last):
[rank3]: Traceback (most recent call last):
[rank1]:   File "train.py", line 10, in <module>
[rank3]:   File "train.py", line 12, in <module>
[rank1]:     main()
[rank3]:     step(batch)
[rank3]:   File "model.py", line 40, in step
[rank1]: KeyError: 'label'
[rank3]:     raise ValueError("bad shape")
[rank3]: ValueError: bad shape
"""


def test_interleaved_tracebacks_are_assembled_per_rank(tmp_path: Path, sigs) -> None:
    events, _ = scan_text(tmp_path, sigs, INTERLEAVED)
    exceptions = {e.rank: (e.text, e.line, e.get("where")) for e in events if e.kind == "exception"}
    assert exceptions == {1: ("KeyError: 'label'", 8, "train.py:10 in <module>"),
                          3: ("ValueError: bad shape", 10, "model.py:40 in step")}


CHAINED = """\
Traceback (most recent call last):
  File "a.py", line 1, in f
    open(path)
FileNotFoundError: [Errno 2] No such file or directory: '/data/x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "a.py", line 5, in g
    raise RuntimeError("dataset missing") from None
RuntimeError: dataset missing
"""


def test_chained_traceback_reports_the_last_exception_once(tmp_path: Path, sigs) -> None:
    events, _ = scan_text(tmp_path, sigs, CHAINED, rank=2)
    exceptions = [e for e in events if e.kind == "exception"]
    assert [(e.text, e.rank, e.line) for e in exceptions] == [("RuntimeError: dataset missing", 2, 11)]


def test_c_plus_plus_lines_do_not_end_a_traceback() -> None:
    asm = TracebackAssembler()
    feed = [
        "Traceback (most recent call last):",
        '  File "t.py", line 3, in <module>',
        "node1:12:13 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 - Init COMPLETE",
        "    dist.all_reduce(t)",
        "torch.distributed.DistBackendError: NCCL error",
        "next line",
    ]
    out = []
    for i, line in enumerate(feed, 1):
        out += asm.feed("s", line, i)[1]
    assert [(stream, e.text, e.line) for stream, e in out] == \
        [("s", "torch.distributed.DistBackendError: NCCL error", 5)]


ELASTIC = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-05-08_08:47:32
  host      : node02
  rank      : 11 (local_rank: 3)
  exitcode  : -15 (pid: 1235)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1235
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-05-08_08:47:31
  host      : node02
  rank      : 10 (local_rank: 2)
  exitcode  : -9 (pid: 1234)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1234
============================================================
"""


def test_elastic_failure_block(tmp_path: Path, sigs) -> None:
    events, _ = scan_text(tmp_path, sigs, ELASTIC)
    blocks = {e.get("section"): e for e in events if e.kind == "elastic_failure"}
    root, other = blocks["root"], blocks["other"]
    assert (root.rank, root.host, root.pid, root.local_rank, root.get("signal")) == (10, "node02", 1234, 2, "SIGKILL")
    assert (other.rank, other.get("exitcode")) == (11, "-15")
    assert root.time is not None and other.time is not None and root.time < other.time


def elastic_block(entries: list[tuple[int, str, str, str]], root: int) -> str:
    """A ChildFailedError block of (rank, time, exitcode, traceback) entries, entry `root` as its root cause."""
    def entry(i: int, rank: int, when: str, code: str, told: str) -> str:
        return (f"[{i}]:\n  time      : 2024-03-27_{when}\n  host      : node07\n  rank      : {rank} (local_rank: "
                f"{rank})\n  exitcode  : {code} (pid: {4560 + rank})\n  error_file: <N/A>\n  traceback : {told}\n")
    others = [entry(i + 1, *e) for i, e in enumerate(entries) if i != root]
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 60 + "\ntrain.py FAILED\n"
            + "-" * 60 + "\nFailures:\n" + "".join(others) + "-" * 60 + "\nRoot Cause (first observed failure):\n"
            + entry(0, *entries[root]) + "=" * 60 + "\n")


SEGV = "Signal 11 (SIGSEGV) received by PID {}"


@pytest.mark.parametrize("ranks", [(0, 1, 2), (5, 6, 7), (3, 0, 9)])
def test_a_root_cause_alike_its_others_in_the_same_second_names_no_rank(tmp_path: Path, ranks: tuple) -> None:
    """torchelastic picks the lowest rank among failures of the same second: three segfaults alike are three."""
    entries = [(r, "14:52:55", "-11", SEGV.format(4560 + r)) for r in ranks]
    log = tmp_path / "console.log"
    log.write_text(elastic_block(entries, root=0))
    got = analyze_paths([log]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == ("segfault", None)


@pytest.mark.parametrize(("entries", "rank"), [
    # an earlier second
    ([(4, "14:52:54", "-11", SEGV.format(4564)), (1, "14:52:55", "-11", SEGV.format(4561))], 4),
    # the same second, but the others were stopped by the agent (SIGTERM), not alike
    ([(4, "14:52:55", "-11", SEGV.format(4564)), (1, "14:52:55", "-15", "Signal 15 (SIGTERM) received by PID 4561")],
     4),
])
def test_a_root_cause_that_differs_from_the_others_is_the_first(tmp_path: Path, entries: list, rank: int) -> None:
    log = tmp_path / "console.log"
    log.write_text(elastic_block(entries, root=0))
    got = analyze_paths([log]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == ("segfault", rank)


def test_nccl_init_maps_host_pid_to_global_rank(tmp_path: Path) -> None:
    log = tmp_path / "slurm-1.out"
    log.write_text(
        "gpu-b02:4242:4300 [1] NCCL INFO comm 0x55 rank 1 nranks 2 cudaDev 1 busId 1000 - Init START\n"
        "gpu-b02:4242:4300 [1] NCCL INFO comm 0x66 rank 5 nranks 8 cudaDev 1 busId 1000 - Init COMPLETE\n"
        "gpu-b02:4242:4300 [1] NCCL INFO comm 0x55 rank 1 nranks 2 cudaDev 1 busId 1000 - Init COMPLETE\n"
        "\n"
        "gpu-b02:4242:4310 [1] enqueue.cc:100 NCCL WARN Cuda failure 'out of memory'\n"
    )
    got = analyze_paths([log]).to_dict()
    # the bracket [1] is the CUDA device; the world communicator (nranks 8) says global rank 5
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("cuda_oom", 5, "gpu-b02")


def _blocks(data: bytes, chunk: int, max_line: int) -> list[tuple[bytes, int, int]]:
    """Each block's lines copied out while it is valid (the reader reuses its buffer), their size, and how many
    lines were cut."""
    return [(bytes(block[:end]), end, cut) for block, end, cut in
            iter_blocks(io.BytesIO(data), chunk=chunk, max_line=max_line)]


def test_overlong_line_is_truncated_in_bounded_memory() -> None:
    data = b"a" * 5_000_000 + b" RuntimeError: lost\nnext line\n"
    blocks = _blocks(data, chunk=1 << 16, max_line=1024)
    assert sum(cut for *_, cut in blocks) == 1
    assert max(len(b) for b, *_ in blocks) <= (1 << 16)
    assert b"".join(b for b, *_ in blocks) == b"a" * 1024 + b"\nnext line\n"


@pytest.mark.parametrize("chunk", [777, 4096, 1 << 16])
@pytest.mark.parametrize("end", [b"\n", b"", b"last line without its end"])
def test_blocks_keep_line_numbers_across_chunks(chunk: int, end: bytes) -> None:
    data = b"".join(b"line %d\n" % i for i in range(10_000)) + end
    expected = data if data.endswith(b"\n") else data + b"\n"
    assert b"".join(b for b, *_ in _blocks(data, chunk=chunk, max_line=512)) == expected


@pytest.mark.parametrize("where", [0, 500, 4000, 9000])
def test_an_overlong_line_anywhere_is_cut_and_the_lines_around_it_kept(where: int) -> None:
    lines = [b"line %d\n" % i for i in range(2000)]
    lines.insert(where // 5, b"x" * 3000 + b"\n")
    got = _blocks(b"".join(lines), chunk=1024, max_line=600)
    text = b"".join(b for b, *_ in got)
    assert text.split(b"\n")[:-1] == [ln.rstrip(b"\n")[:600] for ln in lines]
    assert sum(cut for *_, cut in got) == 1


def test_candidate_starts_are_line_starts_of_anchor_lines() -> None:
    block = b"ok\nsome Error here\nok\nWARN x\n"
    assert candidate_starts(block, [b"rror", b"WARN"]) == [3, 22]


@pytest.mark.parametrize(("head", "binary"), [
    (b"\x80\x04\x95pickle\x00\x00\x00\x00" * 50, True),
    (bytes(range(256)) * 8, True),
    ("plain text with \u00e9 accents\n".encode() * 50, False),
    (b"\xff\xfe not utf-8 but text\n" * 50, False),
    (b"a log line\n" * 300 + b"\x00" * 8, False),  # a few NULs at the end of a crashed, truncated log
    (b"", False),
], ids=["pickle", "all-bytes", "utf8", "latin", "nul-tail", "empty"])
def test_is_binary(head: bytes, binary: bool) -> None:
    assert is_binary(head) is binary


def test_one_big_file_split_across_workers_gives_the_same_events(tmp_path: Path, sigs, monkeypatch) -> None:
    import ddpslurm.analyze.parse.scan as scan
    from ddpslurm.analyze.parse.file_ranges import split_points

    monkeypatch.setattr(scan, "SPLIT_MIN_BYTES", 4096)
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    filler = "".join(f"node1:1:2 [0] NCCL INFO Channel {i:02d}/0 : 0[0] -> 1[0] via P2P/IPC\n" for i in range(60))
    text = "".join(filler + INTERLEAVED + filler + ELASTIC for _ in range(12))
    path = tmp_path / "big.log"
    path.write_text(text)
    source = SourceFile(path=str(path), display="big.log", size=path.stat().st_size)
    whole = scan_file(source, sigs)
    parts = scan.scan_files([source], sigs, workers=2)[0]
    key = lambda events: sorted((e.line, e.kind, e.rank, e.text) for e in events)  # noqa: E731
    assert len(split_points(str(path), source.size, 4)) == 5
    assert key(parts[0]) == key(whole[0])
    # 12 x (2 exceptions, ChildFailedError, the block's culprit entry); the block's victim entry names the same
    # rank each time: a repeated fact, kept once (repeated_facts.without_repeats)
    assert len(whole[0]) == 12 * 4 + 1
    assert parts[1].lines == whole[1].lines == text.count("\n")


@pytest.mark.parametrize(("tail", "cut"), [(" RuntimeError: boom", 1), (" nothing to see", 0)])
def test_an_overlong_line_inside_a_block_is_counted_when_it_is_read(tmp_path: Path, tail: str, cut: int) -> None:
    """A candidate line past MAX_LINE is read up to it and counted as cut (the report says so); a line no anchor
    brings in is not read at all, so nothing of it is lost."""
    from ddpslurm.analyze.model import SourceFile
    from ddpslurm.analyze.parse import scan
    from ddpslurm.analyze.read.blocks import MAX_LINE
    from ddpslurm.analyze.rules.loading import load_signatures

    log = tmp_path / "1_0_log.err"
    log.write_text("first\n" + "x" * (MAX_LINE + 4000) + tail + "\nlast\n")
    _events, summary = scan.scan_file(SourceFile(path=str(log), display=log.name, size=log.stat().st_size),
                                      load_signatures())
    assert (summary.truncated_lines, summary.lines) == (cut, 3)


def test_the_prefilter_sample_is_the_head_of_the_largest_readable_text_files(tmp_path: Path) -> None:
    from ddpslurm.analyze.read.files import prefilter_sample

    def source(name: str, data: bytes) -> SourceFile:
        (tmp_path / name).write_bytes(data)
        return SourceFile(path=str(tmp_path / name), display=name, size=len(data))

    small = source("small.log", b"s" * 100)
    big = source("big.log", b"b" * 5000)
    binary = source("model.pt", b"\x00\x01" * 8000)
    gone = SourceFile(path=str(tmp_path / "gone.log"), display="gone.log", size=9000)
    sample = prefilter_sample([small, gone, big, binary], size=4096)
    assert sample == b"b" * 1024 + b"s" * 100  # a quarter at most from one file; largest first; the rest skipped


def test_a_tuned_prefilter_scans_a_large_input_in_workers_as_one_process_does(tmp_path: Path, sigs,
                                                                               monkeypatch) -> None:
    import ddpslurm.analyze.parse.scan as scan
    import ddpslurm.analyze.read.prefilter as prefilter

    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(scan, "TUNE_MIN_BYTES", 0)
    monkeypatch.setattr(prefilter, "FINDERS", {})
    tuned: list[int] = []
    monkeypatch.setattr(scan, "tune", lambda anchors, sample: tuned.append(len(sample)) or
                        prefilter.tune(anchors, sample))
    filler = "".join(f"node1:1:2 [0] NCCL INFO Channel {i:02d}/0 : 0[0] -> 1[0] via P2P/IPC\n" for i in range(60))
    sources = []
    for i in range(4):
        path = tmp_path / f"{i}.log"
        path.write_text(filler + INTERLEAVED + filler + ELASTIC)
        sources.append(SourceFile(path=str(path), display=path.name, size=path.stat().st_size))
    alone = [scan_file(s, sigs) for s in sources]
    together = scan.scan_files(sources, sigs, workers=2)
    assert tuned == [sum(s.size for s in sources)]
    assert [sorted((e.line, e.kind, e.rank, e.text) for e in evs) for evs, _ in together] == \
        [sorted((e.line, e.kind, e.rank, e.text) for e in evs) for evs, _ in alone]
    assert [s.lines for _, s in together] == [s.lines for _, s in alone]


@settings(max_examples=40, deadline=None)
@given(culprit=st.integers(0, 99_999), other=st.integers(0, 99_999), after=st.integers(0, 450),
       label=st.sampled_from(["{r}: ", "[rank{r}]:", "[default0]:[rank{r}]:"]))
def test_a_traceback_left_open_by_a_silent_rank_stays_that_ranks(tmp_path_factory, sigs, culprit: int, other: int,
                                                                    after: int, label: str) -> None:
    """A rank dies after its traceback and writes nothing more; the others go on logging (hundreds of lines, more
    than a traceback waits idle). Its exception is its own, however many lines later it is given up on."""
    from hypothesis import assume

    assume(culprit != other)
    mine, theirs = label.format(r=culprit), label.format(r=other)
    text = (f"{mine}Traceback (most recent call last):\n{mine}  File \"train.py\", line 9, in <module>\n"
            f"{mine}    step()\n{mine}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            + "".join(f"{theirs}still training, step {i}\n" for i in range(after)))
    events, _ = scan_text(tmp_path_factory.mktemp("log"), sigs, text)
    assert [(e.kind, e.rank, e.line) for e in events if e.cause == "cuda_oom"] == [("exception", culprit, 4)]


@settings(max_examples=60, deadline=None)
@given(order=st.lists(st.sampled_from(["filler", "interleaved", "elastic", "oom", "retried"]), min_size=1, max_size=8),
       cuts=st.lists(st.floats(0.0, 1.0), max_size=6))
def test_a_file_cut_anywhere_into_ranges_reads_as_the_whole_file(tmp_path_factory, sigs, order: list[str],
                                                                  cuts: list[float]) -> None:
    """Ranges cut at any line start, inside a traceback or a torchelastic block too, or between a logged exception
    and the line saying its process went on: merged, their events are the whole file's (a range that starts inside
    a block, or where an exception is watched, leaves those lines to the range that read the block)."""
    from ddpslurm.analyze.parse.file_ranges import merge_parts

    pieces = {"filler": "".join(f"node1:1:2 [0] NCCL INFO Channel {i:02d}/0 : 0[0] -> 1[0] via P2P/IPC\n"
                                for i in range(5)),
              "interleaved": INTERLEAVED, "elastic": ELASTIC,
              "oom": "[rank6]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
              "retried": "[rank6]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                         "[rank6]: retrying with a smaller batch\n"}
    text = "".join(pieces[p] for p in order)
    path = tmp_path_factory.mktemp("log") / "big.log"
    path.write_text(text)
    data = text.encode()
    starts = sorted({data.rfind(b"\n", 0, int(c * len(data))) + 1 for c in cuts} - {0, len(data)})
    bounds = [0, *starts, len(data)]
    source = SourceFile(path=str(path), display="big.log", size=len(data))
    whole = scan_file(source, sigs)
    parts = merge_parts([scan_file(source, sigs, start=a, end=b) for a, b in itertools.pairwise(bounds)])
    key = lambda events: [(e.line, e.kind, e.rank, e.text, e.fields) for e in events]  # noqa: E731
    assert key(parts[0]) == key(whole[0])
    assert parts[1].lines == whole[1].lines == text.count("\n")


def test_a_later_ranges_line_numbers_in_fields_are_counted_from_the_files_start(tmp_path, sigs) -> None:
    """A range's events come back with the line numbers among their fields (a traceback's first line, the line a
    process went on at) counted from the file's start, as the whole file's."""
    from ddpslurm.analyze.parse.file_ranges import merge_parts

    head = "".join(f"node1:1:2 [0] NCCL INFO Channel {i:02d}/0 : 0[0] -> 1[0] via P2P/IPC\n" for i in range(40))
    tail = ('[rank6]: Traceback (most recent call last):\n[rank6]:   File "train.py", line 9, in <module>\n'
            "[rank6]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            "[rank6]: retrying with a smaller batch\n")
    path = tmp_path / "big.log"
    path.write_text(head + tail)
    source = SourceFile(path=str(path), display="big.log", size=path.stat().st_size)
    whole = scan_file(source, sigs)
    cut = len(head.encode())
    parts = merge_parts([scan_file(source, sigs, start=0, end=cut),
                         scan_file(source, sigs, start=cut, end=source.size)])
    fields = [(e.line, e.kind, e.fields) for e in whole[0]]
    assert {name for _line, _kind, f in fields for name, _ in f} >= {"traceback_line", "went_on_line"}
    assert [(e.line, e.kind, e.fields) for e in parts[0]] == fields


@settings(max_examples=12, deadline=None)
@given(count=st.sampled_from([2, 49, 60, 250, 700]), seed=st.integers(0, 1000),
       label=st.sampled_from(["{r}: ", "[rank{r}]:"]))
def test_tracebacks_of_many_ranks_interleaved_line_by_line_are_each_read_whole(tmp_path_factory, sigs, count: int,
                                                                                seed: int, label: str) -> None:
    """Every rank of a merged log prints its traceback at once, the lines interleaved: one rank's next line comes
    as many lines later as there are ranks. Each traceback is still read whole, where it was raised included."""
    import random

    ranks = random.Random(seed).sample(range(100_000), count)
    frames = ['Traceback (most recent call last):', '  File "train.py", line 50, in <module>', "    main()",
              '  File "train.py", line 40, in main', "    step()", "ValueError: the batch is empty"]
    text = "".join(f"{label.format(r=r)}{line}\n" for line in frames for r in ranks)
    events, _ = scan_text(tmp_path_factory.mktemp("log"), sigs, text)
    got = sorted((e.rank, e.get("where"), e.line) for e in events if e.kind == "exception")
    first_exception_line = 5 * len(ranks) + 1
    assert got == sorted((r, "train.py:40 in main", first_exception_line + i) for i, r in enumerate(ranks))


@pytest.mark.parametrize("after", [0, 3, 250])
def test_a_labelled_traceback_ended_by_another_streams_line_keeps_its_label(tmp_path: Path, sigs, after: int) -> None:
    """srun --label's `N: ` may number torchrun's nodes, not ranks: an exception carries the label it came from
    (resolve reads `srun_task`), also when the file ends, or another stream's line ends the wait, on a line with
    another label or none."""
    text = ("1: Traceback (most recent call last):\n1:   File \"run.py\", line 3, in <module>\n1:     main()\n"
            "1: torch.distributed.elastic.rendezvous.api.RendezvousClosedError\n"
            + "".join(f"2: [rank9]:still waiting {i}\n" for i in range(after)) + "no label at all\n")
    events, _ = scan_text(tmp_path, sigs, text)
    closed = [e for e in events if "RendezvousClosedError" in e.text]
    assert [(e.rank, e.get("srun_task")) for e in closed] == [(1, "1")]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), labels=st.sampled_from([("1: ", "4: "), ("node02: ", "node05: ")]))
def test_two_agents_failure_blocks_interleaved_are_each_read_whole(tmp_path_factory, sigs, seed: int,
                                                                  labels: tuple[str, str]) -> None:
    """Two torchrun agents of a merged log print their ChildFailedError blocks at once, lines interleaved in any
    order (each block's own in order): every entry keeps its rank, host, exit code and section."""
    import random

    other = (ELASTIC.replace("node02", "node05").replace(": 11 (", ": 41 (").replace(": 10 (", ": 40 (")
             .replace("1234", "5678").replace("1235", "5679"))
    queues = [[labels[0] + line for line in ELASTIC.splitlines()], [labels[1] + line for line in other.splitlines()]]
    rng, lines = random.Random(seed), []
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        lines.append(queue.pop(0))
    events, _ = scan_text(tmp_path_factory.mktemp("log"), sigs, "\n".join(lines) + "\n")
    entries = sorted((e.rank, e.host, e.get("exitcode"), e.get("section")) for e in events
                     if e.kind == "elastic_failure")
    assert entries == [(10, "node02", "-9", "root"), (11, "node02", "-15", "other"), (40, "node05", "-9", "root"),
                       (41, "node05", "-15", "other")]


CUT = """\
[rank18]: Traceback (most recent call last):
[rank18]:   File "/opt/app/train.py", line 120, in <module>
[rank18]:     main()
[rank18]:   File "/opt/app/train.py", line 682, in train_step
[rank18]:     loss = model(batch)
"""


def test_a_traceback_cut_before_its_exception_line_still_says_its_stream_raised(tmp_path: Path, sigs) -> None:
    """CPython prints the exception line last: frames without it are a process killed mid-print or a cut paste.
    The stream raised all the same; its last frame is what is left (weak evidence, `either`)."""
    events, _ = scan_text(tmp_path, sigs, CUT)
    cut = [(e.rank, e.signature, e.role, e.line, e.text, e.get("where")) for e in events if e.kind == "exception"]
    assert cut == [(18, "python-traceback-cut", "either", 4, 'File "/opt/app/train.py", line 682, in train_step',
                    "/opt/app/train.py:682 in train_step")]


@pytest.mark.parametrize(("after", "cut"), [
    ("", True),  # the input ends
    ("=== 12 ===", True),  # a line that is no exception line ends it
    ("KeyError: 'label'", False),  # the exception line: the usual reading
])
def test_only_frames_without_an_exception_line_read_as_cut(after: str, cut: bool) -> None:
    asm = TracebackAssembler()
    lines = ["Traceback (most recent call last):", '  File "t.py", line 3, in <module>', "    f()", after]
    out = []
    for i, line in enumerate(lines, 1):
        if line:
            out += asm.feed("s", line, i)[1]
    out += asm.close_all()
    assert [(e.cut, e.text) for _, e in out] == [(cut, 'File "t.py", line 3, in <module>' if cut else after)]


def test_a_traceback_header_alone_says_nothing() -> None:
    asm = TracebackAssembler()
    asm.feed("s", "Traceback (most recent call last):", 1)
    assert asm.close_all() == []


def test_a_cut_traceback_weighs_less_than_another_ranks_failure(tmp_path: Path) -> None:
    """One rank's full CUDA OOM beside another rank's traceback cut before its exception: the OOM is the culprit."""
    from ddpslurm.analyze.api import analyze_paths

    (tmp_path / "rank0.log").write_text(CUT.replace("rank18", "rank0"))
    (tmp_path / "rank5.log").write_text(
        "[rank5]: Traceback (most recent call last):\n[rank5]:   File \"train.py\", line 9, in <module>\n"
        "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total "
        "capacity of 79.15 GiB of which 1.2 GiB is free.\n")
    found = analyze_paths([tmp_path], workers=1).to_dict()
    assert (found["cause"], found["first_failing_rank"]) == ("cuda_oom", 5)
    alone = analyze_paths([tmp_path / "rank0.log"], workers=1).to_dict()
    assert (alone["cause"], alone["first_failing_rank"]) == ("user_code_exception", 0)


@pytest.mark.parametrize(("where", "library"), [
    ("/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py:1890 in broadcast", True),
    ("/home/u/env/lib/python3.9/site-packages/torch/distributed/distributed_c10d.py:1890 in broadcast", True),
    ("C:\\Python311\\Lib\\site-packages\\torch\\nn\\modules\\module.py:1501 in _call_impl", True),
    ("/usr/lib/python3.11/threading.py:975 in run", True),
    ("<frozen runpy>:198 in _run_module_as_main", True),
    ("/usr/local/bin/torchrun:8 in <module>", True),
    ("/root/anaconda3/envs/faster/bin/torchrun:8", True),
    ("/home/u/proj/bin/train.py:12 in main", False),
    ("/opt/app/train.py:682 in train_step", False),
    ("train.py:10 in <module>", False),
    (None, True),
])
def test_a_cut_tracebacks_last_frame_tells_library_from_script(where: str | None, library: bool) -> None:
    from ddpslurm.analyze.parse.tracebacks import in_library

    assert in_library(where) is library


def test_a_traceback_cut_inside_a_library_call_or_of_no_known_rank_says_nothing(tmp_path: Path, sigs) -> None:
    """Cut inside torch's broadcast, a victim's collective error and a bug read the same: no event; nor for a cut
    traceback of no known rank (a console's, which may be any process's, the launcher's too)."""
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 397, in train\n"
            "    dist.broadcast_object_list(broadcast_list, 0)\n"
            "  File \"/env/lib/python3.9/site-packages/torch/distributed/distributed_c10d.py\", line 1890, in "
            "broadcast_object_list\n    broadcast(object_tensor, src=src, group=group)\n")
    events, _ = scan_text(tmp_path, sigs, text, rank=3)
    assert [e for e in events if e.kind == "exception"] == []
    events, _ = scan_text(tmp_path, sigs, CUT.replace("[rank18]: ", ""))
    assert [e for e in events if e.kind == "exception"] == []
    events, _ = scan_text(tmp_path, sigs, CUT.replace("[rank18]: ", ""), rank=18)
    assert [(e.rank, e.signature) for e in events if e.kind == "exception"] == [(18, "python-traceback-cut")]


def test_a_cut_traceback_is_dropped_where_its_rank_tells_more_elsewhere(tmp_path: Path) -> None:
    """The traceback's rest in a second file of the same rank (a split or rotated log) names the exception: that
    rank's cut traceback adds nothing and is dropped; a rank with nothing else keeps its own."""
    from ddpslurm.analyze.diagnose.engine import cut_tracebacks_told_otherwise
    from ddpslurm.analyze.model import Event

    cut = Event("a.log", 4, "exception", 'File "t.py", line 3, in f', rank=2, cause="user_code_exception",
                role="either", signature="python-traceback-cut")
    rest = Event("a.1.log", 1, "exception", "RuntimeError: boom", rank=2, cause="user_code_exception",
                 role="culprit", signature="python-exception")
    other = Event("b.log", 9, "watchdog_timeout", "[Rank 5] Watchdog caught ...", rank=5, cause="collective_timeout",
                  role="victim", signature="watchdog-timeout-v1")
    assert cut_tracebacks_told_otherwise([cut, rest, other]) == [rest, other]
    assert cut_tracebacks_told_otherwise([cut, other]) == [cut, other]


WRAPPER_TRACEBACK = ("{head}Traceback (most recent call last):\n"
                     "{head}  File \"/opt/app/train.py\", line 212, in save\n"
                     "{head}    torch.save(state, path)\n"
                     "{head}  File \"/opt/conda/lib/python3.10/site-packages/torch/serialization.py\", line 604, "
                     "in _save\n"
                     "{head}    zip_file.write_record(name, storage.data_ptr(), num_bytes)\n"
                     "{head}OSError: [Errno 28] No space left on device\n")


@pytest.mark.parametrize("heads", [
    ["2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] [09c561ee-a44c-4795-967c-7183a83b3160] "] * 6,
    [f"2019-07-04T06:18:4{i}.000Z /container_e559_1557431881457_79419_05_000002: " for i in range(6)],  # times tick
    ["job-7 | worker-a | "] * 6,
])
def test_a_wrappers_prefix_on_every_line_of_a_traceback_is_read_past(tmp_path: Path, sigs, heads: list[str]) -> None:
    lines = WRAPPER_TRACEBACK.format(head="\0").splitlines(keepends=True)
    text = "step 1 loss 0.4\n" + "".join(line.replace("\0", head) for line, head in zip(lines, heads, strict=True))
    events, _summary = scan_text(tmp_path, sigs, text)
    exceptions = [e for e in events if e.kind == "exception"]
    assert [(e.line, e.text) for e in exceptions] == [(7, "OSError: [Errno 28] No space left on device")]
    assert exceptions[0].get("where") == "/opt/conda/lib/python3.10/site-packages/torch/serialization.py:604 in _save"


def _assembled(lines: list[str]) -> list:
    """The exceptions a traceback assembler reads from `lines` of one stream."""
    tb = TracebackAssembler()
    finished = [exc for n, line in enumerate(lines, 1) for _s, exc in tb.feed("s", line, n)[1]]
    return finished + [exc for _s, exc in tb.close_all()]


def test_lines_without_the_headers_prefix_are_read_as_they_are() -> None:
    """A logger that prefixes only a message's first line (Python's logging): the frames after it carry none."""
    lines = ["2024-01-02 10:00:00 ERROR root: Traceback (most recent call last):", '  File "t.py", line 3, in f',
             "    f()", "ValueError: bad"]
    assert [(e.text, e.where) for e in _assembled(lines)] == [("ValueError: bad", "t.py:3 in f")]


def test_a_prefix_of_another_shape_ends_a_wrapped_traceback() -> None:
    lines = ["[task 1] Traceback (most recent call last):", '[task 1]   File "t.py", line 3, in f',
             "[task 1] KeyError: 'x'", "[other 22] KeyError: 'y'"]
    assert [e.text for e in _assembled(lines)] == ["KeyError: 'x'"]
