"""Digit-blind signatures and the per-shape plans of SignatureSet.match: the plan never changes an answer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.parse.attribution import strip_prefixes
from ddpslurm.analyze.rules.digit_shape import digit_blind, has_run, line_shape, python_syntax, shape
from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.analyze.rules.signatures import SignatureSet

CASES = Path(__file__).resolve().parents[2] / "analyzer" / "cases"


@pytest.mark.parametrize(("pattern", "literals", "blind"), [
    (r"Rank (?P<rank>\d+) timed out after (?P<ms>\d+)ms", (), True),
    (r"\[(?P<rank>\w+)\] [^\]]+ \S+ \b.", (), True),
    (r"signal 11\b", (), False),  # a literal digit
    (r"(?:0x)?[0-9a-f]+ rank", (), True),  # a `0` right before an `x`: line_shape keeps it
    (r"0(x)", (), False),  # ... only a literal x right after it, in the same sequence (not in a group)
    (r"10x", (), False),  # the `1` is not before the x
    (r"comm 0x", ("0x",), True),
    (r"comm 0x", ("0x1",), False),
    (r"exit code [1-9]", (), False),  # a class holding some digits only
    (r"(?P<a>\w+) again (?P=a)", (), False),  # a back-reference
    (r"\p{Lu}rror", (), False),  # regex-only syntax: unsure
    (r"Watchdog caught", ("atchdog",), True),
    (r"Watchdog caught", ("errno 98",), False),  # a literal with a digit gates it
    (r"(?=.*timeout)(?!.*[^\d\s]x)ok", (), True),
    (r"(?>a|b\d)++", (), True),
    # `regex` lets alternatives name their groups alike; Python's parser does not, so the names are set aside
    (r"from (?P<peer>[\w.-]+)|to (?P<peer>[\w.-]+):\d+", (), True),
    (r"from (?P<peer>[\w.-]+)|to (?P<peer>[\w.-]+):1\d", (), False),
    (r"(?P<peer>\w+) (?P<peer>\w+) (?P=peer)", (), False),  # a back-reference by a twice-used name
])
def test_digit_blind(pattern: str, literals: tuple[str, ...], blind: bool) -> None:
    assert digit_blind(pattern, literals) is blind


def test_python_syntax_keeps_each_name_on_its_first_group_only() -> None:
    assert python_syntax(r"(?P<a>x)|(?P<b>y)|(?P<a>z)(?P=a)") == r"(?P<a>x)|(?P<b>y)|(z)(?P=a)"
    assert python_syntax(r"(?P<a>x)(?P<b>y)") == r"(?P<a>x)(?P<b>y)"


def test_line_shape_keeps_a_digit_before_x_and_masks_hex_runs() -> None:
    assert line_shape("comm 0x8d11738f7d9 rank 11 4x8") == "comm 0x00000000000 rank 00 4x0"
    assert line_shape("0xab12 (0xcd) k=0xef,0x3") == "0x0000 (0x00) k=0x00,0x0"
    # no run: an upper-case or word byte after it, no boundary before its 0x, nothing after the x
    assert line_shape("0xdeadBEEF a0xab [0xab] 0x12_3 0x") == "0xdeadBEEF a0xab [0xab] 0x00_0 0x"
    assert not has_run("a0xab 0x") and has_run("0x1") and has_run("=0xab!")


def test_shape_keeps_length_and_non_digits() -> None:
    assert shape("[Rank 12] seq 80001 at 22:55:01") == "[Rank 00] seq 00000 at 00:00:00"
    assert shape("٣ rank") == "٣ rank"  # only ASCII digits


def corpus_lines(limit: int = 4000, with_prefixes: bool = False) -> list[str]:
    """`limit` of the corpus's log lines, drawn at random (the same ones every run), without their prefixes unless
    asked; blank ones left out."""
    lines: list[str] = []
    for path in sorted(CASES.rglob("*")):
        if path.is_file() and path.suffix in (".out", ".err", ".log", ".txt", "") and path.stat().st_size < 2 << 20:
            for raw in path.read_text(errors="replace").splitlines():
                body = raw if with_prefixes else strip_prefixes(raw).text
                if body.strip():
                    lines.append(body)
    random.Random(3).shuffle(lines)
    return lines[:limit]


def _answer(sigs: SignatureSet, text: str) -> tuple | None:
    hit = sigs.match(text)
    return None if hit is None else (hit[0].id, hit[1].span(), hit[1].groupdict())


def _unplanned(sigs: SignatureSet, text: str) -> tuple | None:
    hit = sigs.match_all(text)
    return None if hit is None else (hit[0].id, hit[1].span(), hit[1].groupdict())


def _renumbered(text: str, rng: random.Random) -> str:
    """The same line with its digits redrawn: the same shape, so the second match takes the remembered plan."""
    return "".join(rng.choice("0123456789") if ch.isascii() and ch.isdigit() else ch for ch in text)


def test_planned_matches_equal_full_matches_on_the_corpus_lines_renumbered() -> None:
    planned = load_signatures()
    full = load_signatures()
    rng = random.Random(11)
    lines = corpus_lines()
    assert len(lines) > 1000
    for text in lines:
        for variant in (text, _renumbered(text, rng), _renumbered(text, rng)):
            assert _answer(planned, variant) == _unplanned(full, variant), variant
    assert planned.caches.plans, "lines of one shape must have taken the remembered plan"


DIGIT_SENSITIVE_LINES = [
    "Fatal Python error: Segmentation fault at signal 11",
    "Fatal Python error: Segmentation fault at signal 12",
    "srun: error: node-3: task 7: Killed",
    "errno: 98 - Address already in use",
    "errno: 99 - Address already in use",
    "SystemExit: 143",
    "SystemExit: 144",
    "comm 0x7f3a rank 3 nRanks 8",
    "comm 1x7f3a rank 3 nRanks 8",
    "mlx4_0: fw error on queue 3",  # nccl-ib-failure's `mlx5` alternative: a line of this shape may hold it
    "mlx5_0: fw error on queue 3",
    "hw: mlx9 reports a failure",
]


_PLANNED = load_signatures()
_FULL = load_signatures()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(DIGIT_SENSITIVE_LINES), st.randoms(use_true_random=False))
def test_digit_sensitive_signatures_are_matched_on_the_line_itself(text: str, rng: random.Random) -> None:
    planned, full = _PLANNED, _FULL
    for variant in (text, _renumbered(text, rng), _renumbered(text, rng), text):
        assert _answer(planned, variant) == _unplanned(full, variant), variant


def test_a_full_plan_memo_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memo that stopped learning once full would keep the first files' shapes only (a 65k-rank job's NCCL Trees
    lines, a shape each, then left its watchdog lines unplanned): full, it is emptied and learns the new shape."""
    from ddpslurm.analyze.rules import signatures

    monkeypatch.setattr(signatures, "MAX_PLANS", 3)
    sigs = load_signatures()
    lines = [f"NCCL WARN {'x' * n} lost peer" for n in range(1, 8)]
    for line in lines:
        sigs.match(line)
        assert shape(line) in sigs.caches.plans and len(sigs.caches.plans) <= 3
    memo: dict = {}
    signatures.remember(memo, "a", 1, 0)
    assert memo == {}


def test_a_plan_keeps_to_run_again_only_signatures_a_line_of_its_shape_can_hold_the_literals_of() -> None:
    """torch's watchdog lines hold none of the literals the IB, port-in-use and SIGBUS signatures need, not even
    with other digits: a plan does not run those again on each such line; a line whose shape may hold one
    (`mlx4` for `mlx5`) keeps that signature."""
    sigs = load_signatures()
    watchdog = ("[PG 0 (default_pg) Rank 14] Exception (either an error or timeout) detected by watchdog at work: "
                "80001, last enqueued NCCL work: 80001, last completed NCCL work: 80000.")
    sigs.match(watchdog)
    assert sigs.replay_checks(watchdog) == ()
    mlx = "mlx4_0: fw error on queue 3"
    sigs.match(mlx)
    assert "nccl-ib-failure" in [sigs.signatures[i].id for i in sigs.replay_checks(mlx) or ()]
