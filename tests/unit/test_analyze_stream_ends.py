"""Where each rank's lines end in one log that srun --label merged (stream_ends), and what the engine makes of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.diagnose.resolve import JobFacts
from ddpslurm.analyze.diagnose.timeline import build_timeline
from ddpslurm.analyze.model import FileSummary, SourceFile
from ddpslurm.analyze.parse import stream_ends
from ddpslurm.analyze.parse.file_summary import last_line_shape
from ddpslurm.analyze.parse.scan import scan_file
from ddpslurm.analyze.rules.loading import load_signatures

STORE_TIMEOUT = ("torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. "
                 "{n}/{w} clients joined.")


def merged_log(world: int, silent: int, width: int = 1, preamble: str = "") -> str:
    """Every rank reaches init_process_group but `silent`, which is still loading its data; rank 0's TCPStore
    gives up waiting for it. Lines in time order, each rank's own in its order (srun --label)."""
    lines = [f"{r:>{width}}: [rank {r}] building index from /data/train.lmdb" for r in range(world)]
    lines += [f"{r:>{width}}: [rank {r}] index ready; calling init_process_group (world_size={world})"
              for r in range(world) if r != silent]
    lines += [f"{0:>{width}}: {STORE_TIMEOUT.format(n=world - 1, w=world)}"]
    return preamble + "\n".join(lines) + "\n"


@pytest.mark.parametrize(("head", "labelled"), [
    (b"0: x\n", True), (b"  12: step 1\n", True), (b"Job 7 on node-a\nstarting\n3: hello\n", True),
    (b"step 3: loss 2.1\n", False), (b"submitit INFO (2025-01-01) - Starting\n", False), (b"", False),
    (b"12: ", False), (b"a\n" * stream_ends.HEAD_LINES + b"3: x\n", False), (b"1234567: x\n", False),
])
def test_a_merged_log_is_told_by_a_labelled_line_among_its_first(head: bytes, labelled: bool) -> None:
    assert stream_ends.looks_labelled(head) is labelled


def test_the_tally_counts_each_label_and_keeps_its_last_line() -> None:
    tally = stream_ends.StreamTally()
    text = merged_log(4, silent=3, width=2).encode()
    half = text.index(b"\n", len(text) // 2) + 1
    tally.feed(text[:half] + b"garbage after the block's end", half)  # a block is its lines up to `end`
    tally.feed(text[half:], len(text) - half)
    ends = tally.ends(last_line_shape)
    assert sorted(ends) == [0, 1, 2, 3]
    assert ends[0] == (3, "torch.distributed.DistStoreError: Timed out after  seconds waiting for clients. / "
                          "clients joined.")
    assert ends[1] == ends[2] == (2, "[rank ] index ready; calling init_process_group (world_size=)")
    assert ends[3] == (1, "[rank ] building index from /data/train.lmdb")


@pytest.mark.parametrize("text", [
    "0: only one label\n0: again\n",  # one stream is not a merge
    "0: a\n1: b\n" + "an unlabelled line\n" * 3,  # mostly unlabelled: a log that happens to start so
])
def test_a_file_that_is_not_a_merged_log_has_no_streams(text: str) -> None:
    tally = stream_ends.StreamTally()
    tally.feed(text.encode(), len(text))
    assert tally.ends(last_line_shape) == {}


def _scan(path: Path) -> FileSummary:
    source = SourceFile(path=str(path), display=str(path), size=path.stat().st_size)
    return scan_file(source, load_signatures())[1]


def test_the_scan_tallies_a_merged_log_and_only_it(tmp_path: Path) -> None:
    merged = tmp_path / "slurm-9.out"
    merged.write_text(merged_log(8, silent=5, preamble="Job 9 starting on node-a\n"))
    rank_log = tmp_path / "9_3_log.out"
    rank_log.write_text("[rank 3] building index\n[rank 3] index ready\n")
    streams = _scan(merged).streams
    assert sorted(streams) == list(range(8)) and streams[5][0] == 1
    assert _scan(rank_log).streams == {}


def test_a_merged_log_over_the_bound_is_read_and_said_untallied(tmp_path: Path, monkeypatch) -> None:
    merged = tmp_path / "slurm-9.out"
    merged.write_text(merged_log(8, silent=5))
    monkeypatch.setattr(stream_ends, "MAX_BYTES", 100)
    summary = _scan(merged)
    assert summary.streams == {} and summary.streams_untallied
    diagnosis = analyze_paths([merged], workers=1)
    assert diagnosis.cause == "rendezvous_timeout"
    assert any("was not compared in" in note and "slurm-9.out" in note for note in diagnosis.notes)


@pytest.mark.parametrize(("world", "silent", "width"), [(8, 5, 1), (8, 7, 1), (16, 11, 2), (32, 2, 2)])
def test_the_rank_that_went_silent_in_a_merged_log_is_named(tmp_path: Path, world: int, silent: int,
                                                             width: int) -> None:
    """Rank 0's store names no rank (K/W joined): the one whose stream stops before init is the culprit."""
    merged = tmp_path / "slurm-9.out"
    merged.write_text(merged_log(world, silent, width))
    diagnosis = analyze_paths([merged], workers=1)
    assert (diagnosis.cause, diagnosis.first_failing_rank) == ("rendezvous_timeout", silent)


def test_under_torchrun_labels_number_nodes_and_no_rank_is_read_from_them() -> None:
    summary = FileSummary(file="slurm-9.out", streams={0: (9, "a"), 1: (9, "a"), 2: (9, "a"), 3: (1, "b")})
    for torchrun, early in ((False, {3}), (True, set())):
        ranks = build_timeline([], JobFacts(torchrun=torchrun), [], [summary]).ranks
        assert {r for r, tl in ranks.items() if tl.stopped_early} == early


def test_a_rank_with_a_log_of_its_own_is_read_from_that_log() -> None:
    own = FileSummary(file="r3.log", lines=9, last_line="a")
    merged = FileSummary(file="slurm-9.out", streams={0: (9, "a"), 1: (9, "a"), 2: (9, "a"), 3: (1, "b")})
    ranks = build_timeline([], JobFacts(), [SourceFile(path="r3.log", display="r3.log", rank=3)], [own, merged]).ranks
    assert ranks[3].log_lines == 9 and not any(tl.stopped_early for tl in ranks.values())
