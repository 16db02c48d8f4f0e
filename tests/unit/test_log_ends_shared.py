"""Logs that end alike are read once (`timeline.stopped_early` over each distinct ending, `_mark_log_ends` decoding
each packed ending once): the ranks found to have stopped early are those a reading rank by rank finds.

A job's ranks mostly end their logs alike (one program, one order), a few differently; the endings are drawn from a
small pool of line shapes so that endings repeat, and each is given to the ranks twice over: as one object shared
by every rank that ends so, and as a copy of its own for every rank (then no two ranks share an object, and each is
read on its own).
"""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.diagnose.timeline import RankTimeline, _mark_log_ends, stopped_early
from ddpslurm.analyze.model import FileSummary, SourceFile

_SHAPES = st.sampled_from(["build", "ready", "step", "warn", "ckpt", "exit"])
_ENDING = st.lists(_SHAPES, min_size=1, max_size=6).map(tuple)


@st.composite
def _job(draw: st.DrawFn) -> tuple[dict[int, int], list[tuple[str, ...]], dict[int, int], set[int], set[int]]:
    """(rank -> index of its ending in the pool, the pool, line counts, ranks seen whole, ranks seen by last line)."""
    pool = draw(st.lists(_ENDING, min_size=1, max_size=4))
    ranks = draw(st.integers(min_value=3, max_value=24))
    which = {r: draw(st.integers(min_value=0, max_value=len(pool) - 1)) for r in range(ranks)}
    counts = {r: draw(st.integers(min_value=1, max_value=300)) for r in range(ranks)}
    whole = set(draw(st.sets(st.sampled_from(range(ranks)))))
    last_only = set(draw(st.sets(st.sampled_from(range(ranks)))))
    return which, pool, counts, whole, last_only


@settings(max_examples=400, deadline=None)
@given(_job())
def test_ranks_sharing_one_ending_are_judged_as_each_rank_alone(job: tuple) -> None:
    which, pool, counts, whole, last_only = job
    shared = {r: pool[i] for r, i in which.items()}
    own = {r: list(pool[i]) for r, i in which.items()}  # a new object per rank
    assert len({id(t) for t in own.values()}) == len(own)
    assert stopped_early(shared, counts, whole, last_only) == stopped_early(own, counts, whole, last_only)


def test_logs_that_end_alike_hold_one_decoded_ending() -> None:
    """Ranks whose summaries pack equal endings share one decoded array; another ending is another array."""
    alike = array("I", [11, 22, 33]).tobytes()
    other = array("I", [11, 44]).tobytes()
    sources = [SourceFile(path=f"r{r}.log", display=f"r{r}.log", rank=r) for r in range(4)]
    summaries = [FileSummary(file=f"r{r}.log", lines=100, end_marks=other if r == 3 else alike) for r in range(4)]
    seen: dict[int, object] = {}

    import ddpslurm.analyze.diagnose.timeline as timeline

    real = timeline.stopped_early

    def spy(tails, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(tails)
        return real(tails, *args, **kwargs)

    timeline.stopped_early = spy
    try:
        ranks: dict[int, RankTimeline] = {}
        _mark_log_ends(ranks, sources, summaries)
    finally:
        timeline.stopped_early = real
    assert seen[0] is seen[1] is seen[2]
    assert seen[3] is not seen[0]
    assert list(seen[0]) == [11, 22, 33] and list(seen[3]) == [11, 44]
    assert {r for r, tl in ranks.items() if tl.log_lines == 100} == {0, 1, 2, 3}
