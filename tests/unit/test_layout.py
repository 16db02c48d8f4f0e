"""The package's shape: small files, classes and functions, an import graph without cycles, stage folders that
import only downstream of the data's way, and one module that spells the job folder's file names."""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ddpslurm"
MAX_FILE_LINES = 600
MAX_CLASS_LINES = 200
MAX_FUNCTION_LINES = 60
#: The analyzer's stages in the order data flows through them: a stage imports only stages before it (and model.py).
STAGES = ("rules", "read", "parse", "diagnose", "report")
#: The job folder's file names (ddpslurm/jobfolder.py), as a string constant elsewhere would spell them, plain or in a
#: regex (backslashes are dropped before the search): no other module may hold one.
JOB_FOLDER_NAMES = re.compile(r"\.(?:start|exit|signal|heartbeat)\.json|\.stacks\.txt|\.fr_trace\.json|"
                              r"(?<![\w])(?:attempt|job)_(?![a-z])|\b(?:hang|requeue|retries|ddpslurm)\.json|"
                              r"_log\.(?:out|err)|_(?:submitted|result)\.pkl|ddpslurm_jobs")


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def oversized(path: Path) -> list[str]:
    found = []
    lines = path.read_text().count("\n")
    if lines > MAX_FILE_LINES:
        found.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines")
    for node in ast.walk(tree(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if length > limit:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_file_class_or_function_is_oversized() -> None:
    found = [line for path in modules() for line in oversized(path)]
    assert not found, (f"over {MAX_FILE_LINES} lines a file, {MAX_CLASS_LINES} a class or {MAX_FUNCTION_LINES} a "
                       "function (split by concern):\n" + "\n".join(found))


def imports_of(path: Path) -> set[str]:
    """The ddpslurm modules `path` imports anywhere (module level or inside a function): `from a import b` counts
    `a.b` when that is a module of the package, else `a`."""
    known = {module_name(p) for p in modules()}
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "ddpslurm")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "ddpslurm":
                continue
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in out if m in known and m != here}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in modules()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def collapsed(edges: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The graph between packages: each module named by its first `depth` parts (ddpslurm.analyze.parse.scan ->
    ddpslurm.analyze at depth 2); a package's own __init__ and its modules are one node."""
    out: dict[str, set[str]] = defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            pa, pb = ".".join(a.split(".")[:depth]), ".".join(b.split(".")[:depth])
            if pa != pb:
                out[pa].add(pb)
    return out


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def test_a_main_guard_comes_last() -> None:
    """`python -m ddpslurm.X` runs the module's statements in order: a function defined below its
    `if __name__ == "__main__":` does not exist yet when main() runs (a NameError only a real run shows)."""
    late = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for path in modules()
            for i, node in enumerate(tree(path).body) if _is_main_guard(node) and i != len(tree(path).body) - 1]
    assert not late, f"statements after the main guard: {late}"


def test_no_import_cycle_between_modules() -> None:
    assert not cycles(graph()), "modules that import each other (directly or around a loop)"


@pytest.mark.parametrize("depth", [2, 3])
def test_no_import_cycle_between_packages(depth: int) -> None:
    assert not cycles(collapsed(graph(), depth)), "packages that import each other (analyze <-> doctor and the like)"


def test_stages_import_only_upstream() -> None:
    wrong = []
    for module, targets in graph().items():
        parts = module.split(".")
        if len(parts) < 3 or parts[1] != "analyze" or parts[2] not in STAGES:
            continue
        mine = STAGES.index(parts[2])
        for target in targets:
            tparts = target.split(".")
            if len(tparts) >= 3 and tparts[1] == "analyze":
                if tparts[2] in STAGES and STAGES.index(tparts[2]) > mine:
                    wrong.append(f"{module} imports {target} (downstream)")
                elif tparts[2] in ("api", "command"):
                    wrong.append(f"{module} imports {target} (the entry points)")
    assert not wrong, "\n".join(wrong)


def test_cycle_finder_finds_a_loop() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def string_constants(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module but its docstrings (module, class and function)."""
    docstrings = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree(path))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_job_folder_names_are_spelled_in_one_module() -> None:
    spelled = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text[:80]!r}"
               for path in modules() if path.name != "jobfolder.py"
               for line, text in string_constants(path) if JOB_FOLDER_NAMES.search(text.replace("\\", ""))]
    assert not spelled, "job-folder file names outside ddpslurm/jobfolder.py:\n" + "\n".join(spelled)


@pytest.mark.parametrize(("text", "spelled"), [
    ("rank_3.exit.json", True), (r"rank_\d{1,7}\.fr_trace\.json", True), (r"^attempt_(?P<n>\d+)$", True),
    ("job_", True), ("%j_%t_log.out", True), ("ddpslurm_jobs", True), ("hang.json", True),
    ("attempt_start", False), ("job_id", False), ("fr_trace", False), ("exit_record", False), ("error.json", False),
])
def test_job_folder_names_are_recognised(text: str, spelled: bool) -> None:
    assert bool(JOB_FOLDER_NAMES.search(text.replace("\\", ""))) is spelled


def test_every_stage_says_what_goes_in_and_out() -> None:
    for stage in STAGES:
        doc = ast.get_docstring(tree(PACKAGE / "analyze" / stage / "__init__.py")) or ""
        assert "In:" in doc and "Out:" in doc, f"analyze/{stage}/__init__.py: say what goes in and what comes out"
