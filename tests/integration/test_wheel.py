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
    # every rule file beside the signatures (went_on, combiner, ib_status, ...): the loader skips a missing one
    shipped = {n.rsplit("/", 1)[1] for n in names if n.count("/") == 3 and n.startswith("ddpslurm/_data/analyzer/")}
    assert {p.name for p in (REPO / "analyzer").glob("*.toml")} <= shipped


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


def test_wheel_metadata_needs_pandas_submitit_and_torch_only_for_their_extras(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as built:
        (meta,) = [n for n in built.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip().replace('"', "'") for line in built.read(meta).decode().splitlines()
                    if line.startswith("Requires-Dist:")]

    def extra_of(name: str) -> set[str]:
        return {r.partition("extra == ")[2].strip("' ") for r in requires
                if r.split(";")[0].strip().lower().startswith(name)}

    assert extra_of("torch") == {"torch", "all"}  # never with launch: a site's own torch build is kept
    assert extra_of("submitit") == {"launch", "all"}
    assert extra_of("pandas") == {"triage", "all"}
    assert "" not in extra_of("numpy")  # analyze counts with numpy where it is there, without it elsewhere


def installed_bytes(venv: Path) -> int:
    """The bytes of every file under a virtual environment."""
    return sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def pip_install(python: Path, *what: str) -> None:
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                                "--disable-pip-version-check", "--no-compile", *what],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]


#: what `pip install ddpslurm` may add to a clean virtual environment (issue 47: it was 208 MB with pandas and numpy)
PLAIN_INSTALL_MAX_MB = 60


def test_fresh_venv_without_torch_runs_analyze_html_and_triage_once_its_extra_is_there(wheel: Path,
                                                                                        tmp_path: Path) -> None:
    """`pip install ddpslurm` on a login node or laptop: a venv that sees no system package, deps from the index."""
    python = fresh_venv(tmp_path / "venv")
    empty = installed_bytes(tmp_path / "venv")
    pip_install(python, str(wheel))
    size_mb = (installed_bytes(tmp_path / "venv") - empty) / 1e6
    print(f"\nplain install of {wheel.name}: {size_mb:.1f} MB in a clean venv (limit {PLAIN_INSTALL_MAX_MB} MB)")
    assert size_mb <= PLAIN_INSTALL_MAX_MB
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    run = {"env": env, "cwd": tmp_path, "capture_output": True, "text": True, "timeout": 300}
    absent = subprocess.run([str(python), "-c", "import importlib.util as u; print(*(u.find_spec(m) for m in "
                             "('torch', 'submitit', 'pandas', 'numpy')))"], **run)
    assert absent.stdout.split() == ["None"] * 4, absent.stderr
    ddpslurm = str(tmp_path / "venv" / "bin" / "ddpslurm")
    analyzed = subprocess.run([ddpslurm, "analyze", str(CASE), "--json", "--html", "report.html"], **run)
    assert analyzed.returncode == 0, analyzed.stderr
    label = json.loads((CASE / "label.json").read_text())
    assert json.loads(analyzed.stdout)["cause"] == label["cause"]
    assert 'id="culprit"' in (tmp_path / "report.html").read_text()
    triage = [ddpslurm, "triage", str(CASE), "--json", "--no-sacct", "--csv", "rows.csv"]
    refused = subprocess.run(triage, **run)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "pip install 'ddpslurm[triage]'" in refused.stderr and not (tmp_path / "rows.csv").exists()
    assert subprocess.run([ddpslurm, "template", "srun-cpu"], **run).stdout.startswith("#!/bin/bash")
    (tmp_path / "train.py").write_text("print('hello')\n")
    dry = subprocess.run([ddpslurm, "submit", "train.py", "--nodes", "1", "--dry-run"], **run)
    assert dry.returncode == 0 and "#SBATCH --nodes=1" in dry.stdout, dry.stderr  # a dry run needs no submitit
    assert "pip install 'ddpslurm[launch]'" in dry.stdout + dry.stderr
    submit = subprocess.run([ddpslurm, "submit", "train.py", "--nodes", "1", "--lint", "off"], **run)
    assert submit.returncode == 1 and submit.stderr.count("\n") == 1, submit.stderr
    assert "pip install 'ddpslurm[launch]'" in submit.stderr
    pip_install(python, f"{wheel}[triage]")  # what the hint says, from the index
    triaged = subprocess.run(triage, **run)
    assert triaged.returncode == 0, triaged.stderr
    assert json.loads(triaged.stdout)["by_cause"] == {label["cause"]: 1}
    assert (tmp_path / "rows.csv").read_text().count("\n") == 2
    still = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('torch'), "
                            "u.find_spec('submitit'))"], **run)
    assert still.stdout.split() == ["None", "None"], still.stderr  # the triage extra brings no torch
