"""What a job's events take in the main process: as the analyzer holds them (objects), and as columns would.

    python benchmarks/event_memory.py [--folder .bench/scale/r16384_submitit_oom_c11000_gb0.5]

Analyzes the folder in this process and, when the scan is done (before the diagnosis), prints the events by kind,
their memory part by part (`sys.getsizeof`, each object once: the event objects, their texts, field tuples, pairs,
values and times; the summaries and the sources), the process's RSS then and at the end, and an estimate of the same
events in columns: per class (kind, signature, cause, role, priority, time family, field names) an array each for
file, line, rank, pid, local rank, host and time, a field's value as an int where it is a number and else the index
of a shared string, the distinct strings, and the texts raw and through zlib level 1. The estimate is not an
implementation: it shows what a columnar store would hold, not what reading it would cost. It wraps `api.diagnose`
for the run: a measuring tool, not a product path.
"""

from __future__ import annotations

import argparse
import array
import collections
import sys
import zlib
from collections.abc import Iterable
from pathlib import Path

from ddpslurm.analyze import api
from ddpslurm.analyze.model import Event

MB = 1 << 20


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident memory of this process in MB, from /proc (0 where it cannot be read)."""
    found = {"VmRSS:": 0.0, "VmHWM:": 0.0}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, rest = line.partition("\t") if "\t" in line else line.partition(" ")
                if key in found:
                    found[key] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return found["VmRSS:"], found["VmHWM:"]


class Sizes:
    """Bytes by part, each object counted once."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.parts: collections.Counter[str] = collections.Counter()

    def add(self, obj: object, part: str) -> None:
        if obj is None or id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        self.parts[part] += sys.getsizeof(obj)


def object_sizes(events: list[Event], summaries: Iterable, sources: Iterable) -> collections.Counter[str]:
    sizes = Sizes()
    for e in events:
        sizes.add(e, "event objects")
        sizes.add(e.text, "texts")
        sizes.add(e.fields, "field tuples")
        for pair in e.fields:
            sizes.add(pair, "field pairs")
            sizes.add(pair[1], "field values")
        sizes.add(e.time, "times")
    for s in summaries:
        for part in (s, s.ranks_seen, s.tail, s.last_line, s.streams):
            sizes.add(part, "summaries")
    for s in sources:
        for part in (s, s.path, s.display):
            sizes.add(part, "sources and names")
    return sizes.parts


def column_sizes(events: list[Event]) -> dict[str, float]:
    """The events as arrays per class: bytes of the arrays, of the distinct strings, of the texts raw and zlib-1."""
    strings: dict[str, int] = {}

    def index(text: str | None) -> int:
        return -1 if text is None else strings.setdefault(text, len(strings))

    classes: dict[tuple, list[array.array]] = {}
    for e in events:
        names = tuple(name for name, _value in e.fields)
        cols = classes.get((e.kind, e.signature, e.cause, e.role, e.priority, e.time_family, names))
        if cols is None:
            cols = [array.array(code) for code in "IIiqiId"] + [array.array("q") for _ in names]
            classes[(e.kind, e.signature, e.cause, e.role, e.priority, e.time_family, names)] = cols
        row = (index(e.file), e.line, -1 if e.rank is None else e.rank, -1 if e.pid is None else e.pid,
               -1 if e.local_rank is None else e.local_rank, index(e.host) + 1,
               float("nan") if e.time is None else e.time)
        for col, value in zip(cols[:7], row, strict=True):
            col.append(value)
        for col, (_name, value) in zip(cols[7:], e.fields, strict=True):
            col.append(int(value) if value.isascii() and value.isdigit() and len(value) < 18 else -2 - index(value))
    texts = "\n".join(e.text for e in events).encode("utf-8", "surrogatepass")
    return {"classes": len(classes),
            "arrays": sum(col.itemsize * len(col) for cols in classes.values() for col in cols) / MB,
            "distinct strings": sum(sys.getsizeof(s) for s in strings) / MB,
            "texts raw": len(texts) / MB, "texts zlib-1": len(zlib.compress(texts, 1)) / MB}


def report(events: list[Event], sources, summaries) -> None:
    now, peak = rss_mb()
    print(f"{len(events):,} events after the scan; RSS {now:.0f} MB (peak {peak:.0f})")
    kinds = collections.Counter(e.kind for e in events)
    print("by kind:", ", ".join(f"{kind} {count:,}" for kind, count in kinds.most_common()))
    parts = object_sizes(events, summaries, sources)
    print("as objects:", ", ".join(f"{part} {size / MB:.1f} MB" for part, size in parts.most_common()))
    event_parts = ("event objects", "texts", "field tuples", "field pairs", "field values", "times")
    total = sum(parts[p] for p in event_parts) / MB
    print(f"events as objects: {total:.1f} MB ({total * MB / max(len(events), 1):.0f} B an event)")
    cols = column_sizes(events)
    print(f"as columns: {cols['classes']} classes, arrays {cols['arrays']:.1f} MB, distinct strings "
          f"{cols['distinct strings']:.1f} MB, texts {cols['texts raw']:.1f} MB raw or {cols['texts zlib-1']:.1f} MB "
          "through zlib level 1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path(".bench/scale/r16384_submitit_oom_c11000_gb0.5"))
    args = parser.parse_args()
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder: make one with benchmarks/make_big_job.py or analyze_scale.py")
    diagnose = api.diagnose

    def measured(events, sources, summaries, sigs, facts):
        report(events, sources, summaries)
        return diagnose(events, sources, summaries, sigs, facts)

    api.diagnose = measured
    try:
        found = api.analyze_paths([str(args.folder)])
    finally:
        api.diagnose = diagnose
    now, peak = rss_mb()
    print(f"diagnosis: {found.cause}, rank {found.first_failing_rank}; RSS at the end {now:.0f} MB (peak {peak:.0f}; "
          "the counting above adds its own)")


if __name__ == "__main__":
    main()
