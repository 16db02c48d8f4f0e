"""How a log ends: the marks of each file's last lines' shapes (`file_summary`) and the ranks whose log stopped
before the line most ranks' logs reach (`timeline.stopped_early`), with lines of a rank's own printed around it.

The ranks print one program's lines in one order (a data index built, then init called); each rank also prints
lines of its own anywhere (warnings, retries, progress, a logged traceback), which no other rank prints at the same
place. Ranks are renumbered and the lines of a rank's own drawn at random, so no test depends on which rank is the
silent one or on what the other lines say.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.diagnose.timeline import stopped_early
from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse import file_summary, scan
from ddpslurm.analyze.parse.attribution import clean
from ddpslurm.analyze.rules.loading import load_signatures

BUILD = "[rank {r}] building index from /data/{host}/train.lmdb"
READY = "[rank {r}] index ready: 1281167 samples; calling init_process_group (world_size={n})"


def _own_line(rng: random.Random, r: int) -> str:
    """A line only this rank prints here: its words drawn at random (no other rank's line has its shape)."""
    words = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(rng.randrange(12, 60)))
    return f"{rng.choice(['WARNING', 'INFO', 'wandb:', 'Traceback', '  File'])} {words} {rng.randrange(10**6)}"


def _logs(ranks: int, silent: int, own_after: int, seed: int, host: str = "gpu-a") -> dict[int, list[str]]:
    """Every rank's log: the program's two lines (the silent rank's first only), with up to `own_after` lines of
    the rank's own after its last program line and a few before."""
    rng = random.Random(seed)
    logs = {}
    for r in range(ranks):
        program = [BUILD.format(r=r, host=host)] + ([] if r == silent else [READY.format(r=r, n=ranks)])
        lines = [_own_line(rng, r) for _ in range(rng.randrange(3))] + program
        lines += [_own_line(rng, r) for _ in range(rng.randrange(own_after + 1))]
        logs[r] = lines
    return logs


def _summaries(tmp: Path, logs: dict[int, list[str]]) -> dict[int, tuple[tuple[int, ...], int, bool]]:
    """Each rank's log scanned as a file: its marks, its line count and whether its last lines are all of it."""
    sigs = load_signatures()
    out = {}
    for r, lines in logs.items():
        path = tmp / f"rank_{r}.log"
        path.write_text("".join(f"{ln}\n" for ln in lines))
        _, summary = scan.scan_file(SourceFile(path=str(path), display=path.name, rank=r, size=path.stat().st_size),
                                    sigs)
        out[r] = (file_summary.marks_of(summary.end_marks), summary.lines, summary.lines <= file_summary.TAIL_LINES)
    return out


@pytest.mark.parametrize("ranks", [5, 8, 33])
@pytest.mark.parametrize("seed", range(4))
def test_lines_of_a_rank_s_own_after_the_common_line_leave_the_silent_rank_alone_early(
        tmp_path: Path, ranks: int, seed: int) -> None:
    """Up to 40 lines of each rank's own after the line most ranks reach (their line counts then differ several
    fold): only the rank whose log lacks that line stopped early, whichever rank it is and however its host is
    named."""
    silent = random.Random(seed).randrange(ranks)
    scanned = _summaries(tmp_path, _logs(ranks, silent, own_after=40, seed=seed, host=f"node{seed}-"))
    tails = {r: marks for r, (marks, _n, _w) in scanned.items()}
    counts = {r: n for r, (_m, n, _w) in scanned.items()}
    whole = {r for r, (_m, _n, w) in scanned.items() if w}
    assert stopped_early(tails, counts, whole) == {silent}


def test_a_rank_whose_last_lines_are_all_its_own_tells_nothing() -> None:
    """A rank that printed more lines of its own after the common line than a summary keeps: its last lines lack
    the line, and hold no line of the program's either: not early (the line may be out of view), while the rank
    whose last lines show the program's earlier line and not the later one is."""
    rng = random.Random(7)
    ready, build = "ready", "build"
    tails: dict[int, tuple[str, ...]] = {r: (build, ready) for r in range(6)}
    tails[2] = tuple(_own_line(rng, 2) for _ in range(64))  # the common line pushed out of view
    tails[4] = (build,)
    counts = dict.fromkeys(range(6), 100)
    assert stopped_early(tails, counts) == {4}


def test_a_rank_that_reached_the_common_line_did_not_stop_early_however_short_its_log() -> None:
    """Lines printed before the common line (another rank's long logged traceback) make the line counts differ: a
    rank whose last lines hold the line reached it; one far shorter that lacks it stopped early."""
    tails = {r: ("build", "ready") for r in range(5)} | {5: ("build",)}
    counts = {0: 6, 1: 49, 2: 27, 3: 17, 4: 9, 5: 27}
    assert stopped_early(tails, counts) == {5}
    tails[0] = ("x-own-line", "build")
    assert stopped_early(tails, counts) == {0, 5}


def test_a_log_with_more_lines_than_most_that_lacks_the_common_line_stopped_early_when_seen_whole() -> None:
    """The silent rank printed the most lines of its own (all before its program stopped): its whole log is in
    view and lacks the line most ranks reach."""
    tails = {r: ("build", "ready") for r in range(6)}
    tails[3] = ("build", "own a", "own b", "own c")
    counts = dict.fromkeys(range(6), 10) | {3: 282}
    assert stopped_early(tails, counts, whole={3}) == {3}
    assert stopped_early(tails, counts) == {3}  # its last lines show the program's earlier line too


def test_only_a_stream_s_last_line_known_keeps_the_last_line_judgement() -> None:
    """Of a stream of a merged log only its last line is known: a last line unlike most ranks' tells it stopped
    early, unless its log goes on past the others."""
    tails = {r: ("timeout",) for r in range(5)} | {2: ("step",)}
    counts = dict.fromkeys(range(5), 20)
    assert stopped_early(tails, counts, last_only=range(5)) == {2}
    assert stopped_early(tails, counts | {2: 90}, last_only=range(5)) == set()


_LINE = st.one_of(
    st.sampled_from(["ddpslurm: rank 3 exited 0", "submitit INFO (2025-03-14 06:00:00,005) - Exiting", "", "  ",
                     "\x1b[31mloss 0.25\x1b[0m", "epoch 1 |\u2588\u2588   | 30%\rEpoch 1 |\u2588\u2588\u2588| 100%",
                     "bell\x07 and tab\tkept", "caf\u00e9 12", "\r\r"]),
    st.text(alphabet="ab 7:\r\x1b[m\x00\t\u00e9", max_size=24))


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINE, min_size=0, max_size=80))
def test_the_marks_are_the_decoded_shapes_checksums(lines: list[str]) -> None:
    """The bytes path (one pass, no decoding) gives each line the shape the decoded path gives it (cleaned, digits
    deleted, blank and own lines aside as `line_shapes` does): their CRC-32s, the last TAIL_LINES lines' only."""
    raw = [ln.encode() for ln in lines][-file_summary.TAIL_LINES:]
    want = file_summary.line_shapes([clean(ln.decode()).translate(str.maketrans("", "", "0123456789"))
                                     for ln in raw])
    marks = file_summary.line_marks(file_summary.byte_shapes(raw))
    assert tuple(file_summary.marks_of(marks)) == tuple(zlib.crc32(s.encode()) for s in want)
