"""Lines read by recipe (MatchCaches.line_recipes, scan.py `note_recipe` / `replay`): a line of a shape whose reading
was remembered is read from spans, and that never changes what a file's scan finds, whatever the line's digits."""

from __future__ import annotations

import importlib.util
import random
import re
import sys
from pathlib import Path

import pytest

from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse import file_state, line_recipes, scan
from ddpslurm.analyze.parse.attribution import prefix_spans, strip_prefixes
from ddpslurm.analyze.rules.loading import load_signatures
from tests.unit.test_analyze_inert_lines import write_twins

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "analyzer" / "cases"
#: a sample of the corpus's logs (all of them take 40 s)
LOGS = random.Random(11).sample(sorted(p for p in CASES.rglob("*") if p.is_file() and p.stat().st_size < 256 << 10
                                       and p.suffix in (".out", ".err", ".log", ".txt")), 400)


def _scan(path: Path, sigs, rank: int | None = None) -> tuple:
    source = SourceFile(path=str(path), display=path.name, size=path.stat().st_size, rank=rank,
                        task_file=rank is not None)
    events, summary = scan.scan_file(source, sigs, 2024)
    return events, (summary.lines, summary.ranks_seen, summary.torchrun, summary.last_line, summary.tail,
                    summary.ends_with_newline)


class _Replays:
    """Counts the lines read by recipe."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        replay = file_state.FileState.replay

        def counting(state, recipe, text: str, lineno: int) -> bool:
            done = replay(state, recipe, text, lineno)
            self.count += done
            return done
        monkeypatch.setattr(file_state.FileState, "replay", counting)


def test_replaying_remembered_shapes_changes_no_scan_of_the_corpus(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    twins = write_twins(LOGS, tmp_path, random.Random(3))
    warmed = load_signatures()
    for twin in twins:  # the recipes are learned from the twins' lines, then meet the originals' own digits
        _scan(twin, warmed)
    assert len(warmed.caches.line_recipes) > 200
    assert any(r.signature is not None for r in warmed.caches.line_recipes.values())
    assert any(r.checks for r in warmed.caches.line_recipes.values())

    replays = _Replays(monkeypatch)
    with_recipes = [_scan(path, warmed) for path in LOGS]
    monkeypatch.setattr(line_recipes, "MAX_RECIPES", 0)
    without = [_scan(path, load_signatures()) for path in LOGS]
    assert replays.count > 500
    for path, got, want in zip(LOGS, with_recipes, without, strict=True):
        assert got == want, path


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_big_job", ROOT / "benchmarks" / "make_big_job.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_big_job"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("layout", "scenario"), [("submitit", "oom"), ("torchrun", "oom"), ("submitit", "desync")])
def test_a_large_job_scans_the_same_with_and_without_recipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             layout: str, scenario: str) -> None:
    """The benchmark's job (NCCL INFO inits, watchdog timeouts on every rank, a planted failure): its alike lines
    are what recipes are for (`desync`: torch's dump-signal lines, 600+ characters, on every rank)."""
    gen = _load_generator()
    folder = tmp_path / "job"
    monkeypatch.setattr(sys, "argv", ["make_big_job.py", "--ranks", "64", "--gb", "0.004", "--out", str(folder),
                                      "--layout", layout, "--culprit", "37", "--scenario", scenario])
    gen.main()
    logs = sorted(p for p in folder.iterdir() if p.name.endswith((".out", ".err")))
    replays = _Replays(monkeypatch)
    warmed = load_signatures()
    with_recipes = [_scan(path, warmed) for path in logs]
    assert replays.count > 2 * len(logs)
    monkeypatch.setattr(line_recipes, "MAX_RECIPES", 0)
    fresh = load_signatures()
    for path, got in zip(logs, with_recipes, strict=True):
        assert got == _scan(path, fresh), path


def _with_a_hex_sensitive_signature():
    """The shipped set and one signature whose regex reads a hex run's digits unlike its letters."""
    from ddpslurm.analyze.rules.signatures import Signature, build_set

    odd = Signature(id="test-hex-digits", cause="infiniband_error", role="culprit", pattern_text=r"comm 0x[0-9]+ peer",
                    prefilter=("peer",))
    return build_set([*load_signatures().signatures, odd])


def _without_rank_map_comm():
    from ddpslurm.analyze.rules.signatures import build_set

    return build_set([s for s in load_signatures().signatures if s.id != "nccl-rank-map-comm"])


@pytest.mark.parametrize(("twin", "line", "signatures"), [
    # a digit-sensitive signature among the candidates (`SystemExit: 143` is a SIGTERM, 144 is not)
    ("[rank3]: SystemExit: 144 (signal)", "[rank3]: SystemExit: 143 (signal)", load_signatures),
    # ... and the other way round: a line a digit-sensitive signature matched leaves no recipe
    ("[rank3]: SystemExit: 143 (signal)", "[rank3]: SystemExit: 144 (signal)", load_signatures),
    # a literal holding a digit may be in the line (`ignal 11`)
    ("[rank3]: got signal 12 in worker", "[rank3]: got signal 11 in worker", load_signatures),
    # NCCL's `0x` decides whether an `Init` line is one
    ("[rank3]: comm 5x7f3a rank 3 nranks 8 cudaDev 0 busId 1 - Init START",
     "[rank3]: comm 0x7f3a rank 3 nranks 8 cudaDev 0 busId 1 - Init START", _without_rank_map_comm),
    # a hex run's letters decide for a signature that is not run-blind (both lines: `comm 0x0000 peer 0`)
    ("[rank3]: comm 0xab12 peer 5 lost", "[rank3]: comm 0x1234 peer 5 lost",
     _with_a_hex_sensitive_signature),
    ("[rank3]: comm 0x1234 peer 5 lost", "[rank3]: comm 0xab12 peer 5 lost",
     _with_a_hex_sensitive_signature),
    # the same on a line longer than the shapes remembered as themselves (a digest of its shape is)
    ("[rank3]: SystemExit: 144 (signal) " + "padding " * 80, "[rank3]: SystemExit: 143 (signal) " + "padding " * 80,
     load_signatures),
    # the timestamp prefix's `19|20`
    ("2124-05-08 10:00:00 [rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
     "2024-05-08 10:00:00 [rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
     load_signatures),
])
def test_a_line_whose_digits_decide_is_read_in_full_after_its_twin(tmp_path: Path, twin: str, line: str,
                                                                   signatures) -> None:
    """Each guard of `note_recipe` and `replay`: after the twin (same shape, other digits) was read, the line
    itself is read as it is when nothing was remembered."""
    (tmp_path / "twin.log").write_text(f"{twin}\n")
    (tmp_path / "line.log").write_text(f"{line}\n")
    warmed = signatures()
    twin_read = _scan(tmp_path / "twin.log", warmed)
    fresh = _scan(tmp_path / "line.log", signatures())
    assert twin_read[0] != fresh[0] or twin_read[1][1] != fresh[1][1], "the twins must read differently"
    assert _scan(tmp_path / "line.log", warmed) == fresh


def test_replay_reads_ranks_times_and_fields_from_the_line_itself(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Two watchdog lines of one shape from two ranks: the second, read by recipe, has its own rank, sequence
    number, time, NCCL head and srun task."""
    head = "[rank{r}]:[E314 22:55:0{s}.007000007 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective " \
           "operation timeout: WorkNCCL(SeqNum={q}, OpType=ALLREDUCE, NumelIn=2, NumelOut=2, Timeout(ms)=600000) " \
           "ran for 600007 milliseconds before timing out."
    nccl = "gpu-000{r}:1234{r}:1235{r} [{r}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.{r}<0>"
    replays = _Replays(monkeypatch)
    sigs = load_signatures()
    first, second = tmp_path / "a.err", tmp_path / "b.err"
    first.write_text(head.format(r=3, s=1, q=801) + "\n" + nccl.format(r=3) + "\n")
    second.write_text(head.format(r=5, s=7, q=802) + "\n" + nccl.format(r=5) + "\n")
    _scan(first, sigs, rank=3)
    events, _summary = _scan(second, sigs, rank=5)
    assert replays.count == 2
    watchdog, interface = events
    assert (watchdog.rank, watchdog.get("seq"), watchdog.get("rank")) == (5, "802", "5")
    assert watchdog.time is not None and watchdog.time % 60 == pytest.approx(7.007, abs=1e-6)
    assert (interface.host, interface.pid, interface.get("ip"), interface.get("srun_task")) == \
        ("gpu-0005", 12345, "10.0.0.5", "5")
    monkeypatch.setattr(line_recipes, "MAX_RECIPES", 0)
    assert _scan(second, load_signatures(), rank=5)[0] == events


def test_prefix_spans_say_what_strip_prefixes_says() -> None:
    lines = ["node02: [rank3]: boom", "[default1]:[rank9]: x", "  4: [trainer-worker-1] y", "[1,3]<stdout>: z",
             "2024-05-08T08:47:31.1234567Z [rank2]: t", "(RayTrainWorker pid=77, ip=10.0.0.5) w", "job |x| [rank 4]: q",
             "0c41e7b2 || m", "plain line"]
    for line in lines:
        spans = prefix_spans(line)
        assert spans.prefix(line) == strip_prefixes(line), line
        shaped = re.sub(r"[1-9]", "0", line)
        if "0000-00-00" not in shaped:  # the timestamp's `19|20` is the one digit the rules read
            assert prefix_spans(shaped) == spans, line


def test_the_patterns_a_recipe_stands_in_for_are_digit_blind(monkeypatch: pytest.MonkeyPatch) -> None:
    """If one of them ever reads a digit, no recipe is made (and this test says which change did it)."""
    assert line_recipes.recipe_patterns_blind()
    line_recipes.recipe_patterns_blind.cache_clear()
    monkeypatch.setattr(line_recipes, "TORCHRUN", re.compile(r"torchrun2|elastic/agent"))
    try:
        assert not line_recipes.recipe_patterns_blind()
    finally:
        line_recipes.recipe_patterns_blind.cache_clear()


def test_long_shapes_are_remembered_under_a_digest() -> None:
    from ddpslurm.analyze.rules.signatures import UNTIMED_CHARS, memo_key

    short, long = "a0 " * 10, "b0 " * (UNTIMED_CHARS // 3 + 1)
    assert memo_key(short) == short and memo_key(short.encode()) == short.encode()
    key = memo_key(long)
    assert key == memo_key(long.encode()) and key[0] == "blake2b" and len(key[1]) == 16
    assert memo_key(long[:-1] + "c") != key
