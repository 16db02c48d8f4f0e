"""Print (or write into analyzer/cases/README.md) the index table of the labelled case corpus.

    python benchmarks/case_index.py            # print the table
    python benchmarks/case_index.py --write    # replace the table between the INDEX markers of the README
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = REPO / "analyzer" / "cases"
README = CASES / "README.md"
BEGIN, END = "<!-- INDEX BEGIN (benchmarks/case_index.py --write) -->", "<!-- INDEX END -->"


def layout(case: Path) -> str:
    """The log layout of a case, told from its file names (the same clues `analyze` uses)."""
    names = [p.relative_to(case).as_posix() for p in case.rglob("*") if p.is_file() and p.name != "label.json"]
    if any(re.search(r"(^|/)attempt_\d+/rank_\d+\.log$", n) for n in names):
        return "ddpslurm job folder"
    if any(re.search(r"attempt_\d+/\d+/std(out|err)\.log$", n) for n in names):
        return "torchrun --log-dir" + (" + error.json" if any(n.endswith("error.json") for n in names) else "")
    if any(re.search(r"\d+_\d+_log\.(out|err)$", n) for n in names):
        return "submitit folder"
    if any(re.match(r"slurm-\d+\.out$", n) for n in names):
        return "slurm-J.out" + (" + journalctl" if any("journalctl" in n for n in names) else "")
    return "pasted log (" + ", ".join(sorted(names)) + ")"


def rows() -> list[tuple[str, dict, str]]:
    out = []
    for case in sorted(p for p in CASES.iterdir() if (p / "label.json").is_file()):
        out.append((case.name, json.loads((case / "label.json").read_text()), layout(case)))
    return out


def short(text: str, n: int = 110) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def table() -> str:
    data = rows()
    counts = Counter(label["cause"] for _, label, _ in data)
    lines = [f"{len(data)} cases; per cause: " + ", ".join(f"{c} {n}" for c, n in sorted(counts.items())), "",
             "| case | cause | rank | host | layout | source |", "|---|---|---|---|---|---|"]
    for name, label, lay in data:
        rank = "—" if label.get("first_failing_rank") is None else str(label["first_failing_rank"])
        host = label.get("first_failing_host") or "—"
        lines.append(f"| `{name}` | {label['cause']} | {rank} | {host} | {lay} | {short(label['source'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the index section of analyzer/cases/README.md")
    args = parser.parse_args()
    text = table()
    if not args.write:
        print(text)
        return
    readme = README.read_text()
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"{README}: the markers {BEGIN!r} and {END!r} are missing")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    print(f"wrote {len(text.splitlines()) - 3} rows into {README}")


if __name__ == "__main__":
    main()
