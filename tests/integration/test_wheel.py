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
