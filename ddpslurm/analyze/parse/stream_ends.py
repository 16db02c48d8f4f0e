"""How each rank's stream ends in one log that `srun --label` merged: its line count and its last line's shape.

A per-rank log tells where its rank stopped by its last lines (timeline.stopped_early compares them with its peers';
of a stream tallied here only its last line is known). A merged log holds every rank's lines, `3: ` first: the scan
reads only the candidate lines of it, so the lines of each label are tallied here, at the regex engine's speed, for
merged logs up to MAX_BYTES.
"""

from __future__ import annotations

import operator
import re
from collections import Counter

from ddpslurm.analyze.parse.attribution import clean

#: srun --label's prefix: the task id, right-aligned, then `: ` (attribution's `label` prefix rule)
_LABEL = rb" *(\d{1,6}): "
#: a line srun --label wrote: its task id and its text
LABELLED = re.compile(rb"(?m)^" + _LABEL + rb"([^\n]+)")
#: merged logs are tallied up to this size (every line is read for it: a bigger one would hold a worker up)
MAX_BYTES = 32 << 20
#: a file is tallied when one of its first lines is labelled (an sbatch script may echo a few lines first)
HEAD_LINES = 8
#: a labelled line at one of the first HEAD_LINES line starts of a head: one match from the head's start (the lines
#: before it skipped whole, possessively), not one match a line
_LABELLED_HEAD = re.compile(rb"(?:[^\n]*+\n){0,%d}?" % (HEAD_LINES - 1) + _LABEL + rb"[^\n]")
_FIRST = operator.itemgetter(0)


def looks_labelled(head: bytes | bytearray) -> bool:
    """Whether one of the first HEAD_LINES lines of a file's head is a line that srun --label wrote (a per-rank
    log's are not: asked of every file, so only line starts are tried)."""
    return _LABELLED_HEAD.match(head) is not None


class StreamTally:
    """Lines per srun label and each label's last line, fed block by block (blocks of whole lines)."""

    def __init__(self) -> None:
        self.lines: Counter[bytes] = Counter()
        self.last: dict[bytes, bytes] = {}
        self.all_lines = 0

    def feed(self, block: bytes | bytearray, end: int) -> None:
        pairs = LABELLED.findall(block, 0, end)
        self.lines.update(map(_FIRST, pairs))
        self.last.update(pairs)
        self.all_lines += block.count(b"\n", 0, end)

    def ends(self, shape) -> dict[int, tuple[int, str | None]]:
        """Label -> (its lines, `shape` of its last line), when the file is a merged log: two labels or more, and
        labelled lines at least half of its lines. Else empty."""
        labelled = sum(self.lines.values())
        if len(self.lines) < 2 or labelled * 2 < self.all_lines:
            return {}
        return {int(label): (count, shape([clean(self.last[label].decode("utf-8", errors="replace"))]))
                for label, count in self.lines.items()}
