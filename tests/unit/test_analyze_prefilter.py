"""The prefilter finds exactly the lines holding an anchor, with the automaton and with the pure-Python fallback."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.read import prefilter
from ddpslurm.analyze.read.prefilter import AnchorFinder, AutomatonFinder, anchor_finder
from ddpslurm.analyze.rules.literals import LiteralsIn
from ddpslurm.analyze.rules.loading import load_signatures

FINDER_CLASSES = [AnchorFinder]
if prefilter.AUTOMATON_AVAILABLE:
    FINDER_CLASSES.append(AutomatonFinder)


def brute_force(block: bytes, anchors: list[bytes]) -> list[int]:
    out, pos = [], 0
    for line in block.splitlines(keepends=True):
        if any(a in line for a in anchors):
            out.append(pos)
        pos += len(line)
    return out


ALPHABET = b"ab \nEr"
words = st.binary(min_size=1, max_size=4).map(lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b))


@pytest.mark.parametrize("finder", FINDER_CLASSES, ids=lambda f: f.__name__)
@settings(max_examples=200, deadline=None)
@given(text=st.lists(words, max_size=60), anchors=st.lists(words.filter(lambda w: b"\n" not in w), min_size=1,
                                                           max_size=5))
def test_finders_report_exactly_the_anchor_lines(finder, text: list[bytes], anchors: list[bytes]) -> None:
    block = b"".join(text) + b"\n"
    assert finder(anchors).starts(block) == brute_force(block, anchors)


@pytest.mark.parametrize("finder", FINDER_CLASSES, ids=lambda f: f.__name__)
@settings(max_examples=200, deadline=None)
@given(text=st.lists(words, max_size=40), stale=st.lists(words, max_size=20),
       anchors=st.lists(words.filter(lambda w: b"\n" not in w), min_size=1, max_size=5))
def test_finders_read_a_reused_buffer_only_up_to_its_end(finder, text: list[bytes], stale: list[bytes],
                                                         anchors: list[bytes]) -> None:
    """The scanner's buffer holds a block's lines, then what an earlier read left: only the lines are searched."""
    block = b"".join(text) + b"\n"
    buffer = bytearray(block + b"".join(stale))
    assert finder(anchors).starts(buffer, len(block)) == brute_force(block, anchors)


@pytest.mark.parametrize("finder", FINDER_CLASSES, ids=lambda f: f.__name__)
def test_finders_agree_on_log_lines_with_the_shipped_anchors(finder) -> None:
    anchors = list(load_signatures().anchors)
    block = (b"node1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/IPC\n"
             b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Error Error\n"
             b"2025-03-14 06:05:00,000 INFO train [rank 3]: step 1 | loss 2.9\n"
             b"[E612 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout\n"
             b"srun: error: gpu-0001: task 3: Exited with exit code 1\n") * 3
    assert finder(anchors).starts(block) == brute_force(block, anchors)
    assert len(finder(anchors).starts(block)) == 9


def test_the_pure_finder_is_used_without_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefilter, "AUTOMATON_AVAILABLE", False)
    monkeypatch.setattr(prefilter, "FINDERS", {})
    assert isinstance(anchor_finder([b"rror"]), AnchorFinder)
    assert anchor_finder([b"rror"]).starts(b"x\nan Error\n") == [2]


def test_an_anchor_spanning_lines_falls_back_to_the_pure_finder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefilter, "FINDERS", {})
    finder = anchor_finder([b"rror", b"end\nstart"])
    assert isinstance(finder, AnchorFinder)
    assert finder.starts(b"x\nthe end\nstart\n") == [2]


TEXT_ALPHABET = "ab Er\u00e9"
text_words = st.text(alphabet=TEXT_ALPHABET, min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(line=st.text(alphabet=TEXT_ALPHABET, max_size=60), literals=st.lists(text_words, min_size=1, max_size=6))
def test_literals_in_finds_the_literals_a_line_holds_nested_ones_too(line: str, literals: list[str]) -> None:
    want = {lit for lit in literals if lit in line}
    assert LiteralsIn(literals, pure=True)(line) == want
    if prefilter.AUTOMATON_AVAILABLE:
        assert LiteralsIn(literals)(line) == want


def test_literals_in_survives_pickling_for_a_spawned_worker() -> None:
    import pickle

    found = pickle.loads(pickle.dumps(LiteralsIn(["rror", "Error", "imeout"])))
    assert found("RuntimeError: Timeout") == {"rror", "Error", "imeout"}
    assert found("no match here") == set()
    sigs = load_signatures()
    sigs.match("RuntimeError: boom")  # builds the index and its automaton
    again = pickle.loads(pickle.dumps(sigs))
    assert again.match("RuntimeError: boom")[0].id == "python-exception"


@pytest.mark.skipif(not prefilter.AUTOMATON_AVAILABLE, reason="the automaton's order is tuned only with the wheel")
@settings(max_examples=200, deadline=None)
@given(text=st.lists(words, max_size=60), anchors=st.lists(words.filter(lambda w: b"\n" not in w), min_size=1,
                                                           max_size=6), seed=st.integers(0, 1000))
def test_every_anchor_order_finds_the_same_lines(text: list[bytes], anchors: list[bytes], seed: int) -> None:
    """`tune` may build the automaton with any order of the anchors: the lines found do not depend on it."""
    import random

    block = b"".join(text) + b"\n"
    shuffled = random.Random(seed).sample(anchors, len(anchors))
    assert AutomatonFinder(shuffled).starts(block) == AutomatonFinder(anchors).starts(block) == \
        brute_force(block, anchors)


def test_minimal_drops_the_anchors_that_hold_another_and_keeps_the_order() -> None:
    found = prefilter.minimal([b"Segmentation fault", b"rror", b"", b"egmentation", b"rror", b"Error", b"oom"])
    assert found == (b"rror", b"egmentation", b"oom")


@pytest.mark.skipif(not prefilter.AUTOMATON_AVAILABLE, reason="the automaton's order is tuned only with the wheel")
def test_tune_installs_the_order_that_scanned_the_sample_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefilter, "FINDERS", {})
    anchors = [b"rror", b"imeout", b"Killed", b"oom", b"Traceback", b"WARN"]
    timed: list[tuple[bytes, ...]] = []

    def seconds(finder: AutomatonFinder, sample: bytes) -> float:
        timed.append(finder.anchors)
        return 1.0 if len(timed) != 5 else 0.5  # the fifth order tried is the fastest

    best = prefilter.tune(anchors, b"an Error\nfine\n", seconds)
    assert len(timed) == prefilter.TUNE_ORDERS
    assert timed[0] == tuple(anchors)  # the given order is one of those tried
    assert all(sorted(order) == sorted(anchors) for order in timed)
    assert best.anchors == timed[4]
    assert anchor_finder(anchors) is best  # what the scan uses from now on in this process (and forked workers)
    assert prefilter.candidate_starts(b"fine\nan Error\nok\nOOM oom\n", anchors) == [5, 17]


def test_tune_leaves_the_pure_finder_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefilter, "AUTOMATON_AVAILABLE", False)
    monkeypatch.setattr(prefilter, "FINDERS", {})
    calls: list[int] = []
    finder = prefilter.tune([b"rror"], b"an Error\n", lambda f, s: calls.append(1) or 0.0)
    assert isinstance(finder, AnchorFinder) and not calls
    assert finder.starts(b"x\nan Error\n") == [2]


@pytest.mark.skipif(not prefilter.AUTOMATON_AVAILABLE, reason="automata only with the wheel")
@settings(max_examples=200, deadline=None)
@given(text=st.lists(words, max_size=60), anchors=st.lists(words.filter(lambda w: b"\n" not in w), min_size=1,
                                                           max_size=7), per_automaton=st.integers(1, 3))
def test_anchors_split_among_automata_find_the_same_lines(text: list[bytes], anchors: list[bytes],
                                                          per_automaton: int) -> None:
    """Past TEDDY_PATTERNS anchors the finder runs several automata and merges their matches: the lines found are
    still each anchor line once, in order (here with automata of 1-3 anchors, so that small sets split)."""
    block = b"".join(text) + b"\n"
    finder = AutomatonFinder(anchors, per_automaton)
    assert len(finder.automata) == max(1, -(-len(finder.anchors) // per_automaton))
    assert finder.starts(block) == brute_force(block, anchors)


@given(anchors=st.lists(st.binary(min_size=1, max_size=3), max_size=200), most=st.integers(1, 70))
def test_split_anchors_keeps_the_order_in_as_few_even_groups_as_fit(anchors: list[bytes], most: int) -> None:
    groups = prefilter.split_anchors(anchors, most)
    assert [a for g in groups for a in g] == anchors
    assert len(groups) == max(1, -(-len(anchors) // most))
    assert all(len(g) <= most for g in groups)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1


@pytest.mark.skipif(not prefilter.AUTOMATON_AVAILABLE, reason="automata only with the wheel")
def test_no_automaton_of_the_shipped_anchors_outgrows_the_simd_prefilter() -> None:
    """One automaton of more than 64 anchors walks every byte (the aho-corasick crate turns Teddy off): 2.6 instead
    of 0.8-1.0 ns a byte for the 72 shipped in 2026-11 (benchmarks/prefilter_engines.py)."""
    finder = AutomatonFinder(load_signatures().anchors)
    sizes = [len(g) for g in prefilter.split_anchors(finder.anchors)]
    assert len(finder.automata) == len(sizes) and max(sizes) <= prefilter.TEDDY_PATTERNS == 64
    assert sum(sizes) == len(finder.anchors)
