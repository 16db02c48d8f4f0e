"""Perturbation tests: every labelled case, perturbed in ways that keep its meaning, must be diagnosed the same.

For each (case, perturbation) of tests/corpus/perturb.py the expectation is the case's ORIGINAL label mapped
through the perturbation (renamed host, renumbered rank); a null rank or host in the label requires null. A rule
that passes only because it was written for one case's ranks, hosts, clocks or file layout fails here.
Today's failures are listed in perturbation_known_failures.txt (`case perturbation  # reason`) and run as strict
xfails: a fix shows up as XPASS and its line must go. The pairs of a pending case (label `"pending": true`, not
diagnosed right even unperturbed) run as non-strict xfails, as in test_cases.py.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path, PurePath
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

#: Cases whose culprit only the clocks tell (their label's description orders failures by time and nothing else
#: names the rank): without timestamps the analyzer may answer null for them, never another rank. Decided from
#: every description: none relies on time alone today (the one that cites the earliest exit record also has the
#: rank's own exception), so drop_timestamps requires the same rank everywhere.
RELIES_ON_TIME: frozenset[str] = frozenset()


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
    if name in ("merge_ranks", "interleave_ranks"):
        tasks = {n for n in names if perturb._FILE_TASK.match(n)}
        ranks = {n for n in names if perturb._FILE_RANK.match(n) and not n.endswith(".json")}
        return len({perturb._task_of(PurePath(n)) for n in tasks or ranks}) >= 2  # one task's .out/.err: one
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


def perturbed(case: Path, name: str, tmp_path: Path) -> perturb.Perturbed:
    """The case's copy under `tmp_path` with perturbation `name` applied; the test skipped where it does not apply."""
    facts = perturb.load_facts(case, original_diagnosis(case))
    try:
        return perturb.PERTURBATIONS[name](facts, tmp_path / case.name)
    except perturb.Unsupported as why:
        pytest.skip(f"{name} unsupported for {case.name}: {why}")


@pytest.mark.parametrize(("case", "name"), _params())
def test_diagnosis_is_invariant(case: Path, name: str, tmp_path: Path) -> None:
    from ddpslurm.analyze.api import analyze_paths

    want = perturbed(case, name, tmp_path)
    got = analyze_paths(_files(want.root), workers=1).to_dict()
    lenient = want.rank_may_be_null and case.name in RELIES_ON_TIME
    problems = mismatches(want, got, lenient_rank=lenient, host_named=host_is_named(want))
    assert not problems, _explain(want, got, problems)


def _every_pair() -> list[Any]:
    return [pytest.param(case, name, id=f"{case.name}:{name}") for case in CASES for name in perturb.PERTURBATIONS
            if applies(case, name)]


@pytest.mark.parametrize(("case", "name"), _every_pair())
def test_a_perturbed_case_is_diagnosed_alike_by_the_compiled_and_the_pure_scanner(case: Path, name: str,
                                                                                    tmp_path: Path) -> None:
    """The pure-Python scanner is the compiled one's reference (issue 48): on every perturbed copy, the known
    failures' and the pending cases' too, both give the same diagnosis, evidence lines included."""
    from ddpslurm.analyze.api import analyze_paths
    from ddpslurm.analyze.read.bulk import BULK
    from tests.unit.test_bulk_scan import pure_path

    if BULK is None:
        pytest.skip("the compiled scanner is not built in this checkout")
    want = perturbed(case, name, tmp_path)
    compiled = analyze_paths(_files(want.root), workers=1).to_dict()
    with pure_path():
        pure = analyze_paths(_files(want.root), workers=1).to_dict()
    assert compiled == pure


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
    """Every line of the known-failures list names an existing case and a perturbation that applies to it."""
    cases = {c.name: c for c in CASES}
    stale = [f"{c} {p}" for c, p in KNOWN if c not in cases or (p not in perturb.PERTURBATIONS and p != "original")
             or (p != "original" and not applies(cases[c], p))]
    assert not stale, f"{KNOWN_FAILURES.name} names unknown pairs: {stale}"


def test_known_failures_parser_rejects_bad_lines(tmp_path: Path) -> None:
    bad = tmp_path / "known.txt"
    bad.write_text("only-a-case  # reason\n")
    with pytest.raises(ValueError, match="expected `case perturbation"):
        load_known_failures(bad)
    good = tmp_path / "good.txt"
    good.write_text("# comment\n\ncase-a rename_hosts  # why it fails\n")
    assert load_known_failures(good) == {("case-a", "rename_hosts"): "why it fails"}



# ---------------------------------------------------------------- the rewriters themselves, one format per row

#: Nodes 1..3 reversed on a 4-node x 2 job: ranks 2,3 <-> 6,7; 4,5 stay; node 0 (ranks 0,1) stays.
FOUR_BY_TWO = perturb.rank_permutation(perturb.RankLayout(world=8, per_node=2, tasks_are_nodes=False, local_only=""))


@pytest.mark.parametrize(("line", "labelled", "expected"), [
    ("[1,3]<stdout>:loss 2.0", False, "[1,7]<stdout>:loss 2.0"),
    ("[rank3]:[E0217 08:19:10.679000 ProcessGroupNCCL.cpp:1] [PG 0 Rank 3] x", False,
     "[rank7]:[E0217 08:19:10.679000 ProcessGroupNCCL.cpp:1] [PG 0 Rank 7] x"),
    ("3: [rank3]: Traceback", True, "7: [rank7]: Traceback"),
    (" 3: text", True, " 7: text"),
    ("srun: error: node02: tasks 2-3: Exited with exit code 1", False,
     "srun: error: node02: tasks 6-7: Exited with exit code 1"),
    ("srun: error: node02: tasks 1-2: Killed", False, "srun: error: node02: tasks 1,6: Killed"),
    ("h:1:2 [0] NCCL INFO comm 0x1 rank 2 nranks 8 cudaDev 0 - Init COMPLETE", False,
     "h:1:2 [0] NCCL INFO comm 0x1 rank 6 nranks 8 cudaDev 0 - Init COMPLETE"),
    ("NCCL INFO Channel 00/0 : 1[1] -> 2[0] via NET/IB/0", False, "NCCL INFO Channel 00/0 : 1[1] -> 6[0] via NET/IB/0"),
    ("NCCL INFO Channel 00/02 :    0   1   2   3", False, "NCCL INFO Channel 00/02 :    0   1   6   7"),
    ("NCCL INFO Trees [0] 3/-1/-1->2->1 [1] 3/-1/-1->2->1", False,
     "NCCL INFO Trees [0] 7/-1/-1->6->1 [1] 7/-1/-1->6->1"),
    ("RuntimeError: [Rank 0]: Ranks 2, 3 failed to pass monitoredBarrier", False,
     "RuntimeError: [Rank 0]: Ranks 6, 7 failed to pass monitoredBarrier"),
    ('"rank": 3,', False, '"rank": 7,'),
    ("  rank      : 3 (local_rank: 1)", False, "  rank      : 7 (local_rank: 1)"),
    ("store based barrier on rank: 2, for key: store_based_barrier_key:1 (world_size=8", False,
     "store based barrier on rank: 6, for key: store_based_barrier_key:1 (world_size=8"),
    ("wait timeout after 15000ms, keys: /default_pg/0//cpu//0/3", False,
     "wait timeout after 15000ms, keys: /default_pg/0//cpu//0/7"),
    ("JobEnvironment(job_id=1, hostname=h, local_rank=1(2), node=1(4), global_rank=3(8))", False,
     "JobEnvironment(job_id=1, hostname=h, local_rank=1(2), node=3(4), global_rank=7(8))"),
    ("torchrun --nnodes=4 --node-rank=1 --nproc-per-node=2", False,
     "torchrun --nnodes=4 --node-rank=3 --nproc-per-node=2"),
    ("Invalid rank 9 (world size 8)", False, "Invalid rank 9 (world size 8)"),  # outside the job: kept
])
def test_rank_rewriter_reads_every_format(line: str, labelled: bool, expected: str) -> None:
    assert perturb.rewrite_rank_line(line, FOUR_BY_TWO, labelled) == expected


def test_local_rank_without_its_node_is_refused_when_locals_change() -> None:
    two_nodes = perturb.rank_permutation(perturb.RankLayout(world=8, per_node=4, tasks_are_nodes=True, local_only="x"))
    assert perturb.rewrite_rank_line("1: [default1]:[rank5]: x", two_nodes, True) == "1: [default2]:[rank6]: x"
    with pytest.raises(perturb.Unsupported, match="local rank whose node"):
        perturb.rewrite_rank_line("failed (exitcode: 1) local_rank: 1 (pid: 7) of binary", two_nodes, False)


def test_agent_lines_tell_workers_per_node_and_a_local_rank_its_node() -> None:
    agent = ["W1223 05:17:58.996000 3304089 torch/distributed/elastic/multiprocessing/api.py:897] Sending process "
             f"{pid} closing signal SIGTERM" for pid in (11, 12, 13)]
    agent.append("E1223 05:18:01.313000 3304089 torch/distributed/elastic/multiprocessing/api.py:869] failed "
                 "(exitcode: -11) local_rank: 0 (pid: 10) of binary: /usr/bin/python")
    assert perturb.agent_workers_per_node(["\n".join(agent)]) == 4
    two_nodes = perturb.rank_permutation(perturb.RankLayout(world=8, per_node=4, tasks_are_nodes=True, local_only="x"))
    writers = perturb.Writers(pid_ranks={10: 4})  # ChildFailedError: rank 4 (local_rank 0) was pid 10
    assert "local_rank: 3 (pid: 10)" in perturb.rewrite_rank_line(agent[-1], two_nodes, False, writers=writers)


@pytest.mark.parametrize(("line", "expected"), [
    ("[W1122 18:19:53.247426079 socket.cpp:207] x", "[W0102 01:19:53.247426079 socket.cpp:207] x"),
    ("[E217 08:19:10.679000 1 ProcessGroupNCCL.cpp:1] x", "[E328 15:19:10.679000 1 ProcessGroupNCCL.cpp:1] x"),
    ("submitit INFO (2023-06-06 13:00:00,000) - Starting", "submitit INFO (2023-07-16 20:00:00,000) - Starting"),
    ("[2024-05-08T08:47:31.1234567Z] x", "[2024-06-17T15:47:31.1234567Z] x"),
    ("time      : 2024-12-30_12:00:00", "time      : 2025-02-08_19:00:00"),
    ("Starting at Tue Oct 15 02:00:11 UTC 2024 on gpu07", "Starting at Sun Nov 24 09:00:11 UTC 2024 on gpu07"),
    ("Mar 02 03:14:05 gpu-d07 kernel: x", "Apr 11 10:14:05 gpu-d07 kernel: x"),
    (' "unix": 1795371593.9708886,', ' "unix": 1798852793.9708886,'),
    ('  "timestamp": "1700000000"', '  "timestamp": "1703481200"'),
])
def test_clock_shift_reads_every_format(line: str, expected: str) -> None:
    assert perturb.shift_line(line, perturb.CLOCK_SHIFT, 2024) == expected


def test_clock_skew_carries_into_the_second() -> None:
    assert perturb.shift_line("2024-05-08 08:47:31.900 x", 0.25, 2024) == "2024-05-08 08:47:32.150 x"


@pytest.mark.parametrize(("line", "expected"), [
    ("[W1122 18:19:53.247426079 socket.cpp:207] x", "[W socket.cpp:207] x"),
    ("submitit INFO (2023-06-06 13:00:00,000) - Starting", "submitit INFO Starting"),
    ("[2024-05-08T08:47:31.1234567Z] 0c41 || x", "0c41 || x"),
    ("Mar 02 03:14:05 gpu-d07 kernel: x", "gpu-d07 kernel: x"),
    ("slurmstepd: error: *** STEP 1.0 ON n1 CANCELLED AT 2024-05-08T08:47:31 ***",
     "slurmstepd: error: *** STEP 1.0 ON n1 CANCELLED AT 2024-05-08T08:47:31 ***"),  # message content, kept
])
def test_drop_timestamps_strips_every_format(line: str, expected: str) -> None:
    assert perturb.drop_line_times(line) == expected


def test_host_map_is_consistent_and_rewrites_hostlists() -> None:
    hmap = perturb.host_map({"lab-n01", "lab-n03", "gpu07"})
    assert len({hmap("lab-n01"), hmap("lab-n03"), hmap("gpu07")}) == 3
    assert all(len(hmap(h)) != len(h) for h in ("lab-n01", "gpu07"))
    pattern = perturb._hostlist_pattern(hmap)
    assert pattern is not None
    new_stem = hmap("lab-n01")[:-2]
    assert pattern.sub(lambda m: perturb._rewrite_hostlist(hmap, m), "nodes=lab-n[01-03]") == f"nodes={new_stem}[18-20]"
    fqdn = perturb.host_map({"lab-n01"}, ".x.org")
    assert fqdn("lab-n01.") == fqdn("lab-n01") + "."


# ---------------------------------------------------------------- the benign-line library

def test_benign_library_has_its_families_with_sources() -> None:
    """tests/corpus/benign/: every family file says where its lines come from, and holds records."""
    records = perturb.load_benign_library()
    families = {r.family for r in records}
    for path in sorted(perturb.BENIGN_DIR.glob("*.txt")):
        assert path.read_text().startswith("# "), f"{path.name} must start with its sources"
        assert path.stem in families, f"{path.name} holds no record"
    assert 150 <= len(records) <= 300
    assert all(r.writer in ("", "store-host", "torchrun-agent") for r in records)


@pytest.mark.parametrize(("record", "expected"), [
    (("gpu-a01:48211:48211 [0] NCCL INFO Connected all rings",),
     ["5: node07:900:900 [1] NCCL INFO Connected all rings"]),
    (("[W socket.cpp:663] [c10d] The client socket has failed to connect to [gpu-a00]:29500 (errno: 111 - "
      "Connection refused).",),
     ["5: [W socket.cpp:663] [c10d] The client socket has failed to connect to [node01]:29500 (errno: 111 - "
      "Connection refused)."]),
    (("[rank0]:[W508 08:47:31.247426079 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 0]  using GPU 0",),
     ["5: [rank5]:[W508 10:00:00.247426079 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 5]  using GPU 0"]),
    (("2024-05-08 08:47:31,204 WARNING metrics upload failed, retrying in 10 s",),
     ["5: 2024-05-08 10:00:00,204 WARNING metrics upload failed, retrying in 10 s"]),
    (("submitit INFO (2024-05-08 08:47:31,204) - Loading pickle: /j/1_submitted.pkl",), None),  # not a submitit job
])
def test_benign_record_reads_as_the_rank_s_own_line(record: tuple[str, ...], expected: list[str] | None) -> None:
    import datetime as dt

    stream = perturb._Stream(("rank", 5), 5, "node07", [0], head="node07:900:900 [1]")
    ctx = {"rank_hosts": {0: "node01", 5: "node07"}, "launchers": set(), "year": 2024}
    when = (dt.datetime(2024, 5, 8, 10, 0, 0, tzinfo=dt.timezone.utc).timestamp(), True)  # the line before's
    got = perturb._adapt_record(perturb.BenignRecord("t", record), stream, "5: ", when, ctx)
    assert got == expected


def test_benign_library_is_deterministic_and_splits_no_block(tmp_path: Path) -> None:
    case = CASES_DIR / "lab-collective_timeout-1"
    facts = perturb.load_facts(case, original_diagnosis(case))
    manifests: list[list[dict[str, Any]]] = [[], []]
    for k in (0, 1):
        perturb.benign_library(facts, tmp_path / f"copy{k}", n=6, manifest=manifests[k])
    assert manifests[0] == manifests[1] and manifests[0]
    for rel in facts.files:
        if perturb.is_record(rel):
            assert (tmp_path / "copy0" / rel).read_bytes() == (case / rel).read_bytes()
    for entry in manifests[0]:
        if entry["part"] == 0:  # a record's first line never lands inside a traceback of the case
            lines = (tmp_path / "copy0" / entry["file"]).read_text().split("\n")
            before = [ln for ln in lines[: entry["line"] - 1] if ln.strip()]
            assert not before or not before[-1].rstrip().endswith(":") or before[-1] in entry.get("text", "")
