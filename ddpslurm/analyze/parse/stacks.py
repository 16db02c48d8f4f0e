"""Stack dumps of a hung job (`attempt_N/rank_R.stacks.txt`, written by faulthandler) -> one Event per rank.

faulthandler's format (CPython 3.8-3.13): blocks `Thread 0x... (most recent call first):` or
`Current thread 0x... [name] (most recent call first):`, then `  File "PATH", line N in FUNC` lines, innermost
first. Plain text read line by line (capped), never executed or unpickled.

The rank's main thread is the block that runs the script (a frame of ddpslurm's `run_script`, or `<module>`
as the outermost frame); its innermost frame in communication code (`COMM_PATHS`) says which collective the
rank waits in; a rank with none is outside any collective. The stuck frame shown is the innermost frame outside
the interpreter's and the libraries' own files, else the innermost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePath

from ddpslurm.analyze.model import Event, SourceFile
from ddpslurm.jobfolder import STACKS_SUFFIX, rank_file_pattern
from ddpslurm.sanitize import escape_undecodable

MAX_LINES = 20_000
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+)(?: \[[^\]]*\])? "
                     r"\(most recent call first\):|^Stack \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]{1,1000})", line (?P<line>\d{1,9}) in (?P<func>[\w<>.$-]{1,200})')
_HEADER = re.compile(r"^# ddpslurm stack dump file: rank (?P<rank>\d{1,7}) host (?P<host>[\w.:-]{1,255}) "
                     r"pid (?P<pid>\d{1,8})")
_FILE_NAME = rank_file_pattern(STACKS_SUFFIX, 7)

#: (path fragment, what a rank with such a frame waits in): torch's communication entry points, and autograd's
#: backward, where DDP's reducer waits for its gradient all-reduce. Rules as data, by library file.
COMM_PATHS: tuple[tuple[str, str], ...] = (
    ("torch/distributed/distributed_c10d.py", ""),  # the function name is the collective (all_reduce, barrier)
    ("torch/distributed/", ""),
    ("torch/nn/parallel/distributed.py", "DDP"),
    ("torch/autograd/graph.py", "backward (DDP gradient all-reduce)"),
    ("torch/autograd/__init__.py", "backward (DDP gradient all-reduce)"),
)
#: Frames of the launcher itself, never the stuck frame.
LAUNCHER_PATHS = ("ddpslurm/launch/", "/runpy.py", "/threading.py")
#: Frames of installed libraries and the standard library: the stuck frame prefers the script's own.
LIBRARY_MARKS = ("site-packages/", "dist-packages/", "/lib/python3")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def where(self) -> str:
        return f"{PurePath(self.file).name}:{self.line}:{self.func}"


@dataclass
class Thread:
    current: bool
    frames: list[Frame] = field(default_factory=list)  # innermost first


def parse_dump(lines: list[str]) -> list[Thread]:
    """Every thread block of a faulthandler dump, in file order. Pure."""
    threads: list[Thread] = []
    for raw in lines:
        head = _THREAD.match(raw)
        if head:
            threads.append(Thread(current=bool(head.group("current")) or raw.startswith("Stack")))
            continue
        frame = _FRAME.match(raw)
        if frame and threads:
            threads[-1].frames.append(Frame(frame["file"], int(frame["line"]), frame["func"]))
    return threads


def main_thread(threads: list[Thread]) -> Thread | None:
    """The last dumped thread that runs the script, else the last `Current thread`, else None."""
    running = [t for t in threads if t.frames and (any(f.func == "run_script" and "ddpslurm" in f.file
                                                       for f in t.frames) or t.frames[-1].func == "<module>")]
    current = [t for t in threads if t.current and t.frames]
    return (running or current or [None])[-1]


def collective_of(thread: Thread) -> tuple[str, Frame] | None:
    """(what the thread waits in, that frame) for its innermost communication frame, None outside any."""
    for frame in thread.frames:
        path = frame.file.replace("\\", "/")
        for fragment, name in COMM_PATHS:
            if fragment in path:
                return (name or frame.func), frame
    return None


def stuck_frame(thread: Thread) -> Frame | None:
    """The innermost frame of the script's own code, else the innermost that is not the launcher's."""
    own = [f for f in thread.frames if not any(m in f.file for m in LIBRARY_MARKS + LAUNCHER_PATHS)]
    others = [f for f in thread.frames if not any(m in f.file for m in LAUNCHER_PATHS)]
    return (own or others or [None])[0]


def stack_events(source: SourceFile) -> list[Event]:
    """The `stack` event of one rank's dump file: where its main thread was, and in which collective."""
    lines, header = _read(source.path)
    rank = int(header["rank"]) if header else source.rank
    if rank is None:
        match = _FILE_NAME.fullmatch(PurePath(source.path).name)
        rank = int(match["rank"]) if match else None
    thread = main_thread(parse_dump(lines))
    if rank is None or thread is None:
        return []
    waits = collective_of(thread)
    frame = stuck_frame(thread)
    where = frame.where() if frame else "?"
    text = (f"rank {rank}'s main thread waits in {waits[0]} ({where})" if waits
            else f"rank {rank}'s main thread is outside any collective, at {where}")
    fields = [("stuck_frame", where), ("in_collective", "yes" if waits else "no")]
    if waits:
        fields.append(("collective", waits[0]))
    return [Event(file=source.display, line=1, kind="stack", text=escape_undecodable(text), rank=rank,
                  host=header["host"] if header else source.host, pid=int(header["pid"]) if header else None,
                  fields=tuple(fields))]


def _read(path: str) -> tuple[list[str], re.Match[str] | None]:
    lines: list[str] = []
    header = None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, raw in enumerate(handle):
                if number >= MAX_LINES:
                    break
                if header is None and raw.startswith("# ddpslurm"):
                    header = _HEADER.match(raw)
                lines.append(raw[:2000])
    except OSError:
        return [], None
    return lines, header
