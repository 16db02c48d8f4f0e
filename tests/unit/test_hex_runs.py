"""Run-blind patterns (rules/hex_runs.py): what the check says of a pattern holds on lines that differ in their hex
runs and digits only, for drawn patterns and lines, for the shipped signatures on the corpus's lines with hex ids
put in, and for the prefix rules a line recipe stands in for."""

from __future__ import annotations

import random

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.parse.attribution import ANY_RULE, EMBEDDED_RANK, RULES, prefix_spans
from ddpslurm.analyze.parse.line_recipes import line_key, recipe_patterns_blind
from ddpslurm.analyze.rules.digit_shape import BOUNDARY, HEX_RUN, digit_blind, has_run, line_shape, shape
from ddpslurm.analyze.rules.hex_runs import literal_run_blind, prefixes_run_blind, run_blind
from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.analyze.rules.signatures import ENGINE_KINDS
from tests.unit.test_analyze_digit_shape import corpus_lines


@pytest.mark.parametrize(("pattern", "blind"), [
    (r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<n>\d+)", True),
    (r"comm (?P<comm>\S+) rank", True),
    (r"Watchdog caught collective operation timeout", True),  # `c` of `caught`: `a` follows it, then `u`
    (r"0x[0-9]+ rank", False),  # digits but not letters, where a run may be
    (r"\d+ rank", False),  # a search may start inside a run
    (r"[a-z]+ peer", False),
    (r"dead", False),  # hex letters only: they may sit inside a run
    (r"\bdead\b", False),
    (r"(?P<a>\w+) again (?P=a)", False),  # a back-reference
    (r"Rank (?P<rank>\d+)\b", True),
    (r"^\d+: ", True),  # at the line's start no run can be
    (r"\p{Lu}rror", False),  # regex-only syntax: unsure
])
def test_run_blind(pattern: str, blind: bool) -> None:
    assert run_blind(pattern) is blind


@pytest.mark.parametrize(("literal", "blind"), [
    ("comm", True), ("rank", True), ("Init ", True), ("exceeded", True), ("ECC", True),  # upper case: no run holds it
    ("dead", False), (" beef", True), ("beef ", False), ("0xab", False), ("cafe ", False), ("xcafe", False),
    ("axcafe", True),  # an x after a, not after the 0 of a run's 0x
])
def test_literal_run_blind(literal: str, blind: bool) -> None:
    assert literal_run_blind(literal) is blind


def test_the_patterns_a_recipe_stands_in_for_are_run_blind() -> None:
    """Else no line with a hex run would get a recipe: what the scan's speed on NCCL INFO logs depends on."""
    assert recipe_patterns_blind(True)
    assert prefixes_run_blind([rule.pattern for rule, _ in RULES] + [ANY_RULE.pattern], [EMBEDDED_RANK.pattern])
    assert not prefixes_run_blind([r"\w+ 0x"])  # a rule that may end inside a run
    assert prefixes_run_blind([r"\d+0x"])  # ... where this one cannot: a run's 0x follows a boundary


def sibling(line: str, rng: random.Random) -> str:
    """Another line of `line`'s `line_shape`: each hex run's digits and letters and every other digit drawn again
    (a digit right before an x kept, and a date's century)."""
    chars = list(line)
    runs = [m.span("run") for m in HEX_RUN.finditer(line)]
    in_run = {i for start, end in runs for i in range(start, end)}
    masked = shape(line)
    century = {at + k for at in range(len(line)) if masked.startswith("0000-00-00", at) for k in (0, 1)}
    for i, c in enumerate(line):
        if i in century:
            continue  # a date's century: the prefix rules read it (kept in the key)
        if i in in_run:
            chars[i] = rng.choice("0123456789abcdef")
        elif c in "0123456789" and line[i + 1:i + 2] not in ("x", "X"):
            chars[i] = rng.choice("0123456789")
    out = "".join(chars)
    assert line_shape(out) == line_shape(line)
    return out


def with_runs(line: str, rng: random.Random) -> str:
    """`line` with a hex id put after a few of its boundaries."""
    places = [i + 1 for i, c in enumerate(line) if c in BOUNDARY]
    for at in sorted(rng.sample(places, min(len(places), 2)), reverse=True):
        run = "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(1, 12)))
        line = f"{line[:at]}0x{run}{rng.choice(('', ' ', ',', ')'))}{line[at:]}"
    return line


def _found(pattern: regex.Pattern, text: str) -> tuple | None:
    m = pattern.search(text)
    return None if m is None else (m.span(), tuple(m.span(g) for g in range(1, (pattern.groups or 0) + 1)))


_PIECES = ("0x", "x", "0", " ", "=", "(", "rank", "comm ", "a", "dead", "g", "_", "B", r"\d", r"\w", r"\S", ".", r"\s",
           "[a-f]", "[0-9a-f]", "[A-Z]", "[^ ]", r"\b", "^")


@st.composite
def patterns(draw) -> str:
    """A small regex from pieces a run may meet: literals, classes, repeats, groups, alternatives, look-arounds."""
    def atom(depth: int) -> str:
        kind = draw(st.integers(0, 5 if depth < 2 else 1))
        if kind <= 1:
            return draw(st.sampled_from(_PIECES))
        inner = "".join(atom(depth + 1) for _ in range(draw(st.integers(1, 3))))
        if kind == 2:
            return f"(?:{inner}){draw(st.sampled_from(('*', '+', '?', '{2}', '*?')))}"
        if kind == 3:
            return f"({inner}|{atom(depth + 1)})"
        if kind == 4:
            return f"(?={inner})" if draw(st.booleans()) else f"(?!{inner})"
        return f"({inner})"
    return "".join(atom(0) for _ in range(draw(st.integers(1, 5))))


_LINE_ALPHABET = "0123456789abcdefxXgB _=(,.:"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns(), st.lists(st.text(_LINE_ALPHABET, min_size=1, max_size=24), min_size=1, max_size=8),
       st.integers(0, 2 ** 32))
def test_a_drawn_pattern_said_blind_matches_siblings_alike(pattern: str, lines: list[str], seed: int) -> None:
    """The soundness of the check on patterns it was not written for: where it says run- and digit-blind, every
    line and its drawn siblings (same `line_shape`) match at the same spans."""
    if not (run_blind(pattern) and digit_blind(pattern)):
        return
    compiled = regex.compile(pattern)
    rng = random.Random(seed)
    for line in lines:
        line = with_runs(line, rng)
        want = _found(compiled, line)
        for _ in range(4):
            assert _found(compiled, sibling(line, rng)) == want, (pattern, line)


def test_the_check_refuses_what_siblings_tell_apart() -> None:
    """The other way round, on patterns made to fail: each tells a line from a sibling, and the check says so."""
    rng = random.Random(7)
    for pattern in (r"0x[0-9]+ ", r"\d+ rank", r"[a-f]{3}", r"x[a-f]", r"(?:0x)?\d\d"):
        compiled = regex.compile(pattern)
        line = "comm 0xab12 rank 3 "
        told = any(_found(compiled, sibling(line, rng)) != _found(compiled, line) for _ in range(50))
        assert told and not run_blind(pattern), pattern


def test_shipped_signatures_said_blind_match_the_corpus_lines_with_hex_ids_alike() -> None:
    sigs = load_signatures()
    blind = [s for s in sigs.signatures
             if s.kind not in ENGINE_KINDS and run_blind(s.pattern_text) and digit_blind(s.pattern_text)]
    assert len(blind) > len(sigs.signatures) // 2
    rng = random.Random(11)
    lines = [with_runs(line, rng) for line in corpus_lines(1500)]
    lines = [line for line in lines if has_run(line)]
    assert len(lines) > 500
    checked = 0
    for line in lines:
        other = sibling(line, rng)
        for sig in blind:
            want = _found(sig.pattern, line)
            assert _found(sig.pattern, other) == want, (sig.id, line, other)
            checked += want is not None
    assert checked > 0


def test_prefix_spans_and_keys_agree_on_siblings() -> None:
    """What a recipe stands in for: lines of one key have their prefixes at the same spans."""
    rng = random.Random(13)
    lines = [with_runs(line, rng) for line in corpus_lines(1500, with_prefixes=True)]
    for line in lines:
        other = sibling(line, rng)
        if line.isascii() and len(line) < 400:
            assert line_key(other.encode()) == line_key(line.encode())
        assert prefix_spans(other) == prefix_spans(line), (line, other)
