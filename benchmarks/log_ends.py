"""What judging how the ranks' logs end costs: a file's summary of its last lines in the scan (`note_tail`), and
the diagnosis' comparison of every rank's last lines (`timeline.stopped_early`).

    python benchmarks/log_ends.py [--ranks 16384] [--lines 6 64]

`note_tail` is timed on a file's last --lines raw lines (100-200 bytes each, numbers in them, as the scan's
deque hands them over; TAIL_LINES is what the scan keeps), as the minimum over many short runs (a shared box's
other load comes and goes). `stopped_early` is timed (CPU, minimum of 3) on --ranks ranks whose last TAIL_LINES
lines hold 40 lines of the program's in one order and up to 30 lines of each rank's own (every one a shape of its
own: the worst case for the count of shapes), one rank stopped early.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpslurm.analyze.diagnose.timeline import stopped_early
from ddpslurm.analyze.model import FileSummary
from ddpslurm.analyze.parse import file_summary

WORDS = ("[rank3]:", "NCCL", "INFO", "step", "loss", "0.1234", "Epoch", "12", "warning:",
         "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py")


def note_tail_us(lines: int, rng: random.Random) -> float:
    tail = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(6, 20))).encode() for _ in range(lines)]
    best = min(timeit.repeat(lambda: file_summary.note_tail(FileSummary(file="x"), tail, False),
                             number=100, repeat=400))
    return best / 100 * 1e6


def stopped_early_s(ranks: int, rng: random.Random) -> tuple[float, set[int]]:
    program = list(range(1000, 1040))
    tails, counts = {}, {}
    for r in range(ranks):
        tail = program + [rng.randrange(1 << 32) for _ in range(rng.randrange(31))]
        tails[r] = tuple(tail[-file_summary.TAIL_LINES:])
        counts[r] = 100 + rng.randrange(50)
    silent = rng.randrange(ranks)
    tails[silent] = tuple(program[:30])
    best, got = float("inf"), set()
    for _ in range(3):
        start = time.process_time()
        got = stopped_early(tails, counts)
        best = min(best, time.process_time() - start)
    assert got == {silent}, got
    return best, got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--lines", type=int, nargs="+", default=[6, file_summary.TAIL_LINES])
    args = parser.parse_args(argv)
    rng = random.Random(0)
    for n in args.lines:
        print(f"note_tail, {n} last lines: {note_tail_us(n, rng):.1f} us a file")
    seconds, _ = stopped_early_s(args.ranks, rng)
    print(f"stopped_early, {args.ranks} ranks x {file_summary.TAIL_LINES} last lines: {seconds:.3f} s CPU "
          f"({seconds / args.ranks * 1e6:.1f} us a rank)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
