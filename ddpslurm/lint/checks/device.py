"""DDP005: the CUDA device picked with the global rank. DDP006: NCCL set up before each rank has its device."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpslurm.lint.checks.collectives import collective
from ddpslurm.lint.flow import ZERO, guard_of, local_only
from ddpslurm.lint.model import ERROR, Hit
from ddpslurm.lint.project import Project
from ddpslurm.lint.source import Module
from ddpslurm.lint.values import Values

INIT = "torch.distributed.init_process_group"
DDP_CLASS = "torch.nn.parallel.DistributedDataParallel"
#: what sets the current CUDA device of a process
SET_DEVICE = frozenset({"torch.cuda.set_device", "torch.cuda.device", "torch.accelerator.set_device_index",
                        "torch.xpu.set_device"})
#: collectives that put their buffers on the *current* device (torch.cuda.current_device()) with NCCL; a
#: barrier() guesses `rank % GPUs per node` instead, right for srun's block distribution, so it is not counted
DEVICE_GUESSING = frozenset({"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"})
_CUDA_PREFIX = "cuda:"


def _sinks(module: Module, node: ast.AST, values: Values) -> ast.AST | None:
    """The global-rank value that picks a CUDA device at `node`, or None."""
    if isinstance(node, ast.JoinedStr):
        for before, value in zip(node.values, node.values[1:], strict=False):
            if (isinstance(before, ast.Constant) and str(before.value).endswith(_CUDA_PREFIX)
                    and isinstance(value, ast.FormattedValue) and values.is_global_rank(module, value.value)):
                return value.value
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
        text = node.left.value
        if isinstance(node.op, ast.Mod) and text.startswith(_CUDA_PREFIX) and "%" in text:
            return node.right if values.is_global_rank(module, node.right) else None
        if isinstance(node.op, ast.Add) and text == _CUDA_PREFIX:
            return node.right if values.is_global_rank(module, node.right) else None
        return None
    if not isinstance(node, ast.Call):
        return None
    return _call_sink(module, node, values)


def _call_sink(module: Module, call: ast.Call, values: Values) -> ast.AST | None:
    name = module.resolve(call.func)
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    candidates: list[ast.AST] = []
    if name in ("torch.cuda.set_device", "torch.cuda.device"):
        candidates = call.args[:1] + [keywords[k] for k in ("device",) if k in keywords]
    elif name == "torch.device" and len(call.args) == 2:
        first = call.args[0]
        if isinstance(first, ast.Constant) and first.value == "cuda":
            candidates = [call.args[1]]
    elif name in (DDP_CLASS, "torch.nn.DataParallel"):
        ids = keywords.get("device_ids")
        candidates = list(ids.elts[:1]) if isinstance(ids, (ast.List, ast.Tuple)) else []
        candidates += [keywords["output_device"]] if "output_device" in keywords else []
    elif isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda"):
        candidates = call.args[:1] + [keywords[k] for k in ("device",) if k in keywords]
    elif (isinstance(call.func, ast.Attribute) and call.func.attr == "format"
          and isinstance(call.func.value, ast.Constant) and str(call.func.value.value).startswith("cuda:{")):
        candidates = call.args[:1]
    return next((c for c in candidates if values.is_global_rank(module, c)), None)


def check_device_from_global_rank(project: Project) -> Iterator[Hit]:
    """set_device(rank), f"cuda:{rank}", .to(rank), .cuda(rank), device_ids=[rank] with the global rank."""
    values = Values.of(project)
    for module in project.modules:
        if not any(word in module.text for word in ("cuda", "device", ".to(")):
            continue
        for node in module.nodes:
            if not isinstance(node, (ast.Call, ast.JoinedStr, ast.BinOp)):
                continue
            source = _sinks(module, node, values)
            if source is not None:
                yield Hit(module, node, f"`{module.snippet(node)}` picks the GPU with `{module.snippet(source, 30)}`,"
                                        " the global rank")


def nccl_possible(module: Module, call: ast.Call, values: Values) -> bool:
    """init_process_group's backend is or may be NCCL: `"nccl"`, no backend (NCCL for CUDA tensors), a name or
    option whose literal values include one with `nccl`."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    backend = call.args[0] if call.args else keywords.get("backend")
    if backend is None:
        return True
    found = values.literals(module, backend)
    return bool(found) and any(isinstance(v, str) and "nccl" in v.lower() for v in found)


def _device_use(module: Module, node: ast.AST) -> str | None:
    """A use of the *current* CUDA device: `.cuda()`, `.to("cuda")`, `torch.device("cuda")`, an object
    collective, torch.cuda.current_device()."""
    if not isinstance(node, ast.Call):
        return None
    name = module.resolve(node.func)
    kind = collective(name)
    if kind in DEVICE_GUESSING and not any(k.arg == "device_ids" for k in node.keywords):
        return f"{module.snippet(node.func)}()"
    if name in ("torch.cuda.current_device", "torch.cuda.synchronize"):
        return f"{module.snippet(node.func)}()"
    plain_cuda = [a for a in node.args[:1] if isinstance(a, ast.Constant) and a.value == "cuda"]
    if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and not node.args and not node.keywords:
        return f"{module.snippet(node)}"
    if (isinstance(node.func, ast.Attribute) and node.func.attr == "to") or name == "torch.device":
        return f"{module.snippet(node)}" if plain_cuda and len(node.args) == 1 else None
    return None


def _first_line(module: Module, scope: ast.AST, names: frozenset[str], after: int) -> int | None:
    lines = [n.lineno for n in module.own(scope)
             if isinstance(n, ast.Call) and n.lineno > after and module.resolve(n.func) in names]
    return min(lines) if lines else None


def check_init_before_set_device(project: Project) -> Iterator[Hit]:
    """NCCL init without device_id=, then, in the same function and on every rank, a use of the current device
    before set_device runs (an error when no set_device runs anywhere in the project)."""
    values = Values.of(project)
    anywhere = any(True for _ in project.calls_to(SET_DEVICE)) or _sets_visible_devices(project)
    for module, call in project.calls_to({INIT}):
        if any(k.arg == "device_id" for k in call.keywords) or not nccl_possible(module, call, values):
            continue
        scope = module.enclosing_function(call) or module.tree
        set_at = _first_line(module, scope, SET_DEVICE, after=call.lineno)
        if set_at is None and anywhere:
            continue  # set_device runs elsewhere (maybe before this function is called): the order is unknown
        end = set_at if set_at is not None else float("inf")
        use = next((u for n in module.own(scope) if call.lineno < getattr(n, "lineno", 0) < end
                    and (u := _device_use(module, n)) and guard_of(module, n)[0] != ZERO
                    and not local_only(module, n)), None)
        if use is None:
            continue
        if set_at is not None:
            yield Hit(module, call, f"NCCL is set up here and `{use}` uses the current GPU before "
                                    f"`torch.cuda.set_device` (line {set_at}) runs: cuda:0 on every rank")
        else:
            yield Hit(module, call, f"NCCL is set up here, no torch.cuda.set_device() runs anywhere, and `{use}` "
                                    "uses the current GPU: cuda:0 on every rank of a node", ERROR)


def _sets_visible_devices(project: Project) -> bool:
    """The script binds its own GPU through CUDA_VISIBLE_DEVICES: cuda:0 is then the right device."""
    return any(isinstance(n, ast.Constant) and n.value == "CUDA_VISIBLE_DEVICES"
               for m in project.modules for n in m.nodes)

