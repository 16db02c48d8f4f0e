"""The combiner's knowledge as declared data (analyzer/combiner.toml): loaded, validated, and the only source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ddpslurm.analyze.diagnose import knowledge as know
from ddpslurm.analyze.model import CAUSES
from ddpslurm.errors import AnalyzeInputError

DIAGNOSE = Path(know.__file__).resolve().parent
SHIPPED = know.shipped_path().read_text()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "combiner.toml"
    path.write_text(text)
    return path


def test_the_shipped_file_declares_every_producer_and_group() -> None:
    k = know.load_knowledge(know.shipped_path())
    assert set(k.producers) == set(know.PRODUCERS)
    assert set(k.groups) == set(know.CAUSE_GROUPS)
    assert all(c in CAUSES for causes in k.groups.values() for c in causes)
    # a group built from others holds theirs (one definition each)
    assert set(k.groups["broken_transfer"]) | set(k.groups["waiting"]) <= set(k.groups["lost_peer"])
    assert set(k.groups["broken_transfer"]) <= set(k.groups["teardown_consequence"])


@pytest.mark.parametrize(("old", "new", "named"), [
    ("margin = 1.25", "margin = 1.25\nmargni = 2.0", "margni"),  # a misspelt threshold
    ("margin = 1.25\n", "", "margin"),  # a missing one
    ('wait_ends = ["slurm_time_limit", "slurm_cancelled"]', 'wait_ends = ["slurm_time_limit", "slurm_canceled"]',
     "slurm_canceled"),  # a cause not in the vocabulary
    ('[producers.detector]', '[producers.detectr]', "detectr"),  # a producer the code does not have
    ('weights = { scale = 0.8 }', 'weights = { scale = 0.8, scael = 1.0 }', "scael"),  # an unknown weight
    ('weight = 40.0', 'weight = "forty"', "weight"),  # not a number
    ('weight = 40.0', 'weight = -40.0', "weight"),  # a negative weight
    ('node_report = true', 'node_report = "yes"', "node_report"),  # a trait is a boolean
    ('includes = ["broken_transfer", "waiting"]', 'includes = ["broken_transfer", "waitng"]', "waitng"),
    ("[own_weight]", "[own_weights]", "own_weights"),
])
def test_a_bad_file_is_one_error_naming_the_file_and_the_key(tmp_path: Path, old: str, new: str, named: str) -> None:
    assert old in SHIPPED
    path = _write(tmp_path, SHIPPED.replace(old, new, 1))
    with pytest.raises(AnalyzeInputError) as caught:
        know.load_knowledge(path)
    line = caught.value.one_line()
    assert str(path) in line and named in line and "\n" not in line, line


def test_a_missing_producer_and_broken_toml_are_errors(tmp_path: Path) -> None:
    start = SHIPPED.index('[producers."duplicate ranks"]')
    with pytest.raises(AnalyzeInputError, match="duplicate ranks"):
        know.load_knowledge(_write(tmp_path, SHIPPED[:start]))
    with pytest.raises(AnalyzeInputError, match="not valid TOML"):
        know.load_knowledge(_write(tmp_path, SHIPPED + "\n[thresholds\n"))


def test_the_combiner_reads_the_margin_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two candidates of weight 12 and 10: not apart by the shipped margin (1.25), apart by a margin of 1.1."""
    from ddpslurm.analyze.diagnose.combiner import Candidate, _stands_out
    from ddpslurm.analyze.diagnose.votes import Vote

    pair = [Candidate(0, "a", [Vote("named peer", 12.0, "")]), Candidate(1, "b", [Vote("named peer", 10.0, "")])]
    assert _stands_out(pair, key=lambda c: c.weight) is None
    loosened = know.load_knowledge(_write(tmp_path, SHIPPED.replace("margin = 1.25", "margin = 1.1", 1)))
    monkeypatch.setattr(know, "knowledge", lambda: loosened)
    got = _stands_out(pair, key=lambda c: c.weight)
    assert got is not None and got.rank == 0


def test_a_producer_weight_comes_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpslurm.analyze.diagnose.own_reports import own_weight
    from ddpslurm.analyze.model import Event

    line = Event(file="f", line=1, text="x", kind="signature", role="culprit", priority=40)
    assert own_weight(line) == 70.0
    heavier = know.load_knowledge(_write(tmp_path, SHIPPED.replace("culprit_base = 50.0", "culprit_base = 60.0")))
    monkeypatch.setattr(know, "knowledge", lambda: heavier)
    assert own_weight(line) == 80.0


def test_a_vote_of_an_undeclared_producer_is_refused() -> None:
    from ddpslurm.analyze.diagnose.votes import Vote

    with pytest.raises(KeyError):
        Vote("my new producer", 10.0, "")


def _sources() -> list[tuple[Path, ast.AST]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(DIAGNOSE.glob("*.py"))]


def test_no_diagnose_code_branches_on_a_producer_name() -> None:
    """`vote.producer == "slurm"`, `v.producer in (...)`: what a producer's votes are is a trait of the file."""
    found = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(isinstance(o, ast.Attribute) and o.attr == "producer" for o in operands):
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, f"comparisons with a vote's producer name: {found}"


def test_every_vote_the_code_makes_is_of_a_declared_producer_with_a_declared_weight() -> None:
    declared = know.load_knowledge(know.shipped_path())
    made, asked = set(), set()
    for _path, tree in _sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
                continue
            args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if node.func.id == "Vote" and args:
                made.add(args[0])
                assert not isinstance(node.args[1], ast.Constant), f"a literal weight for {args[0]!r}: declare it"
            elif node.func.id == "weight" and args:
                asked.add((args[0], args[1] if len(args) > 1 else ""))
    assert made and made <= set(declared.producers), made - set(declared.producers)
    missing = {(p, n) for p, n in asked if n not in declared.producers[p].weights}
    assert asked and not missing, missing


def test_no_diagnose_module_keeps_a_cause_group_of_its_own() -> None:
    """A module-level tuple of cause names is a cause group: it belongs in the file."""
    pattern = re.compile(r"^[A-Z_]+ = \(([^)]*)\)", re.MULTILINE)
    for path in sorted(DIAGNOSE.glob("*.py")):
        for m in pattern.finditer(path.read_text()):
            names = set(re.findall(r'"([a-z_]+)"', m[1]))
            assert not names & (set(CAUSES) - {"unknown"}), f"{path.name}: {m[0][:80]}"
