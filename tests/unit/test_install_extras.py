"""The install split: the plain install leaves out torch, pandas, numpy and submitit; each extra brings its part, and a
command whose extra is missing says so in one line naming the pip command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "analyzer" / "cases" / "lab-user_code_exception-1"
#: the CLI with these modules made unimportable, as in an installation that lacks them
WITHOUT = ("import sys\nfor name in sys.argv[1].split(','):\n    sys.modules[name] = None\n"
           "sys.argv = ['ddpslurm', *sys.argv[2:]]\nfrom ddpslurm.cli import main\nmain()\n")


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
            for r in requirements}


def test_the_plain_install_has_no_torch_pandas_numpy_or_submitit() -> None:
    assert not names(project()["dependencies"]) & {"torch", "pandas", "numpy", "submitit"}


def test_each_extra_brings_its_part_and_launch_brings_no_torch() -> None:
    extras = project()["optional-dependencies"]
    assert "pandas" in names(extras["triage"])
    assert names(extras["launch"]) == {"submitit"}
    assert names(extras["torch"]) == {"torch"}


def cli_without(modules: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT, modules, *argv], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_triage_without_pandas_is_one_line_naming_the_pip_command(tmp_path: Path) -> None:
    done = cli_without("pandas", "triage", str(CASE), "--no-sacct", "--csv", str(tmp_path / "rows.csv"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "triage needs pandas" in done.stderr and "pip install 'ddpslurm[triage]'" in done.stderr
    assert done.stdout == "" and not (tmp_path / "rows.csv").exists()


def test_analyze_needs_neither_pandas_nor_numpy() -> None:
    done = cli_without("pandas,numpy", "analyze", str(CASE), "--json")
    assert done.returncode == 0, done.stderr
    assert '"cause": "user_code_exception"' in done.stdout
