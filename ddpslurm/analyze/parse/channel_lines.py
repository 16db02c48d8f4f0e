"""NCCL's channel lines told once: a raw line (or a block and a line's offset in it) in, whether it repeats out.
NCCL INFO logs print one channel line per channel and peer: most of such a log's candidate lines. A channel line
says which NCCL rank the printing process is (the sender's on [send], the receiver's on [receive]); one with the
same head (the bytes before NCCL's words: host, pid, device) and rank as a line read before can only repeat that
line's rank-map fact, so it is skipped before it is decoded (`repeated_channel_line`), or before it is even cut out
of its block (`told_channel_line`).
"""

from __future__ import annotations

import re

from ddpslurm.analyze.read.blocks import MAX_LINE

#: NCCL's per-channel connection line with its direction (facts.toml `nccl-rank-map-channel`): the NCCL rank of the
#: printing process is the sender's on [send], the receiver's on [receive]
_CHANNEL_LINE = re.compile(rb" NCCL INFO Channel \d+(?:/\d+)? : (\d+)\[[0-9a-fA-F]+\] -> (\d+)\[[0-9a-fA-F]+\] "
                           rb"\[(send|receive)\] via")
#: distinct (line head, NCCL rank) pairs a file remembers to skip repeated channel lines: one per process and
#: communicator (a merged log of a 16k-rank job holds 16k; at 10,000 its channel lines past them were each read in
#: full, most of its start-up part's time); past this a line is read, not skipped, so nothing is lost
MAX_CHANNEL_KEYS = 1_000_000


def channel_key(head: bytes, m: re.Match[bytes]) -> tuple[bytes, bytes]:
    """What a channel line `_CHANNEL_LINE` matched tells: its head (the bytes before the match) and the printing
    process's NCCL rank (the sender's on [send], the receiver's on [receive])."""
    return head, m[1] if m[3] == b"send" else m[2]


def line_channel_key(block: bytes | bytearray, start: int, end: int) -> tuple[bytes, bytes] | None:
    """The key (`channel_key`) of the channel line in `block[start:end]`, None when it is none: the pure twin of
    `_bulk.channel_key`."""
    m = _CHANNEL_LINE.search(block, start, end)
    return None if m is None else channel_key(bytes(block[start:m.start()]), m)


def repeated_channel_line(raw: bytes, seen: set[tuple[bytes, bytes]]) -> bool:
    """A channel line with the same head and NCCL rank as one read before (`seen`, which a new one joins while it
    has room): it can only repeat that line's rank-map fact (deduplicated anyway), so it is skipped before any
    decoding. Asked only outside line mode (`FileState.line_mode`)."""
    if b"INFO Channel " not in raw:
        return False
    m = _CHANNEL_LINE.search(raw)
    if m is None:
        return False
    key = channel_key(raw[:m.start()], m)
    if key in seen:
        return True
    if len(seen) < MAX_CHANNEL_KEYS:
        seen.add(key)
    return False


#: what follows a channel line's head: `told_channel_line` finds it through the head last seen (a file's channel
#: lines come in runs of one head: 41 of a 16k-rank job's 50 candidate lines a rank)
_CHANNEL_WORDS = b" NCCL INFO Channel "
_CHANNEL_REST = re.compile(_CHANNEL_LINE.pattern[len(_CHANNEL_WORDS):])
#: (head, head + _CHANNEL_WORDS) of the last channel line `told_channel_line` read whose words start with no
#: earlier occurrence of them in the head (so that a search of the line finds them there first)
_last_channel_head: tuple[bytes, bytes] = (b"", _CHANNEL_WORDS)


def told_channel_line(block: bytes | bytearray, start: int, n: int, channels: set[tuple[bytes, bytes]]) -> bool:
    """Whether the line at `start` is a channel line `repeated_channel_line` would skip (one already
    read with its head and NCCL rank): asked on the block, before the line is cut out and handled (NCCL prints
    one per channel and peer, most of an INFO log's candidate lines). Overlong lines are left to `FileState.handle`.

    A line that starts with the head last seen and the channel words is read from after them (what a search of
    the line would find first there: the words do not occur earlier in that head); any other, searched whole."""
    global _last_channel_head
    end = block.find(b"\n", start, n)
    end = n if end < 0 else end
    if end - start > MAX_LINE:
        return False
    head, lead = _last_channel_head
    if block.startswith(lead, start, end):
        m = _CHANNEL_REST.match(block, start + len(lead), end)
        if m is not None:
            return channel_key(head, m) in channels
    m = _CHANNEL_LINE.search(block, start, end)
    if m is None:
        return False
    head = bytes(block[start:m.start()])
    lead = head + _CHANNEL_WORDS
    if lead.find(_CHANNEL_WORDS) == len(head):
        _last_channel_head = (head, lead)
    return channel_key(head, m) in channels
