"""`ddpslurm triage`: many job folders -> rows, counts by cause, the node table and the drain list."""

from __future__ import annotations

import csv as csvlib
import json
import os
import pty
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from ddpslurm.errors import UsageError
from ddpslurm.triage import (
    COLUMNS,
    analyze_jobs,
    job_folders,
    job_ids,
    merge_accounting,
    node_table,
    parse_sacct_users,
    parse_since,
    render_text,
    summary,
)

REPO = Path(__file__).resolve().parents[2]
LAB = sorted(p for p in (REPO / "analyzer" / "cases").glob("lab-*") if (p / "label.json").is_file())
#: a plain Slurm output file (srun --label) whose rank 9 on host a2 fails: cause dataloader_worker_killed
SLURM_OUT = REPO / "analyzer" / "cases" / "dataloader-worker-killed-rank9-torch23-srun-label" / "slurm-61004.out"


def ddpslurm(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


def row(job: str, cause: str, host: str | None, nodes: list[str], exclude: list[str] | None = None) -> dict:
    return {**dict.fromkeys(COLUMNS), "job": job, "path": job, "cause": cause, "first_failing_host": host,
            "nodes": nodes, "exclude_nodes": exclude or [], "reason": ""}


@pytest.fixture(scope="module")
def lab_triage(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """`ddpslurm triage analyzer/cases/lab-* --json --csv FILE`, run once for the module."""
    csv = tmp_path_factory.mktemp("triage") / "rows.csv"
    done = ddpslurm("triage", *map(str, LAB), "--json", "--csv", str(csv), "--no-sacct")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), csv


def test_every_lab_case_is_one_row_with_its_labelled_cause(lab_triage: tuple[dict, Path]) -> None:
    result, _ = lab_triage
    assert result["job_count"] == len(LAB) == len(result["jobs"])
    assert result["rows"] == result["jobs"]  # `rows`: the deprecated alias older scripts read
    assert [r["job"] for r in result["jobs"]] == [c.name for c in LAB]
    labels = {c.name: json.loads((c / "label.json").read_text()) for c in LAB}
    wrong = {r["job"]: r["cause"] for r in result["jobs"]
             if r["cause"] != labels[r["job"]]["cause"] and not labels[r["job"]].get("pending")}
    assert wrong == {}
    assert result["by_cause"] == dict(Counter(r["cause"] for r in result["jobs"]))
    assert list(result["by_cause"].values()) == sorted(result["by_cause"].values(), reverse=True)


def test_the_csv_loads_in_pandas_with_one_row_per_job(lab_triage: tuple[dict, Path]) -> None:
    result, csv = lab_triage
    table = pd.read_csv(csv)
    assert list(table.columns) == list(COLUMNS)
    assert len(table) == len(LAB) and table["job"].is_unique
    first = result["jobs"][0]
    assert table.loc[0, "nodes"] == " ".join(first["nodes"]) and table.loc[0, "cause"] == first["cause"]


def test_the_node_table_counts_jobs_and_blames_from_the_rows(lab_triage: tuple[dict, Path]) -> None:
    result, _ = lab_triage
    for node in result["nodes"]:
        ran = [r for r in result["jobs"] if node["node"] in r["nodes"]]
        blamed = [r for r in result["jobs"]
                  if node["node"] in {r["first_failing_host"], *r["exclude_nodes"]}]
        assert (node["jobs"], node["blamed"]) == (len(ran), len(blamed))
        assert node["causes"] == dict(Counter(r["cause"] for r in blamed))
    order = [(-n["blamed"], -n["jobs"], n["node"]) for n in result["nodes"]]
    assert order == sorted(order)


def test_node_table_worst_first_and_drain_only_for_node_level_causes() -> None:
    rows = [row("j1", "user_code_exception", "n2", ["n1", "n2"]),
            row("j2", "user_code_exception", "n2", ["n2", "n3"]),
            row("j3", "gpu_hardware", "n3", ["n3", "n4"], exclude=["n3"]),
            row("j4", "infiniband_error", "n4", ["n4"]),
            row("j5", "collective_timeout", None, ["n1", "n5"])]
    result = summary(rows)
    assert [(n["node"], n["jobs"], n["blamed"]) for n in result["nodes"]] == [
        ("n2", 2, 2), ("n3", 2, 1), ("n4", 2, 1), ("n1", 2, 0), ("n5", 1, 0)]
    assert result["nodes"][0]["causes"] == {"user_code_exception": 2}
    assert result["drain"] == ["n3", "n4"]
    assert result["by_cause"] == {"user_code_exception": 2, "collective_timeout": 1, "gpu_hardware": 1,
                                  "infiniband_error": 1}
    assert node_table(pd.DataFrame(rows, columns=list(COLUMNS)))["node"].tolist()[:1] == ["n2"]


def test_a_folder_of_job_folders_is_its_jobs_and_a_job_folder_is_itself(tmp_path: Path) -> None:
    root = tmp_path / "ddpslurm_jobs"
    for name in ("job_12", "job_7"):
        (root / name / "attempt_0").mkdir(parents=True)
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "slurm-5.out").write_text("hello\n")
    missing = tmp_path / "gone"
    assert job_folders([root, tmp_path / "single", missing, root / "job_7"]) == [
        root / "job_12", root / "job_7", tmp_path / "single", missing]


def test_unreadable_jobs_are_rows_with_cause_unknown_and_the_reason(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    (root / "job_1" / "attempt_0").mkdir(parents=True)  # no logs at all
    (root / "job_2").mkdir()
    (root / "job_2" / "1_0_log.out").write_bytes(b"\x00\x01\x02binary\x00" * 100)
    rows = analyze_jobs([root / "job_1", root / "job_2", tmp_path / "nowhere"], workers=2)
    assert [(r["job"], r["cause"]) for r in rows] == [("job_1", "unknown"), ("job_2", "unknown"),
                                                     ("nowhere", "unknown")]
    assert all(r["reason"] for r in rows)
    assert "no log files" in rows[0]["reason"] and "nowhere" in rows[2]["reason"]
    assert rows[0]["job_id"] == "1"
    done = ddpslurm("triage", str(root), str(tmp_path / "nowhere"), "--no-sacct")
    assert done.returncode == 0, done.stderr
    assert "3 job(s) analyzed, 3 could not be read" in done.stdout and "Traceback" not in done.stderr


def test_since_keeps_jobs_submitted_at_or_after_the_date(tmp_path: Path) -> None:
    for name, when in (("job_1", "2026-11-01T00:00:00+00:00"), ("job_2", "2026-11-20T12:00:00+00:00")):
        (tmp_path / name).mkdir()
        stamp = parse_since(when)
        (tmp_path / name / "ddpslurm.json").write_text(json.dumps({"job_id": name[4:], "submit_unix": stamp}))
    done = ddpslurm("triage", str(tmp_path), "--since", "2026-11-20", "--json", "--no-sacct")
    assert done.returncode == 0, done.stderr
    assert [r["job"] for r in json.loads(done.stdout)["jobs"]] == ["job_2"]
    bad = ddpslurm("triage", str(tmp_path), "--since", "last tuesday")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "is not a date" in bad.stderr


@pytest.mark.parametrize(("text", "ok"), [("2026-11-20", True), ("2026-11-20T08:00", True),
                                          ("2026-11-20T08:00:00Z", True), ("yesterday", False), ("", False)])
def test_parse_since(text: str, ok: bool) -> None:
    if ok:
        assert parse_since(text) == pd.Timestamp(text, tz="UTC").timestamp()
    else:
        with pytest.raises(UsageError):
            parse_since(text)


def test_sacct_users_are_merged_only_where_the_nodes_agree() -> None:
    known = parse_sacct_users("101|alice|gpu|node[01-02]\n101.batch||gpu|node01\n102|bob|cpu|other[1-2]\n"
                              "103|carol||None assigned\nnot|a|line\n")
    assert known == {"101": {"user": "alice", "partition": "gpu", "nodes": ["node01", "node02"]},
                     "102": {"user": "bob", "partition": "cpu", "nodes": ["other1", "other2"]},
                     "103": {"user": "carol", "partition": None, "nodes": []}}
    rows = [{**row("a", "cuda_oom", None, ["node02"]), "job_id": "101"},
            {**row("b", "cuda_oom", None, ["node01"]), "job_id": "102"},
            {**row("c", "cuda_oom", None, ["x"]), "job_id": "103", "partition": "from-json"}]
    merge_accounting(rows, known)
    assert [(r["user"], r["partition"]) for r in rows] == [("alice", "gpu"), (None, None), ("carol", "from-json")]


def test_text_output_is_terminal_safe() -> None:
    text = render_text(summary([row("j", "node_failure", "evil\x1b[31m\nnode", ["evil\x1b[31m\nnode"])]))
    assert "\x1b" not in text
    (node_line,) = [line for line in text.splitlines() if line.startswith("evil")]
    assert node_line.split() == ["evil", "node", "1", "1", "node_failure", "x1"]
    assert "suggested drain list: evil node" in text.splitlines()


def test_triage_imports_pandas_only_when_it_runs() -> None:
    probe = "import sys, ddpslurm.cli, ddpslurm.triage; print('pandas' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_an_empty_folder_or_an_unwritable_csv_is_one_line_and_exit_1(tmp_path: Path) -> None:
    empty = ddpslurm("triage", str(tmp_path))
    assert empty.returncode == 1 and empty.stderr.count("\n") == 1 and "no job folders under" in empty.stderr
    case = str(LAB[0])
    unwritable = ddpslurm("triage", case, "--no-sacct", "--csv", str(tmp_path / "missing" / "rows.csv"))
    assert unwritable.returncode == 1 and unwritable.stderr.count("\n") == 1
    assert "cannot write the CSV" in unwritable.stderr


def test_the_csv_writes_ranks_as_whole_numbers_and_empty_when_missing(lab_triage: tuple[dict, Path]) -> None:
    result, csv = lab_triage
    with csv.open(newline="") as handle:
        ranks = [line["first_failing_rank"] for line in csvlib.DictReader(handle)]
    assert ranks == ["" if r["first_failing_rank"] is None else str(r["first_failing_rank"]) for r in result["jobs"]]
    assert "" in ranks and any(r.isdigit() for r in ranks)  # a missing rank is what made pandas write `11.0`


def test_text_lists_the_most_recent_jobs_and_says_how_many_more(tmp_path: Path) -> None:
    for job_id in range(901, 954):  # sbatch's working directory: 53 jobs' slurm-<id>.out
        shutil.copy(SLURM_OUT, tmp_path / f"slurm-{job_id}.out")
    done = ddpslurm("triage", str(tmp_path), "--no-sacct", "--jobs", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "53 job(s) analyzed"
    header = next(i for i, line in enumerate(lines) if line.startswith("job id"))
    assert lines[header].split() == ["job", "id", "cause", "rank", "host", "confidence", "folder"]
    table = lines[header + 1:header + 51]
    assert [line.split()[0] for line in table] == [str(i) for i in range(953, 903, -1)]
    assert table[0].split() == ["953", "dataloader_worker_killed", "9", "a2", "high", str(tmp_path / "slurm-953.out")]
    assert lines[header + 51] == "... 3 more job(s): see --json or --csv"


def test_the_job_table_is_terminal_safe() -> None:
    evil = {**row("j", "node_failure", "bad\x1b]0;pwned\x07host", []), "job_id": "7", "first_failing_rank": 2,
            "confidence": "high", "path": "/jobs/x\x1b[2J\ny"}
    lines = render_text(summary([evil])).splitlines()
    (line,) = [line for line in lines if line.startswith("7 ")]
    assert "\x1b" not in line and "\x07" not in line
    assert line.split() == ["7", "node_failure", "2", "badhost", "high", "/jobs/x", "y"]


def test_a_slurm_output_file_keeps_its_job_id_and_array_task(tmp_path: Path) -> None:
    plain, task = tmp_path / "slurm-771204.out", tmp_path / "array" / "slurm-771204_3.out"
    task.parent.mkdir()
    shutil.copy(SLURM_OUT, plain)
    shutil.copy(SLURM_OUT, task)
    done = ddpslurm("triage", str(plain), str(task), "--json", "--no-sacct")
    assert done.returncode == 0, done.stderr
    assert [(r["job_id"], r["array_task"], r["cause"]) for r in json.loads(done.stdout)["jobs"]] == [
        ("771204", None, "dataloader_worker_killed"), ("771204", "3", "dataloader_worker_killed")]
    text = ddpslurm("triage", str(task), "--no-sacct").stdout.splitlines()
    assert any(line.split()[:3] == ["771204_3", "dataloader_worker_killed", "9"] for line in text)


@pytest.mark.parametrize(("name", "ids"), [("slurm-771204.out", ("771204", None)),
                                           ("slurm-771204_3.out", ("771204", "3")),
                                           ("slurm-88.err", ("88", None)), ("job_12", ("12", None)),
                                           ("notes.out", (None, None)), ("slurm-x.out", (None, None))])
def test_job_ids_from_the_name(tmp_path: Path, name: str, ids: tuple) -> None:
    assert job_ids(tmp_path / name, {}) == ids
    assert job_ids(tmp_path / name, {"job_id": "5"}) == ("5", None)  # ddpslurm.json's id comes first


def run_on_a_terminal(*args: str) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """`ddpslurm ARGS` with stderr on a pseudo-terminal: the process and what reached the terminal."""
    master, slave = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", *args], stdout=subprocess.PIPE, stderr=slave,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm"})
    finally:
        os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the terminal's other end is closed and all was read
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return done, seen


def test_progress_is_shown_on_a_terminal_stderr_only() -> None:
    cases = [str(c) for c in LAB[:3]]
    piped = ddpslurm("triage", *cases, "--no-sacct", "--jobs", "1")
    assert piped.returncode == 0 and piped.stderr == ""
    done, terminal = run_on_a_terminal("triage", *cases, "--no-sacct", "--jobs", "1")
    assert done.returncode == 0
    assert b"triage: analyzing jobs" in terminal and b"/3" in terminal
    assert done.stdout == piped.stdout  # the report itself is unchanged, and free of the bar
