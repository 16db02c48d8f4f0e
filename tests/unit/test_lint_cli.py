"""`ddpslurm lint` on the command line (exit codes, formats, usage errors, terminal safety) and `submit --lint`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BAD = ('import os\nimport torch.distributed as dist\nos.environ["MASTER_ADDR"] = "localhost"\n'
       'dist.init_process_group("gloo", timeout=None)\n')
WARN_ONLY = ("from torch.utils.data import DataLoader, DistributedSampler\n"
             "loader = DataLoader([1, 2], sampler=DistributedSampler([1, 2]))\n")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _one_line_error(done: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    assert done.returncode == code, done.stdout + done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert fragment in lines[0]


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    (tmp_path / "bad.py").write_text(BAD)
    (tmp_path / "warn.py").write_text(WARN_ONLY)
    (tmp_path / "clean.py").write_text("print('hello')\n")
    return tmp_path


def test_exit_codes_follow_the_worst_level(folder: Path) -> None:
    clean = _run(["lint", "clean.py"], folder)
    assert clean.returncode == 0 and "no findings in clean.py" in clean.stdout
    warned = _run(["lint", "warn.py"], folder)
    assert warned.returncode == 0 and "warning DDP001" in warned.stdout
    bad = _run(["lint", "bad.py", "clean.py"], folder)
    assert bad.returncode == 1
    assert "bad.py:3:1: error DDP004 sets MASTER_ADDR" in bad.stdout
    assert "    why: " in bad.stdout and "    fix: " in bad.stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (["lint", "missing.py"], "'missing.py' does not exist"),
    (["lint", "."], "is a folder"),
    (["lint", "notes.txt"], "is not a Python script"),
    (["lint", "blob.py"], "is not Python source"),
    (["lint", "clean.py", "--ignore", "DDP999"], "unknown rule id DDP999"),
    (["lint", "clean.py", "--path", "nowhere"], "is not a folder"),
    (["lint"], "no script given"),
])
def test_usage_errors_are_one_line_and_exit_2(folder: Path, args: list[str], fragment: str) -> None:
    (folder / "notes.txt").write_text("import os\n")
    (folder / "blob.py").write_bytes(b"\x00\x01binary")
    _one_line_error(_run(args, folder), 2, fragment)


def test_syntax_error_is_a_finding_with_exit_1(folder: Path) -> None:
    (folder / "broken.py").write_text("def main(:\n")
    done = _run(["lint", "broken.py"], folder)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "broken.py:1:10: error DDP000 does not parse" in done.stdout


def test_json_output(folder: Path) -> None:
    done = _run(["lint", "bad.py", "--json"], folder)
    assert done.returncode == 1
    document = json.loads(done.stdout)
    assert document["schema_version"] == 1 and document["scripts"] == ["bad.py"]
    assert document["counts"] == {"error": 1, "warn": 0, "info": 0}
    (finding,) = document["findings"]
    assert finding["rule"] == "DDP004" and finding["file"] == "bad.py" and finding["line"] == 3
    assert {"column", "level", "message", "why", "fix"} <= set(finding)


def test_sarif_output(folder: Path) -> None:
    done = _run(["lint", "bad.py", "warn.py", "--format", "sarif"], folder)
    document = json.loads(done.stdout)
    assert document["version"] == "2.1.0" and "sarif-2.1.0" in document["$schema"]
    (run,) = document["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert {"DDP001", "DDP004", "DDP011"} <= {r["id"] for r in rules}
    assert all(r["shortDescription"]["text"] and r["help"]["text"] for r in rules)
    results = {(r["ruleId"], r["level"]) for r in run["results"]}
    assert results == {("DDP004", "error"), ("DDP001", "warning")}
    location = next(r for r in run["results"] if r["ruleId"] == "DDP004")["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "bad.py" and location["region"]["startLine"] == 3


def test_ignore_and_list_rules(folder: Path) -> None:
    assert _run(["lint", "bad.py", "--ignore", "ddp004"], folder).returncode == 0
    listed = _run(["lint", "--list-rules"], folder)
    assert listed.returncode == 0 and listed.stdout.count("\n") == 12 and "DDP002  error" in listed.stdout


def test_file_text_never_drives_the_terminal(folder: Path) -> None:
    name = "ev\x1b]0;owned\x07il.py"
    (folder / name).write_text('import os\nos.environ["RANK"] = "\\x1b[31m\u202e0"\n')
    done = _run(["lint", name], folder)
    assert done.returncode == 1
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout and "\x07" not in done.stdout
    assert "DDP004" in done.stdout


def test_submit_prints_findings_and_lint_error_refuses(folder: Path) -> None:
    warned = _run(["submit", "bad.py", "--dry-run", "--folder", str(folder / "jobs")], folder)
    assert warned.returncode == 0, warned.stderr
    assert "ddpslurm: lint: bad.py:3:1: error DDP004" in warned.stderr
    assert "--lint error refuses" in warned.stderr
    refused = _run(["submit", "bad.py", "--dry-run", "--lint", "error", "--folder", str(folder / "jobs")], folder)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    last = [ln for ln in refused.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith("ddpslurm: error: not submitted: the script has 1 error-level lint finding (DDP004)")
    assert "#SBATCH" not in refused.stdout
    quiet = _run(["submit", "bad.py", "--dry-run", "--lint", "off", "--folder", str(folder / "jobs")], folder)
    assert quiet.returncode == 0 and "lint" not in quiet.stderr


def test_submit_lint_error_lets_warnings_through(folder: Path) -> None:
    done = _run(["submit", "warn.py", "--dry-run", "--lint", "error", "--folder", str(folder / "jobs")], folder)
    assert done.returncode == 0, done.stderr
    assert "warning DDP001" in done.stderr and "#SBATCH" in done.stdout


def test_quick_start_script_lints_clean() -> None:
    done = _run(["lint", "examples/train.py"], REPO)
    assert done.returncode == 0 and "no findings in examples/train.py" in done.stdout
