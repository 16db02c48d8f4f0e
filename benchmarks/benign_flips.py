"""How often one line that healthy runs print flips a diagnosis: tests/corpus/benign/ injected into every case.

    python benchmarks/benign_flips.py [--seeds 3] [--lines 1 4 20] [--cases SUBSTR ...] [--json OUT.json]

For every case of analyzer/cases/ x every seed x every N of `--lines`, `perturb.benign_library` injects N records of
the library into every rank's log (before the rank's failure, as that rank prints them) and the copy is analyzed;
a trial flips when cause, first_failing_rank or first_failing_host differs from the unperturbed answer (not from the
label: a case the analyzer gets wrong today still must not move). A flip is blamed on the records whose injected
lines the new answer cites as evidence and that flip it alone (the copy with only that record's lines kept); when
none does, the injected records are bisected (only half of them kept, recursively) down to one record that flips
alone; "(interaction)" when no single one does.
Prints the flip rate overall, per N and per family (a family is tried in every trial that injected one of its
records), then every (case, record) that flipped with old -> new answer and confidence (the answer with only that
record's lines injected), then the library's files analyzed alone as logs, their records without the source header
(any cause but unknown/none is a line that decides on its own).
Runs in a few minutes on 2 cores (ProcessPoolExecutor(2)).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "corpus")]

KEYS = ("cause", "first_failing_rank", "first_failing_host")


def _answer(d: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(d.get(k) for k in KEYS)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "label.json")


def _analyze(root: Path) -> dict[str, Any]:
    from ddpslurm.analyze.api import analyze_paths

    return analyze_paths(_files(root), workers=1).to_dict()


def _keep_only(src: Path, dest: Path, manifest: list[dict[str, Any]], keep: set[str]) -> Path:
    """A copy of the perturbed folder without the injected lines of records not in `keep`."""
    drop: dict[str, set[int]] = defaultdict(set)
    for entry in manifest:
        if entry["record"] not in keep:
            drop[entry["file"]].add(entry["line"])
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    for rel, numbers in drop.items():
        path = dest / rel
        lines = path.read_bytes().split(b"\n")
        path.write_bytes(b"\n".join(line for n, line in enumerate(lines, start=1) if n not in numbers))
    return dest


def _alone_answer(root: Path, manifest: list[dict[str, Any]], record: str, tmp: Path) -> dict[str, Any]:
    return _analyze(_keep_only(root, tmp / "alone", manifest, {record}))


def _solo(root: Path, manifest: list[dict[str, Any]], base: tuple[Any, ...], tmp: Path, cited: list[str],
          tries: int = 3) -> list[str]:
    """Of the injected records the new answer cites (in its evidence order), those that flip it alone."""
    return [record for k, record in enumerate(cited[:tries])
            if _answer(_analyze(_keep_only(root, tmp / f"solo{k}", manifest, {record}))) != base]


def _blame(root: Path, manifest: list[dict[str, Any]], base: tuple[Any, ...], tmp: Path) -> list[str]:
    """Records a flip comes from: bisect the injected records down to one whose lines alone flip the answer."""
    records = sorted({e["record"] for e in manifest})
    step = 0

    def flips(keep: list[str]) -> bool:
        nonlocal step
        step += 1
        return _answer(_analyze(_keep_only(root, tmp / f"bisect{step}", manifest, set(keep)))) != base

    while len(records) > 1:
        half = len(records) // 2
        low, high = records[:half], records[half:]
        if flips(low):
            records = low
        elif flips(high):
            records = high
        else:
            return ["(interaction)"]
    return records if records and flips(records) else ["(interaction)"]


def _blamed(record: str, family_of: dict[str, str], texts: dict[str, str], root: Path,
            manifest: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    """A blamed record, with the answer its lines give alone (what the flip table shows)."""
    row: dict[str, Any] = {"record": record, "family": family_of.get(record, "?"),
                           "as_injected": texts.get(record, record)}
    if record != "(interaction)":
        got = _alone_answer(root, manifest, record, tmp)
        row.update(alone=list(_answer(got)), alone_confidence=got.get("confidence"),
                   alone_evidence=[f"{Path(str(e.get('file'))).name}:{e.get('line')} {str(e.get('text'))[:160]}"
                                   for e in got.get("evidence", [])[:3]])
    return row


def case_trials(case_dir: str, seeds: list[int], counts: list[int]) -> dict[str, Any]:
    import perturb

    case = Path(case_dir)
    base_full = _analyze(case)
    base = _answer(base_full)
    facts = perturb.load_facts(case, base_full)
    library = perturb.load_benign_library()
    family_of = {r.lines[0]: r.family for r in library}
    trials = []
    for n in counts:
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp_name:
                tmp = Path(tmp_name)
                manifest: list[dict[str, Any]] = []
                want = perturb.benign_library(facts, tmp / case.name, n=n, seed=seed, library=library,
                                              manifest=manifest)
                got = _analyze(want.root)
                families = sorted({e["family"] for e in manifest})
                trial: dict[str, Any] = {"n": n, "seed": seed, "families": families, "injected": len(manifest),
                                         "flipped": _answer(got) != base}
                if trial["flipped"]:
                    where = {(e["file"], e["line"]): e for e in manifest}
                    cited = []
                    for ev in got.get("evidence", []):
                        try:
                            rel = str(Path(str(ev.get("file"))).resolve().relative_to(want.root.resolve()))
                        except ValueError:
                            continue
                        hit = where.get((rel, ev.get("line")))
                        if hit and hit["record"] not in cited:
                            cited.append(hit["record"])
                    blamed = _solo(want.root, manifest, base, tmp, cited) or _blame(want.root, manifest, base, tmp)
                    texts = {e["record"]: e["text"] for e in manifest}
                    trial.update(new=list(_answer(got)), confidence=got.get("confidence"),
                                 by="evidence" if set(cited) & {b for b in blamed} else "bisection",
                                 blamed=[_blamed(r, family_of, texts, want.root, manifest, tmp) for r in blamed],
                                 evidence=[f"{Path(str(e.get('file'))).name}:{e.get('line')} {str(e.get('text'))[:160]}"
                                           for e in got.get("evidence", [])[:3]])
                trials.append(trial)
    return {"case": case.name, "base": list(base), "base_confidence": base_full.get("confidence"), "trials": trials}


def alone(family: str) -> dict[str, Any]:
    """One family's records (its file without the `#` header that names its sources) analyzed as one log."""
    import perturb

    records = [r for r in perturb.load_benign_library() if r.family == family]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{family}.log"
        path.write_bytes("\n".join(line for r in records for line in r.lines).encode("utf-8", "surrogateescape")
                         + b"\n")
        got = _analyze_file(path)
    return {"file": f"{family}.txt", "cause": got["cause"], "rank": got["first_failing_rank"],
            "host": got["first_failing_host"], "confidence": got.get("confidence"),
            "evidence": [f"{e.get('line')}: {str(e.get('text'))[:140]}" for e in got.get("evidence", [])[:3]]}


def _analyze_file(path: Path) -> dict[str, Any]:
    from ddpslurm.analyze.api import analyze_paths

    return analyze_paths([path], workers=1).to_dict()


def _rate(flipped: int, tried: int) -> str:
    return f"{flipped}/{tried} = {100.0 * flipped / tried:.1f}%" if tried else "0/0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lines", type=int, nargs="+", default=[1, 4, 20])
    parser.add_argument("--cases", nargs="*", default=[], help="only cases whose name holds one of these")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every trial here")
    args = parser.parse_args(argv)

    import perturb

    cases = sorted(p for p in (REPO / "analyzer" / "cases").iterdir() if (p / "label.json").is_file())
    if args.cases:
        cases = [c for c in cases if any(s in c.name for s in args.cases)]
    seeds = list(range(args.seeds))
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(case_trials, [str(c) for c in cases], [seeds] * len(cases),
                                [args.lines] * len(cases), chunksize=2))
        lonely = list(pool.map(alone, [p.stem for p in sorted(perturb.BENIGN_DIR.glob("*.txt"))]))

    all_trials = [t for r in results for t in r["trials"]]
    print(f"benign-line flips: {len(cases)} cases x {len(seeds)} seeds x N in {args.lines} "
          f"({len(perturb.load_benign_library())} records in {perturb.BENIGN_DIR.relative_to(REPO)})")
    print(f"overall: {_rate(sum(t['flipped'] for t in all_trials), len(all_trials))} trials flipped")
    for n in args.lines:
        sub = [t for t in all_trials if t["n"] == n]
        cases_flipped = sum(any(t["flipped"] and t["n"] == n for t in r["trials"]) for r in results)
        print(f"  N={n:<3} {_rate(sum(t['flipped'] for t in sub), len(sub))} trials; "
              f"{cases_flipped}/{len(results)} cases flip in some seed")
    tried: Counter[str] = Counter()
    blamed: Counter[str] = Counter()
    for t in all_trials:
        tried.update(t["families"])
        if t["flipped"]:
            blamed.update({b["family"] for b in t["blamed"]})
    print("per family (trials that injected it / trials whose flip is blamed on it):")
    for family in sorted(tried, key=lambda f: -blamed[f] / max(1, tried[f])):
        print(f"  {family:20} {_rate(blamed[family], tried[family])}")
    if blamed["?"]:
        print(f"  {'(interaction)':20} {blamed['?']} flipped trials with no single record to blame")

    flips: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        for t in r["trials"]:
            if not t["flipped"]:
                continue
            for b in t["blamed"]:
                key = (r["case"], b["record"])
                row = flips.setdefault(key, {"case": r["case"], "record": b["record"], "family": b["family"],
                                             "old": r["base"], "new": b.get("alone", t["new"]),
                                             "confidence": b.get("alone_confidence", t["confidence"]),
                                             "by": t["by"], "count": 0, "ns": set(),
                                             "evidence": b.get("alone_evidence", t["evidence"])})
                row["count"] += 1
                row["ns"].add(t["n"])
    print(f"\nflips by (case, record): {len(flips)}")
    by_record = Counter(k[1] for k in flips)
    for (case, record), row in sorted(flips.items(), key=lambda kv: (-by_record[kv[0][1]], kv[0])):
        old = "/".join(str(x) for x in row["old"])
        new = "/".join(str(x) for x in row["new"])
        print(f"- {case} [{row['family']}] {record[:110]!r}\n    {old} -> {new} ({row['confidence']}, "
              f"{row['count']}x, N in {sorted(row['ns'])}, by {row['by']})")
    print("\nlibrary files analyzed alone (records only):")
    for row in lonely:
        flag = "" if row["cause"] in ("unknown", "none", None) else "   <-- decides alone"
        print(f"  {row['file']:24} {row['cause']}/{row['rank']}/{row['host']} ({row['confidence']}){flag}")
        if flag:
            for ev in row["evidence"]:
                print(f"      {ev}")
    if args.json:
        for row in flips.values():
            row["ns"] = sorted(row["ns"])
        args.json.write_text(json.dumps({"results": results, "alone": lonely,
                                         "flips": list(flips.values())}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
