"""The pure helpers of examples/train.py: argument defaults, the dataset, the parameter hash, checkpoints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("example_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "job_folder", "expected"),
    [
        ([], None, Path("checkpoints")),
        ([], "/jobs/job_7", Path("/jobs/job_7/checkpoints")),
        (["--checkpoint-dir", "/elsewhere"], "/jobs/job_7", Path("/elsewhere")),
        (["--checkpoint-dir", "rel"], None, Path("rel")),
    ],
)
def test_checkpoint_dir_default(train, monkeypatch, argv, job_folder, expected) -> None:
    monkeypatch.delenv("DDPSLURM_JOB_FOLDER", raising=False)
    if job_folder:
        monkeypatch.setenv("DDPSLURM_JOB_FOLDER", job_folder)
    assert train.parse_args(argv).checkpoint_dir == expected


@pytest.mark.parametrize("argv", [["--epochs", "0"], ["--steps-per-epoch", "-1"], ["--batch-size", "0"]])
def test_rejects_non_positive_sizes(train, argv, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        train.parse_args(argv)
    assert done.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(("seed_a", "seed_b", "same"), [(0, 0, True), (3, 3, True), (0, 1, False)])
def test_dataset_is_a_function_of_the_seed(train, seed_a, seed_b, same) -> None:
    import torch

    a, b = train.synthetic_dataset(64, seed_a), train.synthetic_dataset(64, seed_b)
    equal = all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors, strict=True))
    assert equal is same


def test_params_hash_sees_any_change(train) -> None:
    import torch

    model, twin = train.make_model(0), train.make_model(0)
    assert train.params_sha256(model) == train.params_sha256(twin)
    with torch.no_grad():
        next(iter(twin.parameters())).view(-1)[0] += 1e-6
    assert train.params_sha256(model) != train.params_sha256(twin)
    assert train.params_sha256(train.make_model(1)) != train.params_sha256(model)


def test_checkpoint_round_trip_is_atomic_and_complete(train, tmp_path: Path) -> None:
    import torch

    model = train.make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, train.FEATURES)).sum().backward()
    optimizer.step()
    fresh = train.make_model(0)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    assert train.load_checkpoint(tmp_path, fresh, fresh_opt) == 0  # nothing there yet

    path = train.save_checkpoint(tmp_path / "ckpt", 17, model, optimizer)
    assert sorted(p.name for p in path.parent.iterdir()) == [train.CHECKPOINT_NAME]  # no temporary left
    assert train.load_checkpoint(tmp_path / "ckpt", fresh, fresh_opt) == 17
    assert train.params_sha256(fresh) == train.params_sha256(model)
    momentum = [opt.state_dict()["state"][0]["momentum_buffer"] for opt in (fresh_opt, optimizer)]
    assert momentum[0].equal(momentum[1])
