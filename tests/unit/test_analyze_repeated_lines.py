"""A line a log repeats (a retry loop printing its exception again and again): read by its shape once, the rest
replayed (while the exception is watched for a sign the process went on, and with a timestamp prefix), and the
same diagnosis as fewer repeats, its evidence bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse import file_state, line_recipes, scan
from ddpslurm.analyze.parse.line_recipes import line_key
from ddpslurm.analyze.rules.loading import load_signatures

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB"
WATCHDOG = ("[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600023 "
            "milliseconds before timing out.")


def _retry_loop(n: int) -> str:
    return "".join(f"[rank3]: {OOM}\n[rank3]: step {i} loss 1.{i % 97} retrying with a smaller batch\n"
                   for i in range(n))


def _dated(n: int) -> str:
    return "".join(f"2026-11-02 10:{i // 60 % 60:02d}:{i % 60:02d},{i % 1000:03d} [rank3]: {OOM}\n" for i in range(n))


def _merged(n: int) -> str:
    return "".join(f"{i % 4}: [rank{i % 4}]: " + (OOM if i % 4 == 3 else WATCHDOG.format(r=i % 4)) + "\n"
                   for i in range(n))


def _scan(path: Path, sigs, rank: int | None = None) -> tuple:
    source = SourceFile(path=str(path), display=path.name, size=path.stat().st_size, rank=rank,
                        task_file=rank is not None)
    events, summary = scan.scan_file(source, sigs, 2026)
    return events, (summary.lines, summary.ranks_seen, summary.torchrun, summary.last_line, summary.tail)


@pytest.mark.parametrize("make", [_retry_loop, _dated, _merged])
@pytest.mark.parametrize("rank", [None, 3])
def test_repeats_are_replayed_and_read_as_if_read_in_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          make, rank: int | None) -> None:
    log = tmp_path / "slurm-7.out"
    log.write_text(make(300))
    replays = 0
    replay = file_state.FileState.replay

    def counting(state, recipe, text: str, lineno: int) -> bool:
        nonlocal replays
        done = replay(state, recipe, text, lineno)
        replays += done
        return done

    monkeypatch.setattr(file_state.FileState, "replay", counting)
    with_recipes = _scan(log, load_signatures(), rank)
    assert replays >= 250
    monkeypatch.setattr(line_recipes, "MAX_RECIPES", 0)
    monkeypatch.setattr(line_recipes, "MAX_INERT", 0)
    assert with_recipes == _scan(log, load_signatures(), rank)


def test_a_dates_century_is_kept_in_its_lines_key() -> None:
    line = b"2026-11-02 10:00:07,123 [rank3]: boom 17"
    assert line_key(line) == line_key(b"2091-01-29 23:59:59,999 [rank8]: boom 42")
    assert line_key(line) != line_key(b"2126-11-02 10:00:07,123 [rank3]: boom 17")
    assert line_key(line) != line_key(b"1926-11-02 10:00:07,123 [rank3]: boom 17")
    assert line_key(b"[rank3]: boom 17") == line_key(b"[rank5]: boom 99") == b"[rank0]: boom 00"


def _answer(folder: Path, text: str) -> tuple:
    folder.mkdir()
    (folder / "slurm-7.out").write_text(text)
    d = analyze_paths([folder], workers=1)
    return (d.cause, d.first_failing_rank, d.first_failing_host), len(d.evidence)


@pytest.mark.parametrize("make", [_retry_loop, _dated, _merged])
def test_a_repeated_error_says_what_fewer_repeats_say_with_bounded_evidence(tmp_path: Path, make) -> None:
    few, few_evidence = _answer(tmp_path / "few", make(40))
    many, many_evidence = _answer(tmp_path / "many", make(3000))
    assert many == few
    assert many_evidence == few_evidence <= 10
