"""One file's reading, line by line: a candidate line's raw bytes and number in, the file's events (and summary) out.
`FileState` is the per-file state of a scan, built in layers, each a class of its own module that the next one
extends: who a line speaks for (`LineStreams`), how a line becomes an event (`LineEvents`), the tracebacks and
torchelastic failure blocks open (`FailureBlocks`), the lines read with another line (`ContinuedLines`: wrapped
heads, torch's `Last error:`), and the line shapes remembered (`RememberedShapes`: inert lines, line recipes).
`handle` takes each line through them in order: skipped or replayed by its shape where that is known, else decoded,
its prefixes read, then the first reading that takes it (a block, a start-up line, a line waited for, a signature).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ddpslurm.analyze.model import FACT_KINDS
from ddpslurm.analyze.parse.attribution import Prefix, PrefixSpans, clean, prefix_spans
from ddpslurm.analyze.parse.channel_lines import repeated_channel_line
from ddpslurm.analyze.parse.continued_lines import LAST_ERROR
from ddpslurm.analyze.parse.line_recipes import RememberedShapes, line_key
from ddpslurm.analyze.parse.line_streams import body_is_slurm, mentions_torchrun
from ddpslurm.analyze.read.blocks import MAX_LINE
from ddpslurm.analyze.rules.signatures import PLANNED_CHARS, ROOT_CAUSE_HEADER


@functools.lru_cache(maxsize=1024)
def _prefixes(text: str) -> tuple[PrefixSpans, Prefix]:
    """Where the prefixes of a line's text are, and what they say (pure, both immutable): the lines read last are
    remembered, so that a line a log repeats (a traceback printed again and again, read in line mode, where no
    shape is remembered) is cut into its prefixes once."""
    spans = prefix_spans(text)
    return spans, spans.prefix(text)


@dataclass
class FileState(RememberedShapes):
    """A file's reading state: every layer's, and the channel lines read (`channel_lines`)."""

    #: (bytes before NCCL's "NCCL INFO Channel", the printer's NCCL rank) of the channel lines read so far
    channel_lines: set[tuple[bytes, bytes]] = field(default_factory=set)

    def handle(self, raw: bytes, lineno: int, shape: object = None) -> None:
        """Read one candidate line, `raw` (without its line end), line `lineno` of the file (or of its range);
        `shape`: its `line_key` where the bulk path found it already (None: found here)."""
        key = None
        if not self.line_mode:
            if len(raw) <= PLANNED_CHARS:
                key = line_key(raw) if shape is None else shape
                known = self.sigs.caches.inert_lines.get(key)
                if known is not None and self.still_inert(raw, *known):
                    return
            if b"INFO Channel " in raw and repeated_channel_line(raw, self.channel_lines):
                return
        elif not self.must_read_on and len(raw) <= PLANNED_CHARS:
            # only a logged exception watched: every line is read for a sign the process went on (`_went_on`),
            # which a line of a known shape gets replayed too (an exception logged again and again, a retry loop)
            key = line_key(raw)
        if key is not None:
            recipe = self.sigs.caches.line_recipes.get(key)
            if recipe is not None and self.replay(recipe, raw.decode("ascii"), lineno):
                return
        text = clean(raw[:MAX_LINE].decode("utf-8", errors="replace").rstrip("\n"))
        if not text:
            return
        spans, p = _prefixes(text)
        slurm = body_is_slurm(p.text)
        rank, local, host, stream = self._take_prefix(p, slurm, lineno)
        body = p.text
        torchrun = mentions_torchrun(body)
        if torchrun and self.summary is not None:
            self.summary.torchrun = True
        if (self.elastic or ROOT_CAUSE_HEADER in body) and self._elastic_line(body, lineno, stream, host):
            return
        consumed, finished = self.tracebacks.feed(stream, body, lineno)
        for ended, exc in finished:
            self._exception(exc, ended)  # a stream's own rank: another stream's traceback may end on this line
        if consumed:
            return
        if ("RESTART_COUNT" in body and self._attempt_start(body, lineno, host)) or \
                ("JobEnvironment(" in body and self._rank_info(body, lineno)) or \
                ("Init " in body and self._nccl_init_line(body, lineno, rank, host, local, p.time_text)):
            return
        if body.startswith("frame #"):
            return  # C++ stack frames of a c10 exception: the message came before them
        if self.waiting and self._reason_of(stream, body, lineno):
            return
        pending, self.pending = self.pending, None
        if pending is not None and self._follow(pending, body, stream, lineno):
            return
        if body.rstrip() == LAST_ERROR:
            self._await_reason(stream, lineno, body)
            return
        hit = self._match_line(body, lineno, p.time_text, rank, local, host, stream)
        if self.watching:
            self._went_on(stream, body, lineno, hit is not None and hit[0].kind not in FACT_KINDS)
        if key is None:
            return
        if hit is None:
            self.note_inert(key, raw, text, p, body)
        self.note_recipe(key, raw, text, spans, hit, slurm, torchrun)
