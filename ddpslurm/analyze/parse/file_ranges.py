"""One file in byte ranges: a path in, cut points at line starts out; the ranges' results in, the file's out.
A big file is cut at line starts so that several workers share it (`split_points`); each range is scanned on its own
(reading past its end to finish a traceback or block open there, or a logged exception's watch), and the ranges' events
and summaries are merged back into the whole file's (`merge_parts`): line numbers shifted, the lines a range read past
its end taken from that range, which read them in context, and the facts they repeat told once.
"""

from __future__ import annotations

from ddpslurm.analyze.model import Event, FileSummary, moved_by
from ddpslurm.analyze.parse.repeated_facts import told_once
from ddpslurm.analyze.read.blocks import MAX_LINE


def split_points(path: str, size: int, parts: int) -> list[int]:
    """Byte offsets cutting a file into `parts` ranges at line starts: [0, b1, ..., size]."""
    cuts = [0]
    with open(path, "rb") as handle:
        for i in range(1, parts):
            target = size * i // parts
            handle.seek(target)
            nl = handle.read(MAX_LINE).find(b"\n")
            cut = target + nl + 1 if nl >= 0 else target
            if cuts[-1] < cut < size:
                cuts.append(cut)
    return [*cuts, size]


def merge_parts(parts: list[tuple[list[Event], FileSummary]]) -> tuple[list[Event], FileSummary]:
    """One file's ranges back together: line numbers shifted, and the lines a range read past its end (to finish a
    traceback or block open there, or a logged exception's watch) taken from that range, which read them in context,
    not from the next one, which read them from the middle of that block (a failure block's entries read as lines of
    their own, a retry notice without the exception it tells of)."""
    if len(parts) == 1:
        return parts[0]
    events: list[Event] = []
    seen: set[tuple[int, str]] = set()
    merged = FileSummary(file=parts[0][1].file)
    offset = covered = 0  # covered: the last line (of the whole file) an earlier range has read
    for part_events, summary in parts:
        for e in part_events:
            e = moved_by(e, offset) if offset else e
            if e.line > covered and (e.line, e.kind) not in seen:
                seen.add((e.line, e.kind))
                events.append(e)
        covered = max(covered, offset + summary.lines + summary.read_past_end)
        offset += summary.lines
        merged.bytes += summary.bytes
        merged.truncated_lines += summary.truncated_lines
        merged.match_timeouts += summary.match_timeouts
        merged.ranks_seen |= summary.ranks_seen
        merged.binary = merged.binary or summary.binary
        merged.streams_untallied = merged.streams_untallied or summary.streams_untallied
        merged.rescanned = merged.rescanned or summary.rescanned
        merged.torchrun = merged.torchrun or summary.torchrun
        merged.error = merged.error or summary.error
        merged.tail = summary.tail or merged.tail
        merged.last_line = summary.last_line or merged.last_line
        merged.end_marks = summary.end_marks or merged.end_marks
        merged.ends_with_newline = summary.ends_with_newline
    merged.lines = offset
    return told_once(events), merged
