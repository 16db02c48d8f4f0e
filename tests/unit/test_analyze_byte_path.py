"""The scan's byte path: repeated NCCL channel lines skipped on the block as `handle` would skip them, and the
embedded-rank prefix looked for only where its literal is."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze import attribution, scan
from ddpslurm.analyze.events import SourceFile
from ddpslurm.analyze.signatures import load_signatures

SIGS = load_signatures()


#: NCCL heads of two processes, and the lines a channel-heavy INFO log mixes with its channel lines
HEADS = ("gpu-a07:31337:31400 [2] NCCL INFO ", "node-12:4242:4300 [0] NCCL INFO ")
OTHER = ("step 7 | loss 1.0", "gpu-a07:31337:31400 [2] NCCL INFO Connected all rings",
         "[rank5]:[E612 10:24:03.2 ProcessGroupNCCL.cpp:1] [Rank 5] Watchdog caught collective operation timeout: "
         "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600038 "
         "milliseconds before timing out.",
         "Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "ValueError: bad batch",
         "gpu-a07:31337:31400 [2] NCCL INFO comm 0x5a1 rank 5 nRanks 16 nNodes 2 localRanks 8 localRank 2 MNNVL 0")


def _channel(head: str, channel: int, me: int, peer: int, send: bool) -> str:
    pair = f"{me}[2] -> {peer}[0] [send]" if send else f"{peer}[0] -> {me}[2] [receive]"
    return f"{head}Channel {channel:02d}/0 : {pair} via NET/IB/0/GDRDMA"


channel_lines = st.builds(_channel, st.sampled_from(HEADS), st.integers(0, 31), st.sampled_from((5, 9)),
                          st.integers(0, 15), st.booleans())


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.one_of(channel_lines, channel_lines, st.sampled_from(OTHER)), min_size=1, max_size=80))
def test_channel_lines_skipped_on_the_block_give_what_handle_gives(tmp_path_factory, lines: list[str]) -> None:
    """Skipping a repeated channel line before it is cut out changes no event, no line number, no line count."""
    path = tmp_path_factory.mktemp("channels") / "job.log"
    path.write_text("\n".join(lines) + "\n")
    source = SourceFile(path=str(path), display="job.log", size=path.stat().st_size)
    key = lambda result: ([(e.line, e.kind, e.signature, e.pid, e.fields) for e in result[0]],  # noqa: E731
                          result[1].lines)
    fast = scan.scan_file(source, SIGS)
    real = scan._told_channel_line
    try:
        scan._told_channel_line = lambda *args: False  # every candidate line reaches `handle`
        slow = scan.scan_file(source, SIGS)
    finally:
        scan._told_channel_line = real
    assert key(fast) == key(slow)


def test_a_repeated_channel_line_is_skipped_on_the_block(tmp_path: Path, monkeypatch) -> None:
    lines = [_channel(HEADS[0], c, 5, 6, True) for c in range(10)]
    path = tmp_path / "job.log"
    path.write_text("\n".join(lines) + "\n")
    handled: list[int] = []
    real = scan._FileState.handle
    monkeypatch.setattr(scan._FileState, "handle", lambda self, raw, n: handled.append(n) or real(self, raw, n))
    events, summary = scan.scan_file(SourceFile(path=str(path), display="job.log", size=path.stat().st_size), SIGS)
    assert handled == [1] and summary.lines == 10
    assert [(e.line, e.get("nccl_rank")) for e in events] == [(1, "5")]


@settings(max_examples=300, deadline=None)
@given(before=st.text(st.sampled_from("ab [(]):|\t"), max_size=170), tag=st.sampled_from(("[rank", "[Rank", "[Rank ")),
       number=st.integers(0, 99999), after=st.sampled_from(("]: x", "]:", "] x", "]")))
def test_the_embedded_rank_is_looked_for_wherever_it_can_be(before: str, tag: str, number: int, after: str) -> None:
    text = f"{before}{tag}{number}{after}"
    found = attribution.EMBEDDED_RANK.search(text, 0, 160) is not None
    assert not found or attribution._may_embed_rank(text)
    assert attribution._may_embed_rank(text) == (tag[:5] in text[:160])

