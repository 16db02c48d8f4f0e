"""The built wheel carries its data: an installed ddpslurm finds its signatures and templates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "analyzer" / "cases" / "cuda-oom-rank3-torch112-srun-label"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=300)
    (built,) = out.glob("ddpslurm-*.whl")
    return built


def test_wheel_ships_signatures_causes_and_templates_but_not_the_case_corpus(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "ddpslurm/_data/analyzer/causes.toml" in names
    assert any(n.startswith("ddpslurm/_data/analyzer/signatures/") and n.endswith(".toml") for n in names)
    assert any(n.startswith("ddpslurm/_data/sbatch_templates/") and n.endswith(".sbatch") for n in names)
    assert not [n for n in names if "/cases/" in n]


def test_installed_wheel_analyzes_and_renders_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = {"env": env, "cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    where = subprocess.run([sys.executable, "-c", "import ddpslurm; print(ddpslurm.__file__)"], **run).stdout
    assert where.strip().startswith(str(site))
    analyzed = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", str(CASE), "--json"], **run)
    assert analyzed.returncode == 0, analyzed.stderr
    label = json.loads((CASE / "label.json").read_text())
    assert json.loads(analyzed.stdout)["cause"] == label["cause"]
    rendered = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "template", "srun-cpu"], **run)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout.startswith("#!/bin/bash")


def test_wheel_metadata_needs_torch_and_submitit_only_for_the_launch_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as built:
        (meta,) = [n for n in built.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in built.read(meta).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    heavy = [r for r in requires if r.split(";")[0].strip().lower().startswith(("torch", "submitit"))]
    assert len(heavy) == 2 and all("extra == 'launch'" in r.replace('"', "'") for r in heavy)
    assert any(r.startswith("pandas") and "extra" not in r for r in requires)


def test_fresh_venv_without_torch_runs_analyze_html_and_triage(wheel: Path, tmp_path: Path) -> None:
    """`pip install ddpslurm` on a login node or laptop: a venv that sees no system package, deps from the index."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                                "--disable-pip-version-check", "--no-compile", str(wheel)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    run = {"env": env, "cwd": tmp_path, "capture_output": True, "text": True, "timeout": 300}
    absent = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('torch'), "
                             "u.find_spec('submitit'))"], **run)
    assert absent.stdout.split() == ["None", "None"], absent.stderr
    ddpslurm = str(venv / "bin" / "ddpslurm")
    analyzed = subprocess.run([ddpslurm, "analyze", str(CASE), "--json", "--html", "report.html"], **run)
    assert analyzed.returncode == 0, analyzed.stderr
    label = json.loads((CASE / "label.json").read_text())
    assert json.loads(analyzed.stdout)["cause"] == label["cause"]
    assert 'id="culprit"' in (tmp_path / "report.html").read_text()
    triaged = subprocess.run([ddpslurm, "triage", str(CASE), "--json", "--no-sacct", "--csv", "rows.csv"], **run)
    assert triaged.returncode == 0, triaged.stderr
    assert json.loads(triaged.stdout)["by_cause"] == {label["cause"]: 1}
    assert (tmp_path / "rows.csv").read_text().count("\n") == 2
    assert subprocess.run([ddpslurm, "template", "srun-cpu"], **run).stdout.startswith("#!/bin/bash")
    (tmp_path / "train.py").write_text("print('hello')\n")
    dry = subprocess.run([ddpslurm, "submit", "train.py", "--nodes", "1", "--dry-run"], **run)
    assert dry.returncode == 0 and "#SBATCH --nodes=1" in dry.stdout, dry.stderr  # a dry run needs no submitit
    assert "pip install 'ddpslurm[launch]'" in dry.stdout + dry.stderr
    submit = subprocess.run([ddpslurm, "submit", "train.py", "--nodes", "1", "--lint", "off"], **run)
    assert submit.returncode == 1 and submit.stderr.count("\n") == 1, submit.stderr
    assert "pip install 'ddpslurm[launch]'" in submit.stderr
