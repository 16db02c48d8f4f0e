"""examples/train.py resumes exactly: preempted and resumed, it ends with the parameters of a run never stopped.

Single-process runs (gloo, world of one) without Slurm: this is about the script, not the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
ARGS = ["--epochs", "2", "--steps-per-epoch", "6", "--checkpoint-every", "4"]


def run_train(ckpt: Path, preempted: bool = False) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "DDPSLURM_PREEMPTED")}
    if preempted:
        env["DDPSLURM_PREEMPTED"] = "1"  # what ddpslurm.preemption_requested() reads after the signal
    done = subprocess.run([sys.executable, str(EXAMPLE), *ARGS, "--checkpoint-dir", str(ckpt)], env=env,
                          capture_output=True, text=True, timeout=180)
    finals = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith('{"event": "final"')]
    assert len(finals) == 1, done.stdout + done.stderr
    return done.returncode, finals[0]


@pytest.mark.slow
def test_preempted_then_resumed_run_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    code, straight = run_train(tmp_path / "straight")
    assert (code, straight["status"], straight["step"]) == (0, "done", 12)

    code, first = run_train(tmp_path / "resumed", preempted=True)
    assert (code, first["status"], first["step"]) == (0, "preempted", 1)  # stops at the first step boundary
    assert (tmp_path / "resumed" / "last.pt").is_file()
    code, second = run_train(tmp_path / "resumed")
    assert (code, second["status"], second["step"]) == (0, "done", 12)
    assert second["params_sha256"] == straight["params_sha256"]
    assert first["params_sha256"] != straight["params_sha256"]
