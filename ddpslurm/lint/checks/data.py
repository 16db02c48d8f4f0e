"""DDP001: a DistributedSampler whose epoch is never set. DDP007: a DataLoader without a distributed sampler in
a script that trains with DistributedDataParallel."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from ddpslurm.lint.flow import ZERO, guard_of, is_rank_expr, local_only
from ddpslurm.lint.model import Hit
from ddpslurm.lint.project import MAX_BYTES, Project
from ddpslurm.lint.source import Module, last_name
from ddpslurm.lint.values import Parameter, Values, unknown

SAMPLER = "torch.utils.data.DistributedSampler"
LOADER = "torch.utils.data.DataLoader"
DDP_CLASS = "torch.nn.parallel.DistributedDataParallel"
ITERABLE = frozenset({"torch.utils.data.IterableDataset", "torch.utils.data.IterDataPipe",
                      "torch.utils.data.datapipes.datapipe.IterDataPipe"})
#: names that tell a dataset was split per rank (or streams): world size, shards, iterable datasets
_SHARDING = re.compile(r"(?i)world_size|num_replicas|num_shards|shard|split_dataset_by_node|iterable|stream|"
                       r"webdataset|wds|num_tasks|nprocs")
#: files of the sampler's folder searched for set_epoch
MAX_SIBLINGS = 200


def _set_epoch_beside(module: Module, cache: dict[Path, bool]) -> bool:
    """A file in the sampler's own folder names set_epoch: its loop may live in a module this import graph
    missed (an import the linter could not resolve)."""
    folder = module.path.parent
    if folder not in cache:
        cache[folder] = False
        for path in sorted(folder.glob("*.py"))[:MAX_SIBLINGS]:
            try:
                if path.stat().st_size <= MAX_BYTES and "set_epoch" in path.read_text(errors="replace"):
                    cache[folder] = True
                    break
            except OSError:
                continue
    return cache[folder]


def check_sampler_set_epoch(project: Project) -> Iterator[Hit]:
    """A shuffling DistributedSampler, and no `.set_epoch` in the script, its modules or the sampler's folder."""
    if project.has_attribute("set_epoch"):
        return
    samplers, values = project.subclasses({SAMPLER}), Values.of(project)
    beside: dict[Path, bool] = {}
    for module, call, name in project.all_calls():
        if not name or project.lookup(name) not in samplers:
            continue
        shuffle = next((k.value for k in call.keywords if k.arg == "shuffle"), None)
        if shuffle is not None and values.literals(module, shuffle) != {True}:
            continue  # shuffle=False, or a value that may be False: set_epoch may change nothing
        if _set_epoch_beside(module, beside):
            continue
        yield Hit(module, call, f"`{module.snippet(call)}` shuffles, and nothing calls its set_epoch(): every "
                                "epoch repeats the first epoch's order")


def _has_sampler(call: ast.Call) -> bool:
    for keyword in call.keywords:
        if keyword.arg in ("sampler", "batch_sampler") or keyword.arg is None:  # None: **kwargs may hold one
            return not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None)
    return any(not (isinstance(a, ast.Constant) and a.value is None) for a in call.args[3:5])


def _sharded(module: Module, dataset: ast.AST, values: Values, iterable: set[str], project: Project) -> bool:
    """The dataset is split per rank, streams (an IterableDataset, webdataset), or cannot be told."""
    seen: list[tuple[Module, ast.AST]] = [(module, dataset)]
    for depth in range(4):
        nxt: list[tuple[Module, ast.AST]] = []
        for where, expr in seen:
            for node in ast.walk(expr):
                if is_rank_expr(node):
                    return True
                name = last_name(node) if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) else None
                if name and _SHARDING.search(name):
                    return True
                if isinstance(node, ast.Call):
                    resolved = where.resolve(node.func)
                    if resolved and project.lookup(resolved) in iterable:
                        return True
                if isinstance(node, ast.Name) and depth < 3:
                    for place, value in values.bindings(where, node):
                        passed = values.arguments(value) if isinstance(value, Parameter) else None
                        if passed is not None:
                            nxt.extend(passed)  # a parameter: what its callers pass
                        elif unknown(value):
                            return True  # a parameter nobody calls with, a loop variable: cannot be told
                        else:
                            nxt.append((place, value))
        seen = nxt
    return False


def _self_batching(call: ast.Call) -> bool:
    """`DataLoader(ds, batch_size=None)`: the dataset yields whole batches, the way iterable pipelines that split
    the data per rank themselves do."""
    size = next((k.value for k in call.keywords if k.arg == "batch_size"), call.args[1] if len(call.args) > 1 else None)
    return isinstance(size, ast.Constant) and size.value is None


def check_loader_without_sampler(project: Project) -> Iterator[Hit]:
    """DataLoader(dataset) with no sampler= in a project that builds a DistributedDataParallel."""
    wrappers = project.subclasses({DDP_CLASS})
    if not any(name and project.lookup(name) in wrappers for _, _, name in project.all_calls()):
        return
    loaders, iterable, values = project.subclasses({LOADER}), project.subclasses(ITERABLE), Values.of(project)
    for module, call, name in project.all_calls():
        if not name or project.lookup(name) not in loaders or _has_sampler(call):
            continue
        dataset = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "dataset"), None)
        if dataset is None or _self_batching(call) or _sharded(module, dataset, values, iterable, project):
            continue
        if guard_of(module, call)[0] == ZERO or local_only(module, call):
            continue  # rank 0 alone reads it, or only a run without DDP does
        yield Hit(module, call, f"`{module.snippet(call)}` has no sampler while the model is wrapped in "
                                "DistributedDataParallel: every rank reads the whole dataset")

