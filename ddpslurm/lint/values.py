"""Where a value comes from, as far as the project's own assignments tell: is this the global rank (RANK,
`dist.get_rank()`, SLURM_PROCID)? Which literal can a name or an argparse option hold?

Flow-insensitive and conservative: a name counts as the global rank only when every assignment to it in its
function (or, for attributes like `args.rank`, in the whole project) is one; a parameter is never known.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator

from ddpslurm.lint.project import Project
from ddpslurm.lint.source import Module, dotted, last_name, own_nodes

#: environment variables that hold the global rank
GLOBAL_RANK_ENV = frozenset({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
_UNKNOWN = ast.Constant(value=None)  # stands for a value nobody can tell (a loop variable, a tuple's part)


class Parameter(ast.expr):
    """A function parameter as a binding: what it holds comes from the calls of its function, or its default."""

    _fields = ()

    def __init__(self, function: ast.AST, name: str, index: int | None, default: ast.AST | None) -> None:
        super().__init__()
        self.function, self.name, self.index, self.default = function, name, index, default


def unknown(value: ast.AST) -> bool:
    """A binding whose value the project's text does not give (a parameter, a loop variable)."""
    return value is _UNKNOWN or isinstance(value, Parameter)


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> Iterator[Parameter]:
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: list[ast.AST | None] = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        yield Parameter(function, arg.arg, index, default)
    for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        yield Parameter(function, arg.arg, None, default)
    for arg in filter(None, (arguments.vararg, arguments.kwarg)):
        yield Parameter(function, arg.arg, None, None)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _pairs(target: ast.AST, value: ast.AST | None) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(target, value) pairs of an assignment, tuples unpacked element by element where both sides are tuples."""
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                yield from _pairs(t, v)
        else:
            for t in target.elts:
                yield from _pairs(t, _UNKNOWN)
    elif isinstance(target, ast.Starred):
        yield from _pairs(target.value, _UNKNOWN)
    else:
        yield target, value if value is not None else _UNKNOWN


def assignments(scope: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(target, value) for every binding in a scope's own body; parameters and loop targets get an unknown value."""
    if isinstance(scope, _FUNCTIONS):
        for parameter in _parameters(scope):
            yield ast.Name(id=parameter.name), parameter
    for node in own_nodes(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _pairs(target, node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            yield node.target, node.value
        elif isinstance(node, ast.AugAssign):
            yield node.target, _UNKNOWN
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            yield from _pairs(node.target, _UNKNOWN)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    yield from _pairs(item.optional_vars, _UNKNOWN)


class Values:
    """The project's bindings: names per scope, attributes (`args.rank`, `self.rank`) project-wide. One per
    project: `Values.of(project)`."""

    @classmethod
    def of(cls, project: Project) -> Values:
        found = project.memo.get("values")
        if not isinstance(found, Values):
            found = project.memo["values"] = cls(project)
        return found

    def __init__(self, project: Project) -> None:
        self.project = project
        self.scoped: dict[int, dict[str, list[ast.AST]]] = {}
        self.attributes: dict[str, list[tuple[Module, ast.AST]]] = defaultdict(list)
        self.callers: dict[int, list[tuple[Module, ast.Call, int]]] | None = None
        for module in project.modules:
            for node in module.nodes:
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        for t, v in _pairs(target, node.value):
                            if isinstance(t, ast.Attribute) and dotted(t):
                                self.attributes[str(dotted(t))].append((module, v))

    def _names(self, scope: ast.AST) -> dict[str, list[ast.AST]]:
        if id(scope) not in self.scoped:
            table: dict[str, list[ast.AST]] = defaultdict(list)
            for target, value in assignments(scope):
                if isinstance(target, ast.Name):
                    table[target.id].append(value)
            self.scoped[id(scope)] = table
        return self.scoped[id(scope)]

    def bindings(self, module: Module, node: ast.AST) -> list[tuple[Module, ast.AST]]:
        """The values a Name or Attribute may hold; empty when nothing in the project binds it."""
        if isinstance(node, ast.Attribute):
            return list(self.attributes.get(dotted(node) or "", ()))
        if not isinstance(node, ast.Name):
            return []
        for _, parent in module.ancestors(node):
            if isinstance(parent, _FUNCTIONS):
                found = self._names(parent).get(node.id)
                if found:
                    return [(module, value) for value in found]
        return [(module, value) for value in self._names(module.tree).get(node.id, ())]

    def is_global_rank(self, module: Module, node: ast.AST, depth: int = 0) -> bool:
        """`node` is the global rank: dist.get_rank(), int(os.environ["RANK"]), or a name only ever bound to one."""
        if depth > 4 or unknown(node):
            return False
        if isinstance(node, ast.Call):
            name = module.resolve(node.func)
            if name == "torch.distributed.get_rank":
                return not node.args and not node.keywords
            if last_name(node.func) in ("int", "str") and len(node.args) == 1:
                return self.is_global_rank(module, node.args[0], depth + 1)
            return bool(name in ("os.environ.get", "os.getenv", "os.environ.__getitem__") and node.args
                        and isinstance(node.args[0], ast.Constant) and node.args[0].value in GLOBAL_RANK_ENV)
        if isinstance(node, ast.Subscript):
            return (module.resolve(node.value) == "os.environ" and isinstance(node.slice, ast.Constant)
                    and node.slice.value in GLOBAL_RANK_ENV)
        if isinstance(node, (ast.Name, ast.Attribute)):
            bound = self.bindings(module, node)
            return bool(bound) and all(self.is_global_rank(m, v, depth + 1) for m, v in bound)
        return False

    def literals(self, module: Module, node: ast.AST, depth: int = 0) -> set[object] | None:
        """The literal values `node` may hold (both arms of `a if c else b`, a name's bindings, an argparse
        option's default), or None when one of them is no literal."""
        if isinstance(node, Parameter) and depth <= 4:
            return self._parameter_literals(node, depth)
        if depth > 4 or unknown(node):
            return None
        if isinstance(node, ast.Constant):
            return {node.value}
        if isinstance(node, ast.IfExp):
            body, orelse = self.literals(module, node.body, depth + 1), self.literals(module, node.orelse, depth + 1)
            return None if body is None or orelse is None else body | orelse
        bound = self.bindings(module, node) if isinstance(node, (ast.Name, ast.Attribute)) else []
        if not bound and isinstance(node, ast.Attribute):
            default = self.option_default(node.attr)
            return None if default is None else {default}
        return self._union_of_literals(bound, depth) or None

    def arguments(self, parameter: Parameter) -> list[tuple[Module, ast.AST]] | None:
        """What the calls of its function pass for `parameter` (its default where a call leaves it out); None
        when a call cannot be read (*args, **kwargs) or nothing in the project calls the function."""
        calls = self._callers().get(id(parameter.function), [])
        if not calls:
            return None
        out: list[tuple[Module, ast.AST]] = []
        for module, call, offset in calls:
            given: ast.AST | None = next((k.value for k in call.keywords if k.arg == parameter.name), None)
            if given is None and parameter.index is not None and 0 <= parameter.index - offset < len(call.args):
                given = call.args[parameter.index - offset]
            if any(isinstance(a, ast.Starred) for a in call.args) or (
                    given is None and any(k.arg is None for k in call.keywords)):
                return None  # *args or **kwargs: the value cannot be told
            if given is None and parameter.default is None:
                return None
            out.append((module, given if given is not None else parameter.default))  # type: ignore[arg-type]
        return out

    def _parameter_literals(self, parameter: Parameter, depth: int) -> set[object] | None:
        """The literals a parameter receives: each call's argument, or the default where a call leaves it out."""
        given = self.arguments(parameter)
        return None if given is None else self._union_of_literals(given, depth)

    def _union_of_literals(self, sources: list[tuple[Module, ast.AST]], depth: int) -> set[object] | None:
        """Every literal the expressions can take; None when one of them cannot be told."""
        found: set[object] = set()
        for module, value in sources:
            literals = self.literals(module, value, depth + 1)
            if literals is None:
                return None
            found |= literals
        return found

    def _callers(self) -> dict[int, list[tuple[Module, ast.Call, int]]]:
        """Function node id -> its calls in the project, with 1 for `obj.method(...)` calls (self is implicit)."""
        if self.callers is None:
            self.callers = defaultdict(list)
            for module, call, _ in self.project.all_calls():
                function = self.project.function_for(module, call)
                if function is not None:
                    first = function.node.args.args[:1]
                    bound = bool(first) and first[0].arg in ("self", "cls") and isinstance(call.func, ast.Attribute)
                    self.callers[id(function.node)].append((module, call, 1 if bound else 0))
        return self.callers

    def option_default(self, dest: str) -> object | None:
        """The literal default of the argparse option stored in `dest` (`--dist-backend` for `dist_backend`)."""
        flags = {f"--{dest}", f"--{dest.replace('_', '-')}"}
        for _, call, _ in self.project.all_calls():
            if last_name(call.func) != "add_argument":
                continue
            names = {a.value for a in call.args if isinstance(a, ast.Constant)}
            keywords = {k.arg: k.value for k in call.keywords if k.arg}
            stored = keywords.get("dest")
            if not (names & flags or (isinstance(stored, ast.Constant) and stored.value == dest)):
                continue
            default = keywords.get("default")
            return default.value if isinstance(default, ast.Constant) else None
        return None
