"""Perturbation tests: every labelled case, perturbed in ways that keep its meaning, must be diagnosed the same.

For each (case, perturbation) of tests/corpus/perturb.py the expectation is the case's ORIGINAL label mapped
through the perturbation (renamed host, renumbered rank); a null rank or host in the label requires null. A rule
that passes only because it was written for one case's ranks, hosts, clocks or file layout fails here.
Today's failures are listed in perturbation_known_failures.txt (`case perturbation  # reason`) and run as strict
xfails: a fix shows up as XPASS and its line must go.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perturb

REPO = Path(__file__).resolve().parents[2]
CASES_DIR = REPO / "analyzer" / "cases"
KNOWN_FAILURES = Path(__file__).resolve().parent / "perturbation_known_failures.txt"
CASES = sorted(p for p in CASES_DIR.iterdir() if p.is_dir() and (p / "label.json").is_file())


def load_known_failures(path: Path = KNOWN_FAILURES) -> dict[tuple[str, str], str]:
    """`case perturbation  # reason` lines -> {(case, perturbation): reason}; blank lines and `#` lines skipped."""
    known: dict[tuple[str, str], str] = {}
    if not path.is_file():
        return known
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        body, _, reason = raw.partition("#")
        words = body.split()
        if not words:
            continue
        if len(words) != 2:
            raise ValueError(f"{path.name}:{number}: expected `case perturbation  # reason`, got {raw!r}")
        known[(words[0], words[1])] = reason.strip() or "known failure"
    return known


KNOWN = load_known_failures()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "label.json")


def applies(case: Path, name: str) -> bool:
    """Whether the case has what the perturbation acts on: records, per-rank logs, a host name, three ranks."""
    names = [p.name for p in _files(case)]
    if name.startswith("rename_hosts"):
        return bool(perturb.known_hosts(perturb.load_facts(case, {})))
    if name == "renumber_ranks":  # with one or two ranks no other permutation keeps rank 0
        return perturb.world_size(perturb.load_facts(case, {})) >= 3
    if name == "delete_records":
        return any(n.endswith(perturb.RECORD_SUFFIXES) or n == perturb.JOB_RECORD for n in names)
    if name == "merge_ranks":
        tasks = {n for n in names if perturb._FILE_TASK.match(n)}
        ranks = {n for n in names if perturb._FILE_RANK.match(n) and not n.endswith(".json")}
        return len(tasks or ranks) >= 2
    return True


@functools.cache
def label_of(case: Path) -> dict[str, Any]:
    return json.loads((case / "label.json").read_text())


def _params() -> list[Any]:
    params = []
    for case in CASES:
        for name in perturb.PERTURBATIONS:
            if not applies(case, name):
                continue
            marks = []
            if label_of(case).get("pending") is True:  # the case itself is not diagnosed right yet (test_cases.py)
                marks.append(pytest.mark.xfail(strict=False, reason="pending case: " + label_of(case).get(
                    "pending_why", "engine does not diagnose it yet")))
            elif (case.name, name) in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[(case.name, name)]))
            params.append(pytest.param(case, name, marks=marks, id=f"{case.name}:{name}"))
    return params


@functools.cache
def original_diagnosis(case: Path) -> dict[str, Any]:
    from ddpslurm.analyze.api import analyze_paths

    return analyze_paths(_files(case), workers=1).to_dict()


def host_is_named(want: perturb.Perturbed) -> bool:
    """Whether the perturbed copy still names the label's host anywhere (deleting records may take the only one)."""
    host = want.label.get("first_failing_host")
    if not isinstance(host, str):
        return True
    spellings = (host, *want.host_aliases)
    return any(s in p.read_text(errors="replace") for p in _files(want.root) for s in spellings)


def mismatches(want: perturb.Perturbed, got: dict[str, Any], lenient_rank: bool, host_named: bool = True) -> list[str]:
    """What differs between the mapped label and the diagnosis of the perturbed copy (empty: invariant)."""
    label = want.label
    problems = []
    if got["cause"] != label["cause"]:
        problems.append("cause")
    may_be_null = lenient_rank or label.get("rank_observable") is False
    rank_ok = {label["first_failing_rank"]}
    host_ok = {label["first_failing_host"], *want.host_aliases}
    if label["first_failing_rank"] is not None and may_be_null:
        rank_ok.add(None)
    if label["first_failing_host"] is not None and (may_be_null or not host_named):
        host_ok.add(None)
    if got["first_failing_rank"] not in rank_ok:
        problems.append("first_failing_rank")
    if got["first_failing_host"] not in host_ok:
        problems.append("first_failing_host")
    if "retry" in label and got["retry"] != label["retry"]:
        problems.append("retry")
    if "exclude_nodes" in label and sorted(got["exclude_nodes"]) != sorted(label["exclude_nodes"]):
        problems.append("exclude_nodes")
    return problems


def _explain(want: perturb.Perturbed, got: dict[str, Any], problems: list[str]) -> str:
    lines = [f"differs in {', '.join(problems)} (perturbed copy: {want.root})"]
    for key in ("cause", "first_failing_rank", "first_failing_host", "retry", "exclude_nodes"):
        lines.append(f"  {key:20} want {want.label.get(key, '-')!r:30} got {got.get(key)!r}")
    lines.append(f"summary: {got.get('summary')}")
    lines += [f"  evidence {Path(str(ev.get('file'))).name}:{ev.get('line')} rank={ev.get('rank')}: "
              f"{str(ev.get('text'))[:140]}" for ev in got.get("evidence", [])[:5]]
    return "\n".join(lines)


@pytest.mark.parametrize(("case", "name"), _params())
def test_diagnosis_is_invariant(case: Path, name: str, tmp_path: Path) -> None:
    from ddpslurm.analyze.api import analyze_paths

    facts = perturb.load_facts(case, original_diagnosis(case))
    try:
        want = perturb.PERTURBATIONS[name](facts, tmp_path / case.name)
    except perturb.Unsupported as why:
        pytest.skip(f"{name} unsupported for {case.name}: {why}")
    got = analyze_paths(_files(want.root), workers=1).to_dict()
    problems = mismatches(want, got, lenient_rank=want.rank_may_be_null, host_named=host_is_named(want))
    assert not problems, _explain(want, got, problems)


#: Cases whose ranks the rewriter may not renumber without guessing (a local rank whose node no prefix, file or
#: record tells); more than a handful means the rewriter must learn the format, not that cases may be skipped.
HANDFUL = 5


def test_renumbering_understands_almost_every_case(tmp_path: Path) -> None:
    ambiguous = []
    for case in CASES:
        facts = perturb.load_facts(case, original_diagnosis(case))
        try:
            perturb.renumber_ranks(facts, tmp_path / case.name)
        except perturb.Unsupported as why:
            if not str(why).endswith(perturb.NO_PERMUTATION):  # one or two ranks: nothing to renumber
                ambiguous.append(f"{case.name}: {why}")
    assert len(ambiguous) <= HANDFUL, "renumbering gives up on:\n" + "\n".join(ambiguous)


def test_known_failures_name_real_pairs() -> None:
    """Every line of the known-failures list names an existing case and perturbation (no stale entries)."""
    cases = {c.name for c in CASES}
    stale = [f"{c} {p}" for c, p in KNOWN if c not in cases or (p not in perturb.PERTURBATIONS and p != "original")]
    assert not stale, f"{KNOWN_FAILURES.name} names unknown pairs: {stale}"


def test_known_failures_parser_rejects_bad_lines(tmp_path: Path) -> None:
    bad = tmp_path / "known.txt"
    bad.write_text("only-a-case  # reason\n")
    with pytest.raises(ValueError, match="expected `case perturbation"):
        load_known_failures(bad)
    good = tmp_path / "good.txt"
    good.write_text("# comment\n\ncase-a rename_hosts  # why it fails\n")
    assert load_known_failures(good) == {("case-a", "rename_hosts"): "why it fails"}

