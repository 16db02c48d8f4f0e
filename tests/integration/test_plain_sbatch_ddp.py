"""examples/train.py as a plain 2-node sbatch job, with no ddpslurm in the launch path.

The sbatch script is what a user would write by hand: MASTER_ADDR from `scontrol show hostnames`,
RANK/LOCAL_RANK/WORLD_SIZE from Slurm's variables inside `srun bash -c`. Real gloo over the cluster's
namespaces; every rank must end with identical parameters.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"

SBATCH_SCRIPT = """#!/bin/bash
#SBATCH --job-name=plain-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=10
#SBATCH --output={folder}/%j.out
set -euo pipefail
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))
export WORLD_SIZE=$SLURM_NTASKS
srun --kill-on-bad-exit=1 --label bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID exec "$0" "$@"' \\
    {python} {train} --epochs 2 --steps-per-epoch 10 --checkpoint-every 5 --checkpoint-dir {folder}/ckpt
"""


def final_records(output: str) -> list[dict]:
    """The `{"event": "final", ...}` lines of an `srun --label` output ("0: {...}")."""
    records = []
    for line in output.splitlines():
        _, _, rest = line.partition(": ")
        if rest.startswith("{") and '"event": "final"' in rest:
            records.append(json.loads(rest))
    return records


@pytest.mark.slurm
@pytest.mark.slow
def test_two_node_gloo_ddp_ends_with_identical_parameters(slurm_cluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(SBATCH_SCRIPT.format(folder=shlex.quote(str(tmp_path)), python=shlex.quote(sys.executable),
                                           train=shlex.quote(str(EXAMPLE))))
    submitted = slurm_cluster.run(["sbatch", "--parsable", "--wait", str(script)], check=False, timeout=300)
    job_id = submitted.stdout.strip().split(";")[0]
    output = (tmp_path / f"{job_id}.out").read_text() if job_id.isdigit() else ""
    assert submitted.returncode == 0, f"sbatch failed ({submitted.stderr.strip()}); job output:\n{output}"

    records = final_records(output)
    assert sorted(r["rank"] for r in records) == [0, 1], output
    assert {r["world_size"] for r in records} == {2}
    assert {r["step"] for r in records} == {20}
    assert {r["status"] for r in records} == {"done"}
    assert len({r["host"] for r in records}) == 2, "the two ranks must run on two different nodes"
    assert len({r["params_sha256"] for r in records}) == 1, "DDP replicas diverged"
    assert (tmp_path / "ckpt" / "last.pt").is_file()
