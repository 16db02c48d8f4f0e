"""What each confidence level is worth: the share of right answers at `high`, `medium` and `low`, measured.

    python benchmarks/confidence_calibration.py            # every case, unperturbed and under every perturbation
    python benchmarks/confidence_calibration.py --json     # the table as one JSON object

An answer is right when the cause, the first failing rank and host (and retry / exclude_nodes where the label has
them) are the label's, mapped through the perturbation as tests/corpus/test_perturbation.py maps it. Pending cases
(not diagnosed right even unperturbed) count too: a level's claim holds on everything it is said of. `high` is
meant to be right >= 99% of the time; the report says whether it is, and lists the wrong `high` answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "corpus"), str(REPO / "benchmarks")]
LEVELS = ("high", "medium", "low")
HIGH_TARGET = 0.99


def judged(case_dir: str) -> list[tuple[str, str, bool, str]]:
    """(pair, confidence, right, what differed) for a case and each perturbation that applies to it."""
    import test_perturbation as tp
    from corpus_answers import each_answer

    case = Path(case_dir)
    return [(f"{case.name}:{name}", got["confidence"],
             *_verdict(tp, want, got, name == "original" or tp.host_is_named(want)))
            for name, want, got in each_answer(case) if not isinstance(got, str)]


def _verdict(tp: Any, want: Any, got: dict[str, Any], host_named: bool = True) -> tuple[bool, str]:
    problems = tp.mismatches(want, got, lenient_rank=False, host_named=host_named)
    return not problems, ", ".join(problems)


def table(rows: list[tuple[str, str, bool, str]]) -> dict[str, Any]:
    said, right = Counter(r[1] for r in rows), Counter(r[1] for r in rows if r[2])
    levels = {level: {"answers": said[level], "right": right[level],
                      "share_right": round(right[level] / said[level], 4) if said[level] else None}
              for level in LEVELS}
    wrong_high = [f"{pair}: {what}" for pair, level, ok, what in rows if level == "high" and not ok]
    share = levels["high"]["share_right"]
    return {"pairs": len(rows), "levels": levels, "high_holds": share is None or share >= HIGH_TARGET,
            "wrong_high": wrong_high}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    cases = sorted(str(p) for p in (REPO / "analyzer" / "cases").iterdir() if (p / "label.json").is_file())
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [row for part in pool.map(judged, cases) for row in part]
    result = table(rows)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['pairs']} answers (every case, unperturbed and perturbed)")
    print(f"{'confidence':12}{'answers':>9}{'right':>8}{'share right':>13}")
    for level, row in result["levels"].items():
        share = "-" if row["share_right"] is None else f"{100 * row['share_right']:.1f}%"
        print(f"{level:12}{row['answers']:>9}{row['right']:>8}{share:>13}")
    print(f"high >= {100 * HIGH_TARGET:.0f}% right: {'holds' if result['high_holds'] else 'DOES NOT HOLD'}")
    for line in result["wrong_high"]:
        print(f"  wrong at high: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
