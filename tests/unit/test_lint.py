"""`ddpslurm lint` rules: each has scripts that must fail and idiomatic ones that must pass, with perturbed
spellings (aliases, names) so that the rules hold beyond the first example."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddpslurm.lint import RULES, lint_script

REPO = Path(__file__).resolve().parents[2]

HEAD = """
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
"""


def rules_of(tmp_path: Path, body: str, head: str = HEAD, files: dict[str, str] | None = None) -> list[str]:
    for name, text in (files or {}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(head) + textwrap.dedent(body))
    return [f.rule for f in lint_script(script).findings]


def only(rule: str, found: list[str]) -> list[str]:
    return [r for r in found if r == rule]


# --- DDP001: DistributedSampler without set_epoch -------------------------------------------------------------------

SAMPLER_FAIL = [
    """
    def train(ds, model):
        sampler = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=sampler)
        for epoch in range(3):
            for batch in loader:
                model(batch)
    """,
    """
    import torch.utils.data as tud
    def train(ds):
        loader = tud.DataLoader(ds, sampler=tud.distributed.DistributedSampler(ds, shuffle=True))
        for epoch in range(3):
            list(loader)
    """,
]
SAMPLER_PASS = [
    """
    def train(ds, model):
        sampler = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=sampler)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            list(loader)
    """,
    """
    def run_epoch(loader, epoch):
        loader.sampler.set_epoch(epoch)
        return list(loader)
    def train(ds):
        loader = DataLoader(ds, sampler=DistributedSampler(ds))
        for epoch in range(3):
            run_epoch(loader, epoch)
    """,
    """
    def evaluate(ds):
        loader = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))
        return list(loader)
    """,
]


@pytest.mark.parametrize("body", SAMPLER_FAIL)
def test_sampler_without_set_epoch_is_found(tmp_path: Path, body: str) -> None:
    assert only("DDP001", rules_of(tmp_path, body)) == ["DDP001"]


@pytest.mark.parametrize("body", SAMPLER_PASS)
def test_sampler_with_set_epoch_passes(tmp_path: Path, body: str) -> None:
    assert only("DDP001", rules_of(tmp_path, body)) == []


def test_set_epoch_in_a_trainer_module_of_the_same_folder_passes(tmp_path: Path) -> None:
    trainer = """
    class Trainer:
        def fit(self, loader, epochs):
            for epoch in range(epochs):
                loader.sampler.set_epoch(epoch)
                for batch in loader:
                    pass
    """
    body = """
    from trainer import Trainer
    def main(ds):
        Trainer().fit(DataLoader(ds, sampler=DistributedSampler(ds)), 3)
    """
    assert only("DDP001", rules_of(tmp_path, body, files={"trainer.py": trainer})) == []


def test_sampler_shuffle_resolved_through_the_callers(tmp_path: Path) -> None:
    body = """
    def make_sampler(ds, shuffle):
        return DistributedSampler(ds, shuffle=shuffle)
    def main(train_set, val_set):
        make_sampler(val_set, shuffle=False)
    """
    assert only("DDP001", rules_of(tmp_path, body)) == []
    assert only("DDP001", rules_of(tmp_path, body.replace("shuffle=False)", "shuffle=True)"))) == ["DDP001"]


# --- DDP002: collective reached by rank 0 only ----------------------------------------------------------------------

RANK_ZERO_FAIL = [
    """
    def save(model, rank):
        if rank == 0:
            torch.save(model.state_dict(), "m.pt")
            dist.barrier()
    """,
    """
    import torch.distributed as tdist
    def log(x):
        if tdist.get_rank() == 0:
            tdist.all_reduce(x)
    """,
    """
    def is_main_process():
        return dist.get_rank() == 0
    def evaluate(metric):
        if is_main_process():
            dist.all_gather_object([None], metric)
    """,
    """
    def step(args, x):
        if args.local_rank in [-1, 0] and x is not None:
            dist.broadcast(x, src=0)
    """,
    """
    def finish(x):
        if dist.get_rank() != 0:
            return
        dist.barrier()
    """,
    """
    def sync_all():
        if not dist.is_initialized():
            return
        dist.barrier()
    def save(model, master_process):
        if master_process:
            torch.save(model.module.state_dict(), "m.pt")
            sync_all()
    """,
]
RANK_ZERO_PASS = [
    """
    def save(model, rank):
        if rank == 0:
            torch.save(model.module.state_dict(), "m.pt")
        dist.barrier()
    """,
    """
    from contextlib import contextmanager
    @contextmanager
    def zero_first(local_rank):
        if local_rank not in [-1, 0]:
            dist.barrier()
        yield
        if local_rank == 0:
            dist.barrier()
    def build(local_rank):
        with zero_first(local_rank):
            pass
    def build_val():
        if dist.get_rank() == 0:
            with zero_first(-1):
                pass
    """,
    """
    def share(x, rank):
        if rank == 0:
            dist.broadcast(x, src=0)
        else:
            dist.broadcast(x, src=0)
    """,
    """
    def evaluate(x, rank, use_fsdp):
        if not use_fsdp and rank != 0:
            return
        if use_fsdp:
            dist.all_reduce(x)
    """,
    """
    def talk(x, rank, tp_group):
        if rank == 0:
            dist.all_reduce(x, group=tp_group)
            dist.send(x, dst=1)
    """,
]


@pytest.mark.parametrize("body", RANK_ZERO_FAIL)
def test_collective_on_rank_zero_only_is_found(tmp_path: Path, body: str) -> None:
    assert only("DDP002", rules_of(tmp_path, body)) == ["DDP002"]


@pytest.mark.parametrize("body", RANK_ZERO_PASS)
def test_collectives_every_rank_reaches_pass(tmp_path: Path, body: str) -> None:
    assert only("DDP002", rules_of(tmp_path, body)) == []


def test_rank_zero_collective_through_a_helper_of_another_module(tmp_path: Path) -> None:
    helpers = """
    import torch.distributed as d
    def synchronize():
        d.barrier()
    """
    body = """
    import helpers
    def save(global_rank):
        if global_rank == 0:
            helpers.synchronize()
    """
    found = lint_script_findings(tmp_path, body, {"helpers.py": helpers})
    assert [(f.rule, f.path.name) for f in found if f.rule == "DDP002"] == [("DDP002", "train.py")]
    assert "barrier()" in next(f.message for f in found if f.rule == "DDP002")


def lint_script_findings(tmp_path: Path, body: str, files: dict[str, str]) -> list:
    rules_of(tmp_path, body, files=files)
    return lint_script(tmp_path / "train.py").findings


# --- DDP003: no_sync misuse -------------------------------------------------------------------------------------------

NO_SYNC_FAIL = [
    """
    def train(ddp_model, loader, opt, accum):
        for step, batch in enumerate(loader):
            with ddp_model.no_sync():
                loss = ddp_model(batch).sum()
                loss.backward()
            if (step + 1) % accum == 0:
                opt.step()
    """,
    """
    def train(net, loader, scaler):
        for batch in loader:
            with net.no_sync():
                scaler.scale(net(batch).sum()).backward()
    """,
    """
    def train(model, batch):
        model.no_sync()
        model(batch).sum().backward()
    """,
]
NO_SYNC_PASS = [
    """
    def train(ddp_model, loader, opt, accum):
        for step, batch in enumerate(loader):
            if (step + 1) % accum != 0:
                with ddp_model.no_sync():
                    ddp_model(batch).sum().backward()
            else:
                ddp_model(batch).sum().backward()
                opt.step()
    """,
    """
    import contextlib
    def train(model, loader, accum):
        for step, batch in enumerate(loader):
            ctx = model.no_sync() if (step + 1) % accum else contextlib.nullcontext()
            with ctx:
                model(batch).sum().backward()
    """,
    """
    def train(model, micro_batches):
        for batch in micro_batches[:-1]:
            with model.no_sync():
                model(batch).sum().backward()
        model(micro_batches[-1]).sum().backward()
    """,
]


@pytest.mark.parametrize("body", NO_SYNC_FAIL)
def test_no_sync_misuse_is_found(tmp_path: Path, body: str) -> None:
    assert only("DDP003", rules_of(tmp_path, body)) == ["DDP003"]


@pytest.mark.parametrize("body", NO_SYNC_PASS)
def test_no_sync_on_accumulation_steps_passes(tmp_path: Path, body: str) -> None:
    assert only("DDP003", rules_of(tmp_path, body)) == []


# --- DDP004: launcher variables overwritten ---------------------------------------------------------------------------

ENV_FAIL = [
    ('os.environ["MASTER_ADDR"] = "localhost"\n', "error"),
    ('os.environ["RANK"] = str(0)\n', "error"),
    ("from os import environ as env\nenv['WORLD_SIZE'] = '8'\n", "error"),
    ('os.environ.update(LOCAL_RANK="0")\n', "error"),
    ('os.environ["MASTER_PORT"] = "12355"\n', "warn"),
    ('def setup(port):\n    os.environ["MASTER_PORT"] = str(port)\n', "warn"),
]
ENV_PASS = [
    'os.environ.setdefault("MASTER_ADDR", "localhost")\n',
    'if "MASTER_ADDR" not in os.environ:\n    os.environ["MASTER_ADDR"] = "localhost"\n',
    'if "RANK" not in os.environ:\n    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")\n',
    'os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "29500")\n',
    'os.environ["RANK"] = os.environ["SLURM_PROCID"]\n',
    'def setup(port=None):\n    if port is not None:\n        os.environ["MASTER_PORT"] = str(port)\n',
    'def setup(args):\n    if args.on_mpi:\n        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]\n',
    'os.environ["NCCL_DEBUG"] = "INFO"\n',
    "import submitit\nclass Runner(submitit.helpers.Checkpointable):\n    def __call__(self):\n"
    "        os.environ['MASTER_PORT'] = str(self.port)\n",
]


@pytest.mark.parametrize(("body", "level"), ENV_FAIL)
def test_launcher_variable_overwritten_is_found(tmp_path: Path, body: str, level: str) -> None:
    (tmp_path / "train.py").write_text(HEAD + body)
    found = [f for f in lint_script(tmp_path / "train.py").findings if f.rule == "DDP004"]
    assert [f.level for f in found] == [level]


@pytest.mark.parametrize("body", ENV_PASS)
def test_launcher_variables_kept_pass(tmp_path: Path, body: str) -> None:
    assert only("DDP004", rules_of(tmp_path, body)) == []


# --- DDP005: device from the global rank ------------------------------------------------------------------------------

DEVICE_FAIL = [
    "rank = dist.get_rank()\ntorch.cuda.set_device(rank)\n",
    'global_rank = int(os.environ["RANK"])\ndevice = torch.device(f"cuda:{global_rank}")\n',
    "def setup(model):\n    r = dist.get_rank()\n    return model.to(r)\n",
    "def setup(model):\n    idx = int(os.getenv('RANK', '0'))\n    return DDP(model.cuda(), device_ids=[idx])\n",
    "def setup(args, model):\n    args.rank = int(os.environ['SLURM_PROCID'])\n    model.cuda(args.rank)\n",
    "rank = dist.get_rank()\ndev = 'cuda:%d' % rank\n",
]
DEVICE_PASS = [
    'local_rank = int(os.environ["LOCAL_RANK"])\ntorch.cuda.set_device(local_rank)\n',
    "rank = dist.get_rank()\ntorch.cuda.set_device(rank % torch.cuda.device_count())\n",
    "def worker(rank, world_size, model):\n    torch.cuda.set_device(rank)\n"
    "    return DDP(model.to(rank), device_ids=[rank])\n",
    'rank = dist.get_rank()\nlocal = int(os.environ["LOCAL_RANK"])\ndevice = f"cuda:{local}"\nprint(f"rank {rank}")\n',
    "def setup(args):\n    args.gpu = int(os.environ['LOCAL_RANK'])\n    args.gpu = args.gpu % 8\n"
    "    torch.cuda.set_device(args.gpu)\n",
]


@pytest.mark.parametrize("body", DEVICE_FAIL)
def test_device_from_global_rank_is_found(tmp_path: Path, body: str) -> None:
    assert only("DDP005", rules_of(tmp_path, body)) == ["DDP005"]


@pytest.mark.parametrize("body", DEVICE_PASS)
def test_device_from_local_rank_passes(tmp_path: Path, body: str) -> None:
    assert only("DDP005", rules_of(tmp_path, body)) == []


# --- DDP006: NCCL init before set_device ------------------------------------------------------------------------------

INIT_FAIL = [
    ("""
    def setup(obj):
        dist.init_process_group("nccl")
        dist.broadcast_object_list([obj], src=0)
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    """, "warn"),
    ("""
    def setup(model, args):
        dist.init_process_group(backend=args.dist_backend)
        model = model.cuda()
        torch.cuda.set_device(args.gpu)
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist-backend", default="nccl")
    """, "warn"),
    ("""
    def setup(model):
        dist.init_process_group()
        return DDP(model.cuda())
    """, "error"),
]
INIT_PASS = [
    """
    def setup(model):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        return DDP(model.cuda())
    """,
    """
    def setup(model):
        local = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return DDP(model.cuda())
    """,
    """
    def setup(model):
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.barrier()
        return DDP(model.cuda())
    """,
    """
    def setup(model):
        dist.init_process_group("gloo")
        return DDP(model.cuda())
    """,
    """
    def setup(model, local_rank):
        dist.init_process_group("nccl")
        return DDP(model.cuda(local_rank), device_ids=[local_rank])
    """,
]


@pytest.mark.parametrize(("body", "level"), INIT_FAIL)
def test_nccl_before_set_device_is_found(tmp_path: Path, body: str, level: str) -> None:
    (tmp_path / "train.py").write_text(HEAD + textwrap.dedent(body))
    found = [f for f in lint_script(tmp_path / "train.py").findings if f.rule == "DDP006"]
    assert [f.level for f in found] == [level]


@pytest.mark.parametrize("body", INIT_PASS)
def test_device_chosen_first_passes(tmp_path: Path, body: str) -> None:
    assert only("DDP006", rules_of(tmp_path, body)) == []


# --- DDP007: DataLoader without a distributed sampler -----------------------------------------------------------------

LOADER_FAIL = [
    """
    import torchvision
    def build_loader(dataset):
        return DataLoader(dataset, batch_size=32, shuffle=True)
    def main(model):
        model = DDP(model)
        loader = build_loader(torchvision.datasets.MNIST("data", download=True))
    """,
    """
    import torch.utils.data as data
    import torch.nn.parallel as par
    def main(net):
        ds = data.TensorDataset(torch.ones(8))
        net = par.DistributedDataParallel(net)
        return data.DataLoader(ds, batch_size=4, sampler=None)
    """,
]
LOADER_PASS = [
    """
    def main(model, ds):
        model = DDP(model)
        loader = DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds))
    """,
    """
    def main(model, ds, rank):
        model = DDP(model)
        if rank == 0:
            val_loader = DataLoader(ds, batch_size=32)
    """,
    """
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield 1
    def main(model):
        model = DDP(model)
        loader = DataLoader(Stream(), batch_size=4)
    """,
    """
    def main(model, ds, rank, world_size):
        model = DDP(model)
        part = torch.utils.data.Subset(ds, range(rank, len(ds), world_size))
        loader = DataLoader(part, batch_size=4)
    """,
    """
    def main(model, ds, args):
        if args.distributed:
            model = DDP(model)
            loader = DataLoader(ds, sampler=DistributedSampler(ds))
        else:
            loader = DataLoader(ds, shuffle=True)
    """,
    """
    def main(ds):
        return DataLoader(ds, shuffle=True)
    """,
    """
    def build_pipeline(pattern):
        return torch.utils.data.TensorDataset(torch.ones(4))
    def main(model):
        model = DDP(model)
        return DataLoader(build_pipeline("shards/*.tar"), batch_size=None, num_workers=4)
    """,
]


@pytest.mark.parametrize("body", LOADER_FAIL)
def test_loader_without_sampler_under_ddp_is_found(tmp_path: Path, body: str) -> None:
    assert only("DDP007", rules_of(tmp_path, body)) == ["DDP007"]


@pytest.mark.parametrize("body", LOADER_PASS)
def test_sharded_or_rank_zero_loaders_pass(tmp_path: Path, body: str) -> None:
    assert only("DDP007", rules_of(tmp_path, body)) == []


# --- DDP008, DDP009, DDP010, DDP011 -----------------------------------------------------------------------------------

def test_find_unused_parameters_literal_true_is_a_warning(tmp_path: Path) -> None:
    assert only("DDP008", rules_of(tmp_path, "m = DDP(torch.nn.Linear(1, 1), find_unused_parameters=True)\n")) == [
        "DDP008"]
    flag = "def f(a, m):\n    return DDP(m, find_unused_parameters=a.unused)\n"
    assert only("DDP008", rules_of(tmp_path, flag)) == []


STATE_FAIL = [
    """
    def main(model, rank):
        ddp_model = DDP(model)
        if rank == 0:
            torch.save(ddp_model.state_dict(), "model.pt")
    """,
    """
    def main(net):
        net = torch.nn.parallel.DistributedDataParallel(net)
        checkpoint = {"model": net.state_dict(), "epoch": 3}
        torch.save(checkpoint, "ckpt.pt")
    """,
]
STATE_PASS = [
    """
    def main(model):
        ddp_model = DDP(model)
        torch.save(ddp_model.module.state_dict(), "model.pt")
    """,
    """
    def main(model, path):
        model = DDP(model)
        model.load_state_dict(torch.load(path))
        torch.save(model.state_dict(), path)
    """,
    """
    def main(model):
        raw = model
        model = DDP(model)
        torch.save(raw.state_dict(), "model.pt")
    """,
    """
    def main(model):
        model = DDP(model)
        state = {k.replace("module.", ""): v for k, v in model.state_dict().items()}
        torch.save(state, "model.pt")
    """,
]


@pytest.mark.parametrize("body", STATE_FAIL)
def test_wrapper_state_dict_saved_is_found(tmp_path: Path, body: str) -> None:
    assert only("DDP009", rules_of(tmp_path, body)) == ["DDP009"]


@pytest.mark.parametrize("body", STATE_PASS)
def test_module_state_dict_saved_passes(tmp_path: Path, body: str) -> None:
    assert only("DDP009", rules_of(tmp_path, body)) == []


@pytest.mark.parametrize(("body", "found"), [
    ('dist.init_process_group("nccl")\n', ["DDP010"]),
    ("from torch.distributed import init_process_group as ipg\nipg(backend='gloo')\n", ["DDP010"]),
    ('from datetime import timedelta\ndist.init_process_group("nccl", timeout=timedelta(minutes=5))\n', []),
    ('dist.init_process_group("gloo", "env://", 600)\n', []),
    ("def init(**kw):\n    dist.init_process_group(**kw)\n", []),
])
def test_init_without_timeout_is_info(tmp_path: Path, body: str, found: list[str]) -> None:
    assert only("DDP010", rules_of(tmp_path, body)) == found


@pytest.mark.parametrize(("body", "level"), [
    ("import torch.multiprocessing as mp\ndef work(i):\n    pass\n"
     "if __name__ == '__main__':\n    mp.spawn(work, nprocs=8)\n", "error"),
    ("from torch.multiprocessing import spawn\ndef work(i):\n    pass\n"
     "def main(a):\n    if a.mp:\n        spawn(work, nprocs=8)\n", "warn"),
])
def test_spawn_inside_a_launched_rank_is_found(tmp_path: Path, body: str, level: str) -> None:
    (tmp_path / "train.py").write_text(HEAD + body)
    assert [(f.rule, f.level) for f in lint_script(tmp_path / "train.py").findings if f.rule == "DDP011"] == [
        ("DDP011", level)]


def test_spawn_decided_by_the_launcher_environment_passes(tmp_path: Path) -> None:
    body = """
    import torch.multiprocessing as mp
    def work(i):
        pass
    if "LOCAL_RANK" in os.environ:
        work(int(os.environ["LOCAL_RANK"]))
    else:
        mp.spawn(work, nprocs=torch.cuda.device_count())
    """
    assert only("DDP011", rules_of(tmp_path, body)) == []


# --- engine: suppression, syntax errors, local modules, the repository's own scripts ---------------------------------

def test_line_and_file_suppression(tmp_path: Path) -> None:
    body = ('os.environ["MASTER_ADDR"] = "localhost"  # ddpslurm: ignore[DDP004] a test fixture\n'
            'os.environ["RANK"] = "0"  # ddpslurm: ignore\n'
            'os.environ["WORLD_SIZE"] = "1"  # ddpslurm: ignore[DDP001]\n')
    assert only("DDP004", rules_of(tmp_path, body)) == ["DDP004"]
    report = lint_script(tmp_path / "train.py")
    assert report.suppressed == 2
    assert only("DDP004", rules_of(tmp_path, "# ddpslurm: ignore-file[DDP004, DDP010]\n" + body)) == []
    assert "DDP010" not in rules_of(tmp_path, "# ddpslurm: ignore-file[DDP010]\ndist.init_process_group('gloo')\n")


def test_suppression_text_inside_a_string_does_not_count(tmp_path: Path) -> None:
    body = 'os.environ["MASTER_ADDR"] = "# ddpslurm: ignore"\n'
    assert only("DDP004", rules_of(tmp_path, body)) == ["DDP004"]


def test_syntax_error_is_a_finding_not_a_traceback(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("def main(:\n    pass\n")
    findings = lint_script(script).findings
    assert [(f.rule, f.level, f.line) for f in findings] == [("DDP000", "error", 1)]


def test_broken_local_module_is_a_finding_and_the_rest_is_linted(tmp_path: Path) -> None:
    body = "import helpers\ndist.init_process_group('gloo')\n"
    found = rules_of(tmp_path, body, files={"helpers.py": "x = (\n"})
    assert sorted(found) == ["DDP000", "DDP010"]


def test_main_block_of_an_imported_module_is_skipped(tmp_path: Path) -> None:
    helpers = """
    import os
    if __name__ == "__main__":
        os.environ["MASTER_ADDR"] = "localhost"
    """
    assert only("DDP004", rules_of(tmp_path, "import helpers\n", files={"helpers.py": helpers})) == []
    assert only("DDP004", rules_of(tmp_path, 'if __name__ == "__main__":\n    os.environ["RANK"] = "0"\n')) == [
        "DDP004"]


def test_package_imports_resolve_beside_the_package(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "dist_utils.py").write_text("import os\nos.environ['RANK'] = '0'\n")
    (tmp_path / "pkg" / "main.py").write_text("from pkg.dist_utils import *\n")
    report = lint_script(tmp_path / "pkg" / "main.py")
    assert [(f.rule, f.path.name) for f in report.findings] == [("DDP004", "dist_utils.py")]


def test_findings_carry_position_message_why_and_fix(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch.distributed as dist\n\ndef f(my_rank):\n    if my_rank == 0:\n"
                      "        dist.barrier()\n")
    (finding,) = lint_script(script).findings
    assert (finding.rule, finding.level, finding.line, finding.column) == ("DDP002", "error", 5, 9)
    assert "rank 0" in finding.message and "line 4" in finding.message
    assert finding.why and finding.fix


def test_every_rule_has_id_message_why_and_fix() -> None:
    ids = [rule.id for rule in RULES]
    assert ids == sorted(set(ids))
    for rule in RULES:
        assert rule.level in ("error", "warn", "info")
        assert rule.message and rule.why.endswith(".") and rule.fix.endswith(".")


@pytest.mark.parametrize("script", ["examples/train.py", *sorted(
    str(p.relative_to(REPO)) for p in (REPO / "tests" / "integration" / "scripts").glob("*.py"))])
def test_repository_scripts_lint_clean(script: str) -> None:
    assert lint_script(REPO / script).findings == []


def test_lint_imports_neither_the_analyzer_nor_the_launcher_nor_torch() -> None:
    import ast as pyast
    import subprocess
    import sys

    for path in (REPO / "ddpslurm" / "lint").rglob("*.py"):
        for node in pyast.walk(pyast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, pyast.Import)
                     else [node.module or ""] if isinstance(node, pyast.ImportFrom) else [])
            bad = [n for n in names if n.startswith(("ddpslurm.analyze", "ddpslurm.launch", "torch"))]
            assert not bad, f"{path.relative_to(REPO)} imports {bad}"
    probe = "import sys, ddpslurm.lint.command; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                          check=True).stdout.strip() == "False"
