"""Rules that are call patterns (DDP008 find_unused_parameters=True, DDP010 no timeout=), built from small
matcher factories, and DDP009, the DDP wrapper's own state_dict() saved."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpslurm.lint.model import Hit, Matcher
from ddpslurm.lint.project import Project
from ddpslurm.lint.source import Module, dotted, last_name, own_nodes

DDP_CLASS = "torch.nn.parallel.DistributedDataParallel"
INIT = "torch.distributed.init_process_group"


def keyword_is(classes: frozenset[str], keyword: str, value: object, say: str) -> Matcher:
    """Calls of `classes` (or their project subclasses) passing `keyword=value` as a literal."""

    def check(project: Project) -> Iterator[Hit]:
        wanted = project.subclasses(classes)
        for module, call, name in project.all_calls():
            if name and project.lookup(name) in wanted:
                for given in call.keywords:
                    if given.arg == keyword and isinstance(given.value, ast.Constant) and given.value.value is value:
                        yield Hit(module, given.value, say.format(call=module.snippet(call.func)))

    return check


def keyword_missing(functions: frozenset[str], keyword: str, position: int, say: str) -> Matcher:
    """Calls of `functions` that give `keyword` neither by name nor as positional argument `position`."""

    def check(project: Project) -> Iterator[Hit]:
        for module, call in project.calls_to(functions):
            named = {k.arg for k in call.keywords}
            if keyword in named or None in named or len(call.args) > position:
                continue
            if any(isinstance(a, ast.Starred) for a in call.args):
                continue
            yield Hit(module, call, say.format(call=module.snippet(call.func)))

    return check


def _strips_prefix(project: Project) -> bool:
    """The project handles the `module.` prefix itself (`k.replace("module.", "")`, `k[7:]` after a check)."""
    for module in project.modules:
        for node in module.nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value in ("module", "module.") or node.value.startswith("module.")):
                return True
            if isinstance(node, ast.Attribute) and node.attr == "consume_prefix_in_state_dict_if_present":
                return True
    return False


def _wraps(project: Project, module: Module, value: ast.AST, wrappers: set[str]) -> bool:
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            name = module.resolve(node.func)
            if name and project.lookup(name) in wrappers:
                return True
    return False


def _bound_to_wrapper(project: Project, module: Module, scope: ast.AST, target: str, line: int,
                      wrappers: set[str]) -> bool:
    """The last binding of `target` before `line` in `scope` wraps a model in DDP; for `self.x`, any binding of
    the class does."""
    latest: tuple[int, ast.AST] | None = None
    for node in module.own(scope):
        if (isinstance(node, ast.Assign) and node.lineno < line and any(dotted(t) == target for t in node.targets)
                and (latest is None or node.lineno > latest[0])):
            latest = (node.lineno, node.value)
    if latest is not None:
        return _wraps(project, module, latest[1], wrappers)
    if target.startswith("self."):
        return any(isinstance(n, ast.Assign) and any(dotted(t) == target for t in n.targets)
                   and _wraps(project, module, n.value, wrappers) for n in module.nodes)
    return False


def _is_save(call: ast.Call) -> bool:
    return "save" in (last_name(call.func) or "").lower()


def _saved(module: Module, call: ast.Call, scope: ast.AST) -> bool:
    """The state dict reaches a `*save*(...)` call: inside its arguments, or through the name it is stored in."""
    statement: ast.AST = call
    for child, parent in module.ancestors(call):
        if isinstance(parent, ast.Call) and child is not parent.func and _is_save(parent):
            return True
        if isinstance(parent, ast.stmt):
            statement = parent
            break
    names: set[str] = set()
    if isinstance(statement, ast.Assign):
        for target in statement.targets:
            base = target.value if isinstance(target, ast.Subscript) else target
            if isinstance(base, ast.Name):
                names.add(base.id)
    for node in ast.walk(scope):
        if isinstance(node, ast.Call) and _is_save(node) and node.lineno >= statement.lineno:
            used = {n.id for a in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(a)
                    if isinstance(n, ast.Name)}
            if used & names:
                return True
    return False


def _reloaded(scope: ast.AST, target: str) -> bool:
    """The same function reads a checkpoint back into the wrapper (`ddp.load_state_dict(...)`, or the wrapper
    handed to a `*load*`/`*restart*`/`*resume*` helper): a resume checkpoint, consistent with itself."""
    for node in own_nodes(scope):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "load_state_dict" and dotted(func.value) == target:
            return True
        callee = (last_name(func) or "").lower()
        if any(word in callee for word in ("load", "restart", "resume")):
            given = [*node.args, *(k.value for k in node.keywords)]
            if any(dotted(arg) == target for arg in given):
                return True
    return False


def check_wrapper_state_dict(project: Project) -> Iterator[Hit]:
    """`ddp_model.state_dict()` saved, where ddp_model is the DistributedDataParallel wrapper itself."""
    if _strips_prefix(project):
        return
    wrappers = project.subclasses({DDP_CLASS})
    for module in project.modules:
        for call in module.nodes:
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "state_dict" and not call.args):
                continue
            scope = module.enclosing_function(call) or module.tree
            target = dotted(call.func.value)
            if (target and _bound_to_wrapper(project, module, scope, target, call.lineno, wrappers)
                    and _saved(module, call, scope) and not _reloaded(scope, target)):
                yield Hit(module, call, f"`{module.snippet(call)}` is the DistributedDataParallel wrapper's: its "
                                        "keys start with `module.`")
