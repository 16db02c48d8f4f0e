"""Score the analyzer on the REAL cases (analyzer/cases/real-*: logs copied verbatim from public issue threads).

Prints cause accuracy, first-failing-rank accuracy, how often a rank was named where the label says null, every
miss with what the analyzer said, and the "first error line" baseline: the rank of the first line in the logs that
looks like an error (what a person skimming the paste would blame).

    python benchmarks/real_corpus_score.py                 # score the installed engine (PYTHONPATH=DIR for another)
    python benchmarks/real_corpus_score.py --json          # one JSON object instead of the report
    python benchmarks/real_corpus_score.py --mark-pending  # set "pending": true on misses, drop it on hits

`--mark-pending` rewrites only the `pending` / `pending_why` keys of real-* labels; tests/corpus/test_cases.py runs
pending cases as non-strict xfails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CASES_DIR = REPO / "analyzer" / "cases"

#: A line "looks like an error" to a person skimming a paste: these words, case-sensitive where noted.
ERROR_LINE = re.compile(
    r"Traceback \(most recent call last\)|\bError\b|Error:|ERROR|\berror\b|\bfailed\b|FAILED|Killed|"
    r"NCCL WARN|\bWARN\b|Exception|exception|timed out|Timed out|CANCELLED|Segmentation fault|Bus error|"
    r"out of memory|exitcode"
)
#: Where a rank can be read off one line, most specific first (global ranks before local ones).
RANK_PATTERNS = (
    re.compile(r"\[rank(\d+)\]:"),
    re.compile(r"\[Rank (\d+)\]"),
    re.compile(r"\brank(?:\s*:)?\s+(\d+)\b"),
    re.compile(r"\btasks? (\d+)[:,-]"),
    re.compile(r"^(\d+): "),
    re.compile(r"local_rank: (\d+)"),
)


@dataclass(frozen=True)
class Outcome:
    """One case: what the label says, what the analyzer said, and the first-error-line baseline."""

    case: str
    want_cause: str
    want_rank: int | None
    got_cause: str
    got_rank: int | None
    got_summary: str
    baseline_rank: int | None
    baseline_line: str
    other_misses: tuple[str, ...] = ()
    observable: bool = True  #: False: the label's culprit is known from the injection only (rank_observable)

    @property
    def cause_ok(self) -> bool:
        return self.got_cause == self.want_cause

    @property
    def rank_ok(self) -> bool:
        return self.got_rank == self.want_rank

    @property
    def baseline_ok(self) -> bool:
        return self.baseline_rank == self.want_rank

    @property
    def passes_corpus_test(self) -> bool:
        """What tests/corpus/test_cases.py checks: where the logs cannot name the culprit, naming none is right."""
        rank_ok = self.rank_ok or (not self.observable and self.got_rank is None)
        return self.cause_ok and rank_ok and not self.other_misses


def real_cases(cases_dir: Path, prefix: str) -> list[Path]:
    return sorted(p for p in cases_dir.glob(f"{prefix}*") if (p / "label.json").is_file())


def case_files(case: Path) -> list[Path]:
    """Every file of a case except its label, in the corpus test's order."""
    return sorted(p for p in case.rglob("*") if p.is_file() and p.name != "label.json")


def rank_on_line(line: str) -> int | None:
    for pattern in RANK_PATTERNS:
        match = pattern.search(line)
        if match:
            return int(match.group(1))
    return None


def first_error_line(files: list[Path]) -> tuple[int | None, str]:
    """The rank (or None) and text of the first line, across the files in order, that looks like an error."""
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if ERROR_LINE.search(line):
                    return rank_on_line(line), line.strip()[:160]
    return None, ""


def score_case(case: Path) -> Outcome:
    from ddpslurm.analyze.api import analyze_paths

    label = json.loads((case / "label.json").read_text())
    files = case_files(case)
    got = analyze_paths(files).to_dict()
    baseline_rank, baseline_line = first_error_line(files)
    return Outcome(case.name, label["cause"], label["first_failing_rank"], got["cause"], got["first_failing_rank"],
                   got["summary"], baseline_rank, baseline_line, other_label_misses(label, got),
                   label.get("rank_observable", True))


def other_label_misses(label: dict[str, Any], got: dict[str, Any]) -> tuple[str, ...]:
    """The corpus test's further checks (host, null included; retry; exclude_nodes) that the diagnosis fails."""
    misses = []
    unseen_host = label.get("rank_observable", True) is False and got["first_failing_host"] is None
    if got["first_failing_host"] != label["first_failing_host"] and not unseen_host:
        misses.append(f"host {got['first_failing_host']} (want {label['first_failing_host']})")
    if "retry" in label and got["retry"] != label["retry"]:
        misses.append(f"retry {got['retry']} (want {label['retry']})")
    if "exclude_nodes" in label and sorted(got["exclude_nodes"]) != sorted(label["exclude_nodes"]):
        misses.append(f"exclude_nodes {got['exclude_nodes']} (want {label['exclude_nodes']})")
    return tuple(misses)


def ratio(hits: int, total: int) -> str:
    return f"{hits}/{total} = {100 * hits / total:.0f}%" if total else "0/0"


def figures(outcomes: list[Outcome]) -> dict[str, Any]:
    """The headline numbers, each as hits and total."""
    ranked = [o for o in outcomes if o.want_rank is not None]
    unranked = [o for o in outcomes if o.want_rank is None]
    both = [o for o in outcomes if o.cause_ok and o.rank_ok]
    return {
        "cases": len(outcomes),
        "cause": (sum(o.cause_ok for o in outcomes), len(outcomes)),
        "rank_all": (sum(o.rank_ok for o in outcomes), len(outcomes)),
        "rank_determinable": (sum(o.rank_ok for o in ranked), len(ranked)),
        "rank_named_where_null": (sum(o.got_rank is not None for o in unranked), len(unranked)),
        "cause_and_rank": (len(both), len(outcomes)),
        "baseline_rank_all": (sum(o.baseline_ok for o in outcomes), len(outcomes)),
        "baseline_rank_determinable": (sum(o.baseline_ok for o in ranked), len(ranked)),
    }


def miss_reason(o: Outcome) -> str:
    parts = []
    if not o.cause_ok:
        parts.append(f"cause {o.got_cause} (want {o.want_cause})")
    if not o.rank_ok:
        parts.append(f"rank {o.got_rank} (want {o.want_rank})")
    return ", ".join(parts + list(o.other_misses))


def print_report(outcomes: list[Outcome]) -> None:
    fig = figures(outcomes)
    print(f"real cases: {fig['cases']}")
    print(f"  cause accuracy:                         {ratio(*fig['cause'])}")
    print(f"  first-rank accuracy (all, null=null):   {ratio(*fig['rank_all'])}")
    print(f"  first-rank accuracy (label has a rank): {ratio(*fig['rank_determinable'])}")
    print(f"  named a rank where the label is null:   {ratio(*fig['rank_named_where_null'])}")
    print(f"  cause and rank both right:              {ratio(*fig['cause_and_rank'])}")
    print(f"  baseline 'first error line' rank (all): {ratio(*fig['baseline_rank_all'])}")
    print(f"  baseline rank (label has a rank):       {ratio(*fig['baseline_rank_determinable'])}")
    misses = [o for o in outcomes if not (o.cause_ok and o.rank_ok)]
    print(f"\nmisses ({len(misses)}):")
    for o in misses:
        print(f"  {o.case}: {miss_reason(o)}")
        print(f"      said: {o.got_summary[:150]}")
    others = [o for o in outcomes if o.cause_ok and o.rank_ok and o.other_misses]
    print(f"\ncause and rank right, another label key wrong ({len(others)}):")
    for o in others:
        print(f"  {o.case}: {', '.join(o.other_misses)}")


def mark_pending(cases_dir: Path, outcomes: list[Outcome]) -> int:
    """Set `pending` (with the miss as `pending_why`) where the corpus test would fail; drop it where it passes."""
    changed = 0
    for o in outcomes:
        path = cases_dir / o.case / "label.json"
        label = json.loads(path.read_text())
        before = dict(label)
        label.pop("pending", None)
        label.pop("pending_why", None)
        if not o.passes_corpus_test:
            label["pending"] = True
            label["pending_why"] = f"analyzer said {miss_reason(o)}"
        if label != before:
            path.write_text(json.dumps(label, indent=2, ensure_ascii=False) + "\n")
            changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases-dir", type=Path, default=CASES_DIR)
    parser.add_argument("--prefix", default="real-", help="case folder prefix (default: real-)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--mark-pending", action="store_true", help="update `pending` in the labels")
    args = parser.parse_args(argv)
    cases = real_cases(args.cases_dir, args.prefix)
    if not cases:
        print(f"no case folders named {args.prefix}* under {args.cases_dir}", file=sys.stderr)
        return 2
    outcomes = [score_case(case) for case in cases]
    if args.json:
        print(json.dumps({"figures": figures(outcomes), "cases": [asdict(o) for o in outcomes]}, indent=2))
    else:
        print_report(outcomes)
    if args.mark_pending:
        print(f"\nlabels changed: {mark_pending(args.cases_dir, outcomes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
