"""The labelled case corpus: every case in analyzer/cases/<name>/ must be diagnosed as its label says.

A case is a folder of logs plus `label.json` (see analyzer/cases/README.md). `analyze_paths` runs on every
file of the folder except label.json; the test compares cause, first_failing_rank, first_failing_host (a
null in the label requires a null answer) and the optional keys. Folders named `lab-*` come from real failures
on the local cluster and are checked the same way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
CASES_DIR = REPO / "analyzer" / "cases"
CAUSES_TOML = REPO / "analyzer" / "causes.toml"
LABEL_KEYS = {"cause", "first_failing_rank", "first_failing_host", "source", "description"}
#: Optional keys that the corpus test checks; other keys (lab metadata such as `injected`, `job`) are kept as notes.
OPTIONAL_KEYS = {"confidence_at_least", "exclude_nodes", "retry", "rank_observable", "pending"}
CONFIDENCE_ORDER = {"low": 0, "medium": 1, "high": 2}
RETRY_VALUES = {"requeue", "stop", "unknown"}
ROLE_VALUES = {"culprit", "victim", "ok", "unknown"}

#: DESIGN.md's vocabulary, used only when analyzer/causes.toml does not exist.
DESIGN_CAUSES = (
    "network_unreachable", "port_in_use", "rendezvous_timeout", "rank_config_mismatch", "stale_rendezvous_state",
    "wrong_interface", "infiniband_error", "nccl_version_mismatch", "duplicate_gpu", "cuda_oom", "host_oom",
    "gpu_hardware", "collective_timeout", "collective_mismatch", "user_code_exception", "unused_parameters",
    "slurm_time_limit", "slurm_cancelled", "preempted", "node_failure", "shm_error", "dataloader_worker_killed",
    "nccl_internal_error", "segfault", "unknown",
)


def vocabulary() -> list[str]:
    """The cause names: the tables of analyzer/causes.toml, else DESIGN.md's list."""
    if CAUSES_TOML.is_file():
        return list(tomllib.loads(CAUSES_TOML.read_text()))
    return list(DESIGN_CAUSES)


def case_dirs() -> list[Path]:
    return sorted(p for p in CASES_DIR.iterdir() if p.is_dir() and (p / "label.json").is_file())


def case_files(case: Path) -> list[Path]:
    """Every file of a case except its label, in a stable order."""
    return sorted(p for p in case.rglob("*") if p.is_file() and p.name != "label.json")


def load_label(case: Path) -> dict[str, Any]:
    return json.loads((case / "label.json").read_text())


CASES = case_dirs()


def _explain(label: dict[str, Any], got: dict[str, Any]) -> str:
    """Expected vs got, with the diagnosis summary and its evidence, for a failing case."""
    keys = ("cause", "first_failing_rank", "first_failing_host", "confidence", "retry", "exclude_nodes")
    lines = ["expected vs got:"]
    for key in keys:
        want = label.get(key, "-") if key != "confidence" else label.get("confidence_at_least", "-")
        lines.append(f"  {key:20} {want!r:28} {got.get(key)!r}")
    lines.append(f"summary: {got.get('summary')}")
    for ev in got.get("evidence", [])[:6]:
        lines.append(f"  evidence {ev.get('file')}:{ev.get('line')} rank={ev.get('rank')}: {str(ev.get('text'))[:160]}")
    lines.append(f"case: {label.get('description')}")
    return "\n".join(lines)


def test_there_are_cases() -> None:
    assert len(CASES) >= 25, f"only {len(CASES)} cases under {CASES_DIR}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_label_is_valid(case: Path) -> None:
    label = load_label(case)
    causes = set(vocabulary())
    missing = LABEL_KEYS - set(label)
    assert not missing, f"label.json lacks {sorted(missing)}"
    assert label["cause"] in causes, f"cause {label['cause']!r} is not in the vocabulary"
    rank = label["first_failing_rank"]
    assert rank is None or (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0), f"bad rank {rank!r}"
    host = label["first_failing_host"]
    assert host is None or (isinstance(host, str) and host), f"bad host {host!r}"
    assert isinstance(label["source"], str) and label["source"].strip(), "source must say where the format comes from"
    assert isinstance(label["description"], str) and label["description"].strip()
    if "confidence_at_least" in label:
        assert label["confidence_at_least"] in CONFIDENCE_ORDER
    if "retry" in label:
        assert label["retry"] in RETRY_VALUES
    if "rank_observable" in label:
        assert label["rank_observable"] is False, "rank_observable is only ever set to false"
        assert "rank_observable_why" in label, "say why the logs cannot name the culprit"
    if "exclude_nodes" in label:
        assert isinstance(label["exclude_nodes"], list) and all(isinstance(n, str) for n in label["exclude_nodes"])
    if "pending" in label:
        assert label["pending"] is True, "pending is only ever set to true (remove the key once the engine passes)"
    assert case_files(case), "a case needs at least one log file besides label.json"


def test_every_cause_has_a_case() -> None:
    covered = {load_label(c)["cause"] for c in CASES}
    missing = [c for c in vocabulary() if c not in covered]
    assert not missing, f"causes without a case: {missing}"


def _null_answer_known_failures() -> dict[str, str]:
    """Cases whose null label host the analyzer does not answer with null yet: the `<case> original  # reason`
    lines of perturbation_known_failures.txt (strict xfails; delete a line when its case passes)."""
    path = Path(__file__).resolve().parent / "perturbation_known_failures.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    return {line.split()[0]: line.partition("#")[2].strip() for line in lines if line.split()[1:2] == ["original"]}


NULL_ANSWER_KNOWN_FAILURES = _null_answer_known_failures()


def _diagnosis_params(cases: list[Path]) -> list[Any]:
    """Each case as a test parameter; a label with `"pending": true` (a real case the engine does not read right
    yet, see analyzer/cases/README.md) runs as a non-strict xfail, so it reports but does not fail CI."""
    params = []
    for case in cases:
        label = load_label(case)
        marks = []
        if label.get("pending") is True:
            why = label.get("pending_why", "engine does not diagnose this real case yet")
            marks.append(pytest.mark.xfail(strict=False, reason=f"pending: {why}"))
        elif case.name in NULL_ANSWER_KNOWN_FAILURES:
            marks.append(pytest.mark.xfail(strict=True, reason=NULL_ANSWER_KNOWN_FAILURES[case.name]))
        params.append(pytest.param(case, marks=marks, id=case.name))
    return params


@pytest.mark.parametrize("case", _diagnosis_params(CASES))
def test_case_is_diagnosed(case: Path) -> None:
    from ddpslurm.analyze.api import analyze_paths

    label = load_label(case)
    got = analyze_paths(case_files(case)).to_dict()
    why = _explain(label, got)
    assert got["cause"] == label["cause"], why
    if label.get("rank_observable", True):
        assert got["first_failing_rank"] == label["first_failing_rank"], why
        # a null host means the logs single out no host: the analyzer must answer null too, never guess one
        assert got["first_failing_host"] == label["first_failing_host"], why
    else:  # the true culprit is known from the injection, but nothing in the logs names it: never guess another
        assert got["first_failing_rank"] in (None, label["first_failing_rank"]), why
        assert got["first_failing_host"] in (None, label["first_failing_host"]), why
    if "confidence_at_least" in label:
        assert CONFIDENCE_ORDER[got["confidence"]] >= CONFIDENCE_ORDER[label["confidence_at_least"]], why
    if "retry" in label:
        assert got["retry"] == label["retry"], why
    if "exclude_nodes" in label:
        assert sorted(got["exclude_nodes"]) == sorted(label["exclude_nodes"]), why


def validate_schema(obj: dict[str, Any], causes: set[str]) -> list[str]:
    """Problems with a `ddpslurm analyze --json` object against DESIGN.md's schema (empty list = valid)."""
    problems: list[str] = []
    expected = {"schema_version", "cause", "first_failing_rank", "first_failing_host", "confidence", "summary",
                "advice", "evidence", "ranks", "retry", "exclude_nodes", "skipped", "notes"}
    optional = {"run"}  # only where the attempt restarted in place, or a restart was asked for
    if not expected <= set(obj) <= expected | optional:
        problems.append(f"keys differ: missing {sorted(expected - set(obj))}, "
                        f"extra {sorted(set(obj) - expected - optional)}")
        return problems
    if "run" in obj:
        problems.extend(_run_problems(obj["run"]))
    if obj["schema_version"] != 1:
        problems.append(f"schema_version {obj['schema_version']!r}, want 1")
    if not (isinstance(obj["notes"], list) and all(isinstance(n, str) for n in obj["notes"])):
        problems.append("notes must be a list of strings")
    if obj["cause"] not in causes | {"none"}:
        problems.append(f"cause {obj['cause']!r} not in vocabulary")
    if not (obj["first_failing_rank"] is None or type(obj["first_failing_rank"]) is int):
        problems.append("first_failing_rank must be int or null")
    if not (obj["first_failing_host"] is None or isinstance(obj["first_failing_host"], str)):
        problems.append("first_failing_host must be str or null")
    if obj["confidence"] not in CONFIDENCE_ORDER:
        problems.append(f"confidence {obj['confidence']!r}")
    if not isinstance(obj["summary"], str) or not obj["summary"].strip():
        problems.append("summary must be a non-empty string")
    if not (isinstance(obj["advice"], list) and all(isinstance(a, str) for a in obj["advice"])):
        problems.append("advice must be a list of strings")
    if obj["retry"] not in RETRY_VALUES:
        problems.append(f"retry {obj['retry']!r}")
    if not (isinstance(obj["exclude_nodes"], list) and all(isinstance(n, str) for n in obj["exclude_nodes"])):
        problems.append("exclude_nodes must be a list of strings")
    if not (isinstance(obj["skipped"], list) and all(isinstance(s, dict) and set(s) == {"path", "reason"} and
                                                      all(isinstance(v, str) for v in s.values())
                                                      for s in obj["skipped"])):
        problems.append("skipped must be a list of {path, reason} strings")
    if not isinstance(obj["evidence"], list):
        problems.append("evidence must be a list")
    else:
        for ev in obj["evidence"]:
            if not isinstance(ev, dict) or set(ev) != {"file", "line", "rank", "time", "text"}:
                problems.append(f"evidence item has keys {sorted(ev) if isinstance(ev, dict) else ev!r}")
                continue
            if not isinstance(ev["file"], str) or not isinstance(ev["text"], str):
                problems.append("evidence file/text must be strings")
            if not (ev["line"] is None or type(ev["line"]) is int):
                problems.append("evidence line must be int or null")
            if not (ev["rank"] is None or type(ev["rank"]) is int):
                problems.append("evidence rank must be int or null")
            if not (ev["time"] is None or isinstance(ev["time"], str)):
                problems.append("evidence time must be str or null")
    if not isinstance(obj["ranks"], list):
        problems.append("ranks must be a list")
    else:
        for row in obj["ranks"]:
            if not isinstance(row, dict) or set(row) != {"rank", "host", "role", "first_error"}:
                problems.append(f"ranks row has keys {sorted(row) if isinstance(row, dict) else row!r}")
                continue
            if type(row["rank"]) is not int:
                problems.append("ranks[].rank must be int")
            if row["role"] not in ROLE_VALUES:
                problems.append(f"ranks[].role {row['role']!r}")
            if not (row["host"] is None or isinstance(row["host"], str)):
                problems.append("ranks[].host must be str or null")
            if not (row["first_error"] is None or isinstance(row["first_error"], str)):
                problems.append("ranks[].first_error must be str or null")
    return problems


def _run_problems(run: Any) -> list[str]:
    """Problems with `--json`'s `run`: which attempt and in-place restart the diagnosis is of."""
    if not isinstance(run, dict) or set(run) != {"attempt", "restart", "restarts", "final_restart"}:
        return [f"run has keys {sorted(run) if isinstance(run, dict) else run!r}"]
    problems = []
    for key in ("attempt", "restart"):
        if not (run[key] is None or run[key] == "all" or (type(run[key]) is int and run[key] >= 0)):
            problems.append(f"run.{key} must be a number, 'all' or null")
    if not (isinstance(run["restarts"], list) and all(type(k) is int and k >= 0 for k in run["restarts"])):
        problems.append("run.restarts must be a list of numbers")
    if not (run["final_restart"] is None or type(run["final_restart"]) is int):
        problems.append("run.final_restart must be a number or null")
    return problems


def _valid(**changes: Any) -> dict[str, Any]:
    obj = {"schema_version": 1, "cause": "unknown", "first_failing_rank": None, "first_failing_host": None,
           "confidence": "low", "summary": "s", "advice": [], "evidence": [], "ranks": [], "retry": "stop",
           "exclude_nodes": [], "skipped": [], "notes": []}
    return {**obj, **changes}


def test_schema_validator_accepts_a_valid_object() -> None:
    assert validate_schema(_valid(), set(vocabulary())) == []
    assert validate_schema(_valid(cause="none"), set(vocabulary())) == []
    run = {"attempt": 0, "restart": 2, "restarts": [0, 1, 2], "final_restart": 2}
    assert validate_schema(_valid(run=run), set(vocabulary())) == []
    assert validate_schema(_valid(run={**run, "restart": "all", "attempt": "all"}), set(vocabulary())) == []


@pytest.mark.parametrize(("obj", "problem"), [
    ({"cause": "cuda_oom"}, "keys differ"),
    (_valid(cause="made_up"), "not in vocabulary"),
    (_valid(first_failing_rank="3"), "first_failing_rank"),
    (_valid(confidence="sure"), "confidence"),
    (_valid(ranks=[{"rank": 0, "host": None, "role": "boss", "first_error": None}], retry="maybe"), "retry"),
    (_valid(schema_version=2), "schema_version"),
    (_valid(notes=[3]), "notes"),
    (_valid(attempts=[0]), "keys differ"),
    (_valid(run={"attempt": 0}), "run has keys"),
    (_valid(run={"attempt": "last", "restart": 0, "restarts": [0], "final_restart": 0}), "run.attempt"),
    (_valid(run={"attempt": 0, "restart": 0, "restarts": ["0"], "final_restart": 0}), "run.restarts"),
])
def test_schema_validator_rejects(obj: dict[str, Any], problem: str) -> None:
    """The validator used by the CLI test must itself catch wrong objects."""
    assert any(problem in p for p in validate_schema(obj, set(vocabulary())))


CLI_CASES = [c for c in CASES if c.name.split("-")[0] in {"cuda", "host", "collective"}][:3] + \
            [c for c in CASES if c.name.startswith("unknown-truncated")]


def _cli_has_analyze() -> bool:
    out = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "--help"], capture_output=True, text=True, timeout=60)
    return re.search(r"^\s+analyze\b", out.stdout, re.M) is not None


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.name for c in CLI_CASES])
def test_cli_json_schema(case: Path) -> None:
    if not _cli_has_analyze():
        pytest.fail("`ddpslurm analyze` is not wired into the CLI yet")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    files = [str(f) for f in case_files(case)]
    proc = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", *files, "--json"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    obj = json.loads(proc.stdout)
    problems = validate_schema(obj, set(vocabulary()))
    assert not problems, "\n".join(problems)
    assert obj["cause"] == load_label(case)["cause"], _explain(load_label(case), obj)
