"""Who a line speaks for: a line's prefix (`Prefix`) in, the rank, local rank and host of its stream out.
The root of a file's reading state (`FileState`): the file, its signature set and year, its summary, and the
streams its lines come in. A stream is the (rank, local rank, host) a line's own prefixes name (`UNPREFIXED` for
none); it speaks for those, else for its file's rank; srun's and slurmstepd's lines speak for the job. The state
counts the lines read, in all and per stream, remembers each stream's rank and srun label (the label `_emit` reads),
and gives a line without a prefix that continues torch's NCCL error message the stream of the line above it. Here
too are the tests of what a line's text says about its writer: srun or slurmstepd, a mention of torchrun.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ddpslurm.analyze.model import MAX_RANK_LIST, FileSummary, SourceFile
from ddpslurm.analyze.parse.attribution import Prefix
from ddpslurm.analyze.rules.signatures import SignatureSet

#: the stream of a line without a prefix of its own
UNPREFIXED = (None, None, None)
#: the lines torch's NCCL error message continues on after its first (ProcessGroupNCCL: "NCCL error ..., NCCL version
#: V" + getNcclErrorDetailStr: "\nncclRemoteError: <what it means>" + "\nLast error:\n<NCCL's reason>"); a log line
#: prefix (`[rankR]:`) is put on the message's first line only
_CONTINUATION = re.compile(r"nccl[A-Z]\w*Error: |Last error:\s*$")


def continues(body: str) -> bool:
    """Whether a line is one torch's NCCL error message continues on (its reason: `ContinuedLines._continued`)."""
    return _CONTINUATION.match(body) is not None


SLURM_HEAD = re.compile(r"^(?:srun|slurmstepd|slurmd|sbatch)(?:-[\w.-]+)?: ")


def body_is_slurm(text: str) -> bool:
    """Lines written by srun/slurmstepd into a task's output file."""
    return bool(SLURM_HEAD.match(text))


TORCHRUN = re.compile(r"torchrun|torch\.distributed\.run|elastic/agent")


def mentions_torchrun(body: str) -> bool:
    """Whether a line mentions torchrun or its agent (`TORCHRUN`), its words looked for first: the search tries
    the three alternatives at every position of every line read in full, a substring test is much cheaper."""
    return ("torch" in body or "elastic/agent" in body) and TORCHRUN.search(body) is not None


@dataclass
class LineStreams:
    """A file being read, and who its lines speak for: the first layer of `FileState`."""

    source: SourceFile
    sigs: SignatureSet
    year: int | None
    summary: FileSummary | None = None
    #: per stream: the rank, local rank and host its lines speak for, and its label_rank and prefix_rank
    streams: dict[object, tuple[int | None, int | None, str | None, int | None, int | None]] = \
        field(default_factory=dict)
    label_rank: int | None = None
    prefix_rank: int | None = None
    #: names this file's lines carried only in a tag shaped like a host (`node02: `, but also `GPU3: `): an event
    #: of one says so (`host_tag`), and it stays a host only where a place that carries host names says it too
    tag_hosts: set[str] = field(default_factory=set)
    #: names this file's lines carried in a place that carries host names (NCCL's head, the line's own words)
    carried_hosts: set[str] = field(default_factory=set)
    #: lines read so far (handled or replayed), in all and per stream, and the stream of the line at hand
    handled: int = 0
    stream_lines: dict[object, int] = field(default_factory=dict)
    stream_now: object = None
    #: the number and stream of the last line read (handled or replayed): what an unprefixed continuation continues
    previous: tuple[int, object] = (-1, UNPREFIXED)

    def _take_prefix(self, p: Prefix, slurm: bool, lineno: int) -> tuple[int | None, int | None, str | None, tuple]:
        """The rank, local rank and host a line speaks for (its prefixes, else its file's), and its stream; notes
        the rank it names and which kind of prefix named it (`_emit` reads them). A line without a prefix that
        continues torch's NCCL error message on the line above speaks for that line's stream (`continues`)."""
        if p.rank is None and p.host is None and self.previous[0] == lineno - 1 and self.previous[1] != UNPREFIXED \
                and continues(p.text):
            stream = self.previous[1]
            rank, local, host, self.label_rank, self.prefix_rank = self.streams[stream]
            self.previous = (lineno, stream)
            self.handled += 1
            self.stream_lines[stream] += 1
            self.stream_now = stream
            return rank, local, host, stream
        src = self.source
        rank = p.rank if p.rank is not None else src.rank
        local = p.local_rank if p.local_rank is not None else src.local_rank
        host = p.host or src.host
        if p.host_tag and p.host is not None and p.host != src.host:
            self.tag_hosts.add(p.host)
        elif host is not None:
            self.carried_hosts.add(host)  # a path component, a Ray head's address, a collector's container
        if p.rank is not None and self.summary is not None and len(self.summary.ranks_seen) < MAX_RANK_LIST and \
                (p.rank != src.rank or src.kind != "log"):  # resolve counts a log file's own rank present anyway
            self.summary.ranks_seen.add(p.rank)
        if slurm:
            rank, local, host = p.rank, p.local_rank, p.host  # srun/slurmstepd speak for the job, not this file's rank
        self.label_rank = p.rank if p.rank_from_label else None
        self.prefix_rank = None if p.rank_from_label else p.rank
        stream = (p.rank, p.local_rank, p.host)
        self.streams[stream] = (rank, local, host, self.label_rank, self.prefix_rank)
        self.handled += 1
        self.stream_lines[stream] = self.stream_lines.get(stream, 0) + 1
        self.stream_now = stream
        self.previous = (lineno, stream)
        return rank, local, host, stream

    @contextlib.contextmanager
    def _speaking_for(self, stream: object) -> Iterator[tuple[int | None, int | None, str | None]]:
        """The rank, local rank and host `stream`'s lines speak for, with its srun label the one `_emit` reads
        meanwhile: for an event of another stream than the line at hand's (a traceback another stream's lines left
        idle or the file's end closed, a wrapped head joined)."""
        line_labels = self.label_rank, self.prefix_rank
        rank, local, host, self.label_rank, self.prefix_rank = self.streams.get(
            stream, (self.source.rank, self.source.local_rank, self.source.host, None, None))
        try:
            yield rank, local, host
        finally:
            self.label_rank, self.prefix_rank = line_labels
