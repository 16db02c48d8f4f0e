"""`submit --python` on the real local Slurm cluster: an interpreter that works on the login node but not on
the compute nodes (a module loaded here only, a venv on a node-local disk) ends the job in the batch step
with one line, before srun starts a rank; the job's sbatch script passes the real sbatch without a wckey.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ddpslurm import jobfolder
from tests.integration.test_submit import job_dir, job_id, submit, wait_end

if TYPE_CHECKING:
    from tests.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"


def _login_only_python(tmp_path: Path) -> Path:
    """A `python` that is this interpreter on the host and a torch-less venv's on the cluster's nodes."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text("#!/bin/bash\n"
                       'case "$(hostname)" in *-n[0-9]*) exec ' + str(bare / "bin" / "python") + ' "$@" ;; esac\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def test_a_python_the_nodes_lack_ends_the_job_in_one_line(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    python = _login_only_python(tmp_path)
    folder = tmp_path / "jobs"
    done = submit(slurm_cluster, folder, TRAIN, ["--epochs", "1"], "--nodes", "2", "--python", str(python),
                  "--lint", "off")
    assert done.returncode == 0, done.stderr  # it imports torch here: accepted
    jid = job_id(folder)
    assert wait_end(slurm_cluster, jid, timeout=180) == "FAILED"
    batch_err = (job_dir(folder) / f"{jid}_0_log.err").read_text()
    lines = [ln for ln in batch_err.splitlines() if ln.strip()]
    assert lines == [f"ddpslurm: error: {python} cannot import what every rank needs (ModuleNotFoundError: No "
                     f"module named 'torch'). Install them into it (`{python} -m pip install 'ddpslurm[launch,torch]'` "
                     "brings torch, submitit and ddpslurm), or pass --python with one that has them"], batch_err
    assert not jobfolder.read_rank_records(job_dir(folder) / "attempt_0", "start")  # srun never started a rank
    script = next(job_dir(folder).glob("*_submission.sh")).read_text()
    assert "--wckey" not in script and "#SBATCH --nodes=2" in script
