"""Which ranks reach a statement: `if rank == 0:` / `if dist.get_rank() == 0` / `if is_main_process():` tests,
their `else` branches, early exits (`if rank != 0: return`) and rank-zero-only decorators.

`guard_of(module, node)` climbs from a node to its function and answers ZERO (only rank 0, or local rank 0, reaches
it), OTHERS (every rank but 0), ALL (no rank test on the way) or None (tests that contradict each other).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ddpslurm.lint.source import Module, dotted, last_name

ZERO, OTHERS, ALL = "zero", "others", "all"
#: names that hold a rank: `rank`, `local_rank`, `args.rank`, `ddp_rank`, `global_rank`, `rank_id`
RANK_NAME = re.compile(r"(?i)(?:^|_)rank(?:_?(?:id|idx|index|num))?$")
#: calls that return a rank
RANK_CALL = re.compile(r"(?i)^(?:get_(?:global_|local_|node_)?rank|(?:global_|local_)?rank)$")
#: names and calls that say "this is the main process": is_main_process(), master_process, args.is_master, ...
MAIN_NAME = re.compile(
    r"(?i)^(?:is_(?:local_|global_)?(?:master|main|chief|primary|leader|rank_?0|rank_?zero|zero)(?:_\w+)?"
    r"|(?:local_|global_)?(?:master|main)_(?:process|proc|rank|worker|node|gpu)"
    r"|rank_?(?:0|zero)(?:_only)?|is_global_zero|on_rank_?zero|is_first_rank)$")
#: decorators whose function body runs on rank 0 only (Lightning's rank_zero_only and look-alikes)
ZERO_DECORATOR = re.compile(r"(?i)^(?:rank_?zero_only|master_only|main_process_only|on_main_process|rank0_only)$")
_EXIT_CALLS = {"exit", "sys.exit", "os._exit", "quit"}
_DIST_FLAG = re.compile(r"(?i)^(?:is_|use_)?(?:distributed|ddp|dist|multi_?gpu|multiprocessing_distributed)$")
_DIST_CALL = re.compile(r"(?i)^(?:is_initialized|is_dist_avail_and_initialized|is_distributed|is_dist)$")
_DIST_COUNT = re.compile(r"(?i)(?:^|_)(?:world_size|num_gpus|n_gpus?|ngpus\w*|num_replicas|nprocs|num_processes)$")
DIST, LOCAL = "distributed", "local"


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (0, "0") and not isinstance(node.value, bool)


def _zero_set(node: ast.AST) -> bool:
    """`[0]`, `(-1, 0)`, `{0}`: the ranks of a single-process run and rank 0."""
    if not isinstance(node, (ast.List, ast.Tuple, ast.Set)) or not node.elts:
        return False
    values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
    if any(isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) for e in node.elts):
        values = [v for v in values if v is not None] + [-1]
    return 0 in values and all(v in (0, -1, "0", "-1") for v in values)


def is_rank_expr(node: ast.AST) -> bool:
    """A value that is a rank: a rank-named variable or attribute, a rank getter call, `rank % gpus_per_node`."""
    if isinstance(node, ast.Call):
        name = last_name(node.func)
        if name and RANK_CALL.match(name):
            return True
        return bool(name in ("int", "str") and node.args and is_rank_expr(node.args[0]))
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = last_name(node)
        return bool(name and RANK_NAME.search(name))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return is_rank_expr(node.left)
    if isinstance(node, ast.Subscript):  # os.environ["LOCAL_RANK"]
        key = node.slice
        return isinstance(key, ast.Constant) and isinstance(key.value, str) and bool(RANK_NAME.search(key.value))
    return False


def _compare_polarity(node: ast.Compare) -> str | None:
    if len(node.ops) != 1:
        return None
    left, op, right = node.left, node.ops[0], node.comparators[0]
    if not is_rank_expr(left):
        if not is_rank_expr(right):
            return None
        left, right = right, left
        op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}.get(type(op), op)
    if _is_zero(right):
        if isinstance(op, (ast.Eq, ast.Is, ast.LtE)):
            return ZERO
        if isinstance(op, (ast.NotEq, ast.IsNot, ast.Gt)):
            return OTHERS
    if isinstance(right, ast.Constant) and right.value == 1 and not isinstance(right.value, bool):
        return ZERO if isinstance(op, ast.Lt) else OTHERS if isinstance(op, ast.GtE) else None
    if _zero_set(right):
        return ZERO if isinstance(op, ast.In) else OTHERS if isinstance(op, ast.NotIn) else None
    return None


def flip(polarity: str | None) -> str | None:
    return {ZERO: OTHERS, OTHERS: ZERO}.get(polarity or "")


def branches(test: ast.AST) -> tuple[str | None, str | None]:
    """(polarity of the `if` body, polarity of its `else`) for a test. `rank == 0 and x` holds on rank 0 only,
    but its `else` runs on rank 0 too when x is false: (ZERO, None)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        body, orelse = branches(test.operand)
        return orelse, body
    if isinstance(test, ast.BoolOp):
        found = [branches(v)[0] for v in test.values]
        known = {p for p in found if p}
        if len(known) != 1:
            return None, None
        polarity = known.pop()
        every = all(p == polarity for p in found)
        if isinstance(test.op, ast.And):  # the body needs every operand, the else only one to fail
            return polarity, flip(polarity) if every else None
        return (polarity if every else None), flip(polarity)
    polarity = _simple_polarity(test)
    return polarity, flip(polarity)


def rank_polarity(test: ast.AST) -> str | None:
    """ZERO when `test` holds on rank 0 only, OTHERS when it holds on every other rank only, else None."""
    return branches(test)[0]


def _simple_polarity(test: ast.AST) -> str | None:
    if isinstance(test, ast.Compare):
        return _compare_polarity(test)
    if isinstance(test, ast.Call):
        name = last_name(test.func)
        return ZERO if name and MAIN_NAME.match(name) else None
    if isinstance(test, (ast.Name, ast.Attribute)):
        name = last_name(test)
        return ZERO if name and MAIN_NAME.match(name) else None
    return None


def ends_in_exit(body: list[ast.stmt]) -> bool:
    """The block's last statement leaves it: return, raise, continue, break, sys.exit()."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    return (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
            and dotted(last.value.func) in _EXIT_CALLS)


def _block_of(parent: ast.AST, child: ast.AST) -> list[ast.stmt] | None:
    for name in ("body", "orelse", "finalbody", "handlers"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and child in block:
            return block
    return None


def _early_exits(parent: ast.AST, child: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Polarities set by the statements before `child` in its block: `if rank != 0: return` leaves rank 0 only."""
    block = _block_of(parent, child)
    if block is None:
        return
    for stmt in block[: block.index(child)]:
        if isinstance(stmt, ast.If) and not stmt.orelse and ends_in_exit(stmt.body):
            polarity = branches(stmt.test)[1]
            if polarity:
                yield polarity, stmt


def guards(module: Module, node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every rank test between `node` and its function: (polarity, the `if` or `def` that sets it)."""
    for child, parent in module.ancestors(node):
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            body, orelse = branches(parent.test)
            in_body = child in parent.body if isinstance(parent, ast.If) else child is parent.body
            polarity = body if in_body else orelse
            if polarity:
                yield polarity, parent
        yield from _early_exits(parent, child)
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for decorator in getattr(parent, "decorator_list", ()):
                name = last_name(decorator)
                if name and ZERO_DECORATOR.match(name):
                    yield ZERO, parent
            return


def guard_of(module: Module, node: ast.AST) -> tuple[str | None, ast.AST | None]:
    """(ZERO/OTHERS/ALL/None, the innermost guard) for `node` within its function."""
    found = list(guards(module, node))
    kinds = {polarity for polarity, _ in found}
    if not kinds:
        return ALL, None
    if len(kinds) > 1:
        return None, found[0][1]
    return kinds.pop(), found[0][1]


def dist_polarity(test: ast.AST) -> str | None:
    """DIST when `test` holds in a distributed run only (`args.distributed`, `world_size > 1`), LOCAL for the
    opposite (`local_rank == -1`, `not dist.is_initialized()`), else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        found = dist_polarity(test.operand)
        return {DIST: LOCAL, LOCAL: DIST}.get(found or "")
    if isinstance(test, ast.BoolOp):
        found = {dist_polarity(v) for v in test.values} - {None}
        return found.pop() if len(found) == 1 and isinstance(test.op, ast.And) else None
    if isinstance(test, (ast.Name, ast.Attribute)):
        return DIST if _DIST_FLAG.match(last_name(test) or "") else None
    if isinstance(test, ast.Call):
        return DIST if _DIST_CALL.match(last_name(test.func) or "") else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant):
        left, op, value = test.left, test.ops[0], test.comparators[0].value
        name = last_name(left) or ""
        if _DIST_COUNT.search(name) and value in (1, 2):
            more = {(ast.Gt, 1), (ast.GtE, 2), (ast.NotEq, 1)}
            return DIST if (type(op), value) in more else LOCAL if (type(op), value) in {
                (ast.Eq, 1), (ast.LtE, 1), (ast.Lt, 2)} else None
        if is_rank_expr(left) and value == -1:
            return DIST if isinstance(op, (ast.NotEq, ast.Gt)) else LOCAL if isinstance(op, ast.Eq) else None
    return None


def local_only(module: Module, node: ast.AST) -> bool:
    """`node` runs only when the script is not distributed (`if not args.distributed:`, the else of `if ddp:`)."""
    for child, parent in module.ancestors(node):
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            found = dist_polarity(parent.test)
            in_body = child in parent.body if isinstance(parent, ast.If) else child is parent.body
            if (found == LOCAL and in_body) or (found == DIST and not in_body):
                return True
    return False
