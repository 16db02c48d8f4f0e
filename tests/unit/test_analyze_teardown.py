"""A rank that was behind, whose DataLoader workers die only when the step's teardown reaches it: after the others
timed out waiting for it, its worker's death is the teardown's mark, and the answer is the collective it missed;
before their timeouts, the worker's death is the cause. Tried over rank numbers, world sizes and layouts (a rank's
own file, torch's `[rankR]:` head)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths

WAITED = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
          "15000ms for recv operation to complete")
WORKER = "RuntimeError: DataLoader worker (pid(s) {pid}) exited unexpectedly"


def stamp(seconds: float) -> str:
    minute, second = divmod(seconds, 60)
    return f"2026-11-24T16:{34 + int(minute):02d}:{second:06.3f}Z "


def write_job(root: Path, world: int, behind: int, worker_at: float, merged: bool) -> None:
    """Per-rank logs (`rank_R.log`), or one console log whose lines carry torch's `[rankR]:` head."""
    out: list[str] = []
    for rank in range(world):
        lines = [stamp(0.5) + f"rank {rank} step 1 loss 2.30"]
        if rank == behind:
            lines.append(stamp(worker_at) + WORKER.format(pid=20000 + rank))
        else:
            lines.append(stamp(20.0 + rank * 0.01) + WAITED)
        if merged:
            out += [f"[rank{rank}]:{line}" for line in lines]
        else:
            (root / f"rank_{rank}.log").write_text("\n".join(lines) + "\n")
    if merged:
        (root / "console.log").write_text("\n".join(out) + "\n")


@pytest.mark.parametrize("world, behind", [(4, 2), (8, 5), (16, 0), (16, 15)])
@pytest.mark.parametrize("merged", [False, True])
def test_a_worker_killed_after_the_others_waited_is_the_teardown(tmp_path, world, behind, merged):
    write_job(tmp_path, world, behind, worker_at=23.0, merged=merged)
    d = analyze_paths([tmp_path], workers=1)
    assert (d.cause, d.first_failing_rank) == ("collective_timeout", behind)


@pytest.mark.parametrize("world, behind", [(4, 2), (8, 5), (16, 0)])
@pytest.mark.parametrize("merged", [False, True])
def test_a_worker_killed_before_the_others_waited_is_the_cause(tmp_path, world, behind, merged):
    write_job(tmp_path, world, behind, worker_at=4.0, merged=merged)
    d = analyze_paths([tmp_path], workers=1)
    assert (d.cause, d.first_failing_rank) == ("dataloader_worker_killed", behind)
