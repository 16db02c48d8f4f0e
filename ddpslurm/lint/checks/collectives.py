"""DDP002: a collective that only rank 0 reaches, directly or through a helper of the project: a deadlock."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpslurm.lint.flow import ALL, OTHERS, ZERO, guard_of
from ddpslurm.lint.model import Hit
from ddpslurm.lint.project import Function, Project
from ddpslurm.lint.source import Module

#: torch.distributed calls every rank of the group must make
COLLECTIVES = frozenset({
    "barrier", "monitored_barrier", "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_reduce_coalesced", "all_gather_coalesced", "all_to_all", "all_to_all_single", "broadcast",
    "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "new_group", "new_subgroups",
})
_PREFIX = "torch.distributed."


def collective(name: str | None) -> str | None:
    """`barrier` for `torch.distributed.barrier`, None for any other name."""
    if name and name.startswith(_PREFIX) and name[len(_PREFIX):] in COLLECTIVES:
        return name[len(_PREFIX):]
    return None


def _in_subgroup(call: ast.Call) -> bool:
    """`group=some_group`: a collective of a subgroup, which a rank-0-only branch may legitimately call."""
    for keyword in call.keywords:
        if keyword.arg == "group":
            value = keyword.value
            return not (isinstance(value, ast.Constant) and value.value is None) and not (
                isinstance(value, ast.Attribute) and value.attr == "WORLD")
    return False


class Reach:
    """Which collectives a call reaches on the rank that makes it, following the project's own functions."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.memo: dict[str, frozenset[str]] = {}

    def of_call(self, module: Module, call: ast.Call, name: str | None) -> frozenset[str]:
        kind = collective(name)
        if kind:
            return frozenset() if _in_subgroup(call) else frozenset({kind})
        function = self.project.function_for(module, call)
        return self.of_function(function) if function else frozenset()

    def of_function(self, function: Function) -> frozenset[str]:
        if function.qualname in self.memo:
            return self.memo[function.qualname]
        self.memo[function.qualname] = frozenset()  # a recursion reaches nothing new
        names = dict(self.project.module_calls(function.module))
        reached: dict[str | None, set[str]] = {ALL: set(), ZERO: set(), OTHERS: set()}
        for node in function.module.own(function.node):
            if isinstance(node, ast.Call):
                state = guard_of(function.module, node)[0]
                if state in reached:
                    reached[state] |= self.of_call(function.module, node, names.get(node))
        # a rank-0 branch balanced by the same collectives on the other ranks (torch_distributed_zero_first) tests
        # the function's own argument, which a caller may set to anything: count only what every rank runs
        self.memo[function.qualname] = frozenset(reached[ALL] | (reached[ZERO] - reached[OTHERS]))
        return self.memo[function.qualname]


def _where(module: Module, guard: ast.AST | None) -> str:
    if isinstance(guard, ast.If):
        return f"under `if {module.snippet(guard.test)}:` at line {guard.lineno}"
    if isinstance(guard, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"in `{guard.name}`, a rank-zero-only function"
    if isinstance(guard, ast.IfExp):
        return f"in `{module.snippet(guard)}`"
    return "on rank 0 only"


def check_rank_zero_collectives(project: Project) -> Iterator[Hit]:
    """Collectives only rank 0 reaches, unless the other ranks reach the same ones in the same function."""
    reach = Reach(project)
    for module in project.modules:
        zero: dict[int, list[tuple[ast.Call, frozenset[str], ast.AST | None]]] = {}
        others: dict[int, set[str]] = {}
        names = dict(project.module_calls(module))
        for call, name in project.module_calls(module):
            kinds = reach.of_call(module, call, name)
            if not kinds:
                continue
            scope = id(module.enclosing_function(call) or module.tree)
            state, guard = guard_of(module, call)
            if state == ZERO:
                zero.setdefault(scope, []).append((call, kinds, guard))
            elif state == OTHERS:
                others.setdefault(scope, set()).update(kinds)
        for scope, calls in zero.items():
            for call, kinds, guard in calls:
                if kinds <= others.get(scope, set()):
                    continue
                spelled = ", ".join(f"{k}()" for k in sorted(kinds))
                direct = collective(names.get(call))
                what = f"`{module.snippet(call.func)}()`" + ("" if direct else f" (it runs {spelled})")
                text = f"{what} is reached by rank 0 only ({_where(module, guard)}): the other ranks never join it"
                yield Hit(module, call, text)
