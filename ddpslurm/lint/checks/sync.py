"""DDP003: `no_sync()` that skips every gradient all-reduce, or that is called outside a `with` and does nothing."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpslurm.lint.model import Hit
from ddpslurm.lint.project import Function, Project
from ddpslurm.lint.source import Module, last_name, scopes

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_CONDITIONAL = (ast.If, ast.IfExp, ast.ExceptHandler, ast.Match)


def _is_no_sync(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "no_sync"


class Backward:
    """Whether a call runs a backward pass, itself (`loss.backward()`, `scaler.scale(l).backward()`) or in a
    function of the project."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.memo: dict[str, bool] = {}

    def of_call(self, module: Module, call: ast.Call) -> bool:
        if last_name(call.func) == "backward":
            return True
        function = self.project.function_for(module, call)
        return self.of_function(function) if function else False

    def of_function(self, function: Function) -> bool:
        if function.qualname not in self.memo:
            self.memo[function.qualname] = False  # recursion
            nodes = function.module.own(function.node)
            self.memo[function.qualname] = any(
                isinstance(n, ast.Call) and self.of_call(function.module, n) for n in nodes)
        return self.memo[function.qualname]


def _every_iteration(module: Module, node: ast.AST, scope: ast.AST) -> ast.AST | None:
    """The loop that runs `node` on every iteration (no `if` in between), or None."""
    for _, parent in module.ancestors(node):
        if parent is scope:
            return None
        if isinstance(parent, _CONDITIONAL):
            return None
        if isinstance(parent, _LOOPS):
            return parent
    return None


def check_no_sync(project: Project) -> Iterator[Hit]:
    """`with ddp.no_sync():` around the backward of every iteration, with no backward outside it in the function;
    and `ddp.no_sync()` as a bare statement."""
    backward = Backward(project)
    for module in project.modules:
        if "no_sync" not in module.text:
            continue
        for scope in scopes(module):
            nodes = module.own(scope)
            for node in nodes:
                if isinstance(node, ast.Expr) and _is_no_sync(node.value):
                    yield Hit(module, node.value, f"`{module.snippet(node.value)}` is called outside a `with`: it "
                                                  "returns a context manager and changes nothing")
            withs = [n for n in nodes if isinstance(n, (ast.With, ast.AsyncWith))
                     and any(_is_no_sync(item.context_expr) for item in n.items)]
            if not withs:
                continue
            inside = {id(n) for w in withs for stmt in w.body for n in ast.walk(stmt)}
            if any(isinstance(n, ast.Call) and id(n) not in inside and backward.of_call(module, n) for n in nodes):
                continue  # a backward outside no_sync(): the sync step
            for statement in withs:
                loop = _every_iteration(module, statement, scope)
                runs_backward = any(isinstance(n, ast.Call) and backward.of_call(module, n)
                                    for stmt in statement.body for n in ast.walk(stmt))
                if loop is None or not runs_backward:
                    continue
                call = next(item.context_expr for item in statement.items if _is_no_sync(item.context_expr))
                yield Hit(module, call, f"`{module.snippet(call)}` wraps the backward of every iteration of the loop "
                                        f"at line {loop.lineno}, and no backward runs outside it: the gradients are "
                                        "never all-reduced")
