"""Every corpus case's answer, unperturbed and under every perturbation that applies, written down and compared.

    python benchmarks/corpus_answers.py dump OUT.json      # analyze every (case, perturbation) and write the answers
    python benchmarks/corpus_answers.py diff OLD.json NEW.json

`dump` runs `analyze_paths` on each case of analyzer/cases/ and on each perturbed copy that tests/corpus/perturb.py
makes of it (the pairs test_perturbation.py runs), and keeps the whole `--json` answer with the copy's temporary
folder written as `<root>`. `diff` prints, pair by pair, every key whose value differs, then the count of pairs
compared and of those that differ (and of pairs only one dump holds); it exits 1 when any differs. A change that
should not change an answer (a move, a speed-up) is held to `0 differences` over the whole corpus.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "corpus")]


def _normalized(value: Any, roots: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<root>")
        return value
    if isinstance(value, list):
        return [_normalized(v, roots) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v, roots) for k, v in value.items()}
    return value


def each_answer(case: Path) -> Iterator[tuple[str, Any, dict[str, Any] | str]]:
    """(perturbation, the copy analyzed, its `--json` answer) for a case itself (`original`, the case as its copy)
    and each perturbation that applies to it; the answer is the reason when the perturbation cannot take the case.
    A perturbed copy exists only until the next item is asked for."""
    import perturb
    import test_perturbation as tp

    from ddpslurm.analyze.api import analyze_paths

    label = tp.label_of(case)
    original = analyze_paths(tp._files(case), workers=1).to_dict()
    yield "original", perturb.Perturbed(root=case, label=dict(label)), original
    for name, make in perturb.PERTURBATIONS.items():
        if not tp.applies(case, name):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                want = make(perturb.load_facts(case, original), Path(tmp) / case.name)
            except perturb.Unsupported as why:
                yield name, None, str(why)
                continue
            yield name, want, analyze_paths(tp._files(want.root), workers=1).to_dict()


def case_answers(case_dir: str) -> dict[str, Any]:
    """{"<case>:<perturbation>": answer} for one case: its own answer and each applicable perturbation's."""
    case = Path(case_dir)
    answers: dict[str, Any] = {}
    for name, want, got in each_answer(case):
        if isinstance(got, str):
            answers[f"{case.name}:{name}"] = {"unsupported": got}
        else:
            roots = (str(case),) if name == "original" else (str(want.root), str(want.root.parent))
            answers[f"{case.name}:{name}"] = _normalized(got, roots)
    return answers


def dump(out: Path, jobs: int) -> None:
    cases = sorted(str(p) for p in (REPO / "analyzer" / "cases").iterdir() if (p / "label.json").is_file())
    answers: dict[str, Any] = {}
    with ProcessPoolExecutor(jobs) as pool:
        for part in pool.map(case_answers, cases):
            answers.update(part)
    out.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
    print(f"{len(answers)} answers of {len(cases)} cases written to {out}")


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line a differing key of a pair that both dumps hold."""
    lines = []
    for pair in sorted(old.keys() & new.keys()):
        a, b = old[pair], new[pair]
        for key in sorted(a.keys() | b.keys()):
            if a.get(key) != b.get(key):
                lines.append(f"{pair}: {key}: {json.dumps(a.get(key))[:160]} -> {json.dumps(b.get(key))[:160]}")
    return lines


def diff(old_path: Path, new_path: Path) -> int:
    old, new = json.loads(old_path.read_text()), json.loads(new_path.read_text())
    lines = differences(old, new)
    if lines:
        print("\n".join(lines))
    changed = len({line.split(": ", 1)[0] for line in lines})
    one_side = len(old.keys() ^ new.keys())
    if one_side:
        print(f"{len(old.keys() - new.keys())} pairs only in the old answers, {len(new.keys() - old.keys())} only in "
              "the new (perturbations or cases added or removed)")
    print(f"{len(old.keys() & new.keys())} (case, perturbation) pairs compared: {changed} differences")
    return 1 if changed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="analyze every case and perturbation, write the answers")
    d.add_argument("out", type=Path)
    d.add_argument("--jobs", type=int, default=2)
    c = sub.add_parser("diff", help="compare two dumps")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.command == "dump":
        dump(args.out, args.jobs)
        return 0
    return diff(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
