"""The script and the modules it imports from its own folder: what the rules look at, with an index of
functions and classes to follow calls and subclasses across those files."""

from __future__ import annotations

import ast
import tokenize
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ddpslurm.lint.source import Module, canonical, parse_module

#: modules read besides the script, nearest imports first; a training repo's own package rarely needs more
MAX_MODULES = 120
#: a source file larger than this is no training script (a generated or data file)
MAX_BYTES = 4 * 1024 * 1024
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


class SourceError(Exception):
    """A file that cannot be read as Python source text (missing, not text, too large)."""


@dataclass(frozen=True)
class Function:
    """A function or method of the project, under its qualified name (`utils.save`, `train.Trainer.fit`)."""

    module: Module
    node: FunctionNode
    qualname: str


@dataclass
class Broken:
    """A project file that does not parse: the script itself or a module it imports."""

    path: Path
    line: int
    column: int
    message: str


@dataclass
class Project:
    """The script (first module) and its local imports, parsed, with the functions and classes indexed."""

    script: Path
    modules: list[Module] = field(default_factory=list)
    broken: list[Broken] = field(default_factory=list)
    skipped: int = 0
    functions: dict[str, Function] = field(default_factory=dict)
    classes: dict[str, tuple[Module, ast.ClassDef]] = field(default_factory=dict)
    by_name: dict[str, Module] = field(default_factory=dict)
    calls: dict[int, list[tuple[ast.Call, str | None]]] = field(default_factory=dict)
    memo: dict[str, object] = field(default_factory=dict)

    def module_calls(self, module: Module) -> list[tuple[ast.Call, str | None]]:
        """Every call of `module` with the canonical name of its callee (None when it is no known name)."""
        return self.calls[id(module)]

    def all_calls(self) -> Iterator[tuple[Module, ast.Call, str | None]]:
        for module in self.modules:
            for call, name in self.module_calls(module):
                yield module, call, name

    def calls_to(self, names: Iterable[str]) -> Iterator[tuple[Module, ast.Call]]:
        wanted = set(names)
        for module, call, name in self.all_calls():
            if name in wanted:
                yield module, call

    def lookup(self, qualname: str, depth: int = 0) -> str:
        """Follow re-exports (`from .dist import save` in a package's `__init__`) to where a name is defined."""
        if qualname in self.functions or qualname in self.classes or depth > 5:
            return qualname
        owner, _, attr = qualname.rpartition(".")
        module = self.by_name.get(owner)
        if module is not None and attr in module.aliases:
            target = canonical(module.aliases[attr])
            if target != qualname:
                return self.lookup(target, depth + 1)
        return qualname

    def function_for(self, module: Module, call: ast.Call) -> Function | None:
        """The project function a call runs: a nested def, `self.method()`, a module function, an import."""
        func = call.func
        if isinstance(func, ast.Name):
            for _, parent in module.ancestors(call):
                if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for stmt in parent.body:
                        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == func.id:
                            return Function(module, stmt, f"{module.name}.{parent.name}.{stmt.name}")
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            for _, parent in module.ancestors(call):
                if isinstance(parent, ast.ClassDef):
                    return self.functions.get(f"{module.name}.{parent.name}.{func.attr}")
        name = module.resolve(func)
        return self.functions.get(self.lookup(name)) if name else None

    def subclasses(self, bases: Iterable[str]) -> set[str]:
        """`bases` and every project class deriving from one of them, directly or through other project classes."""
        found = set(bases)
        changed = True
        while changed:
            changed = False
            for qualname, (module, node) in self.classes.items():
                if qualname in found:
                    continue
                names = {self.lookup(n) for n in (module.resolve(b) for b in node.bases) if n}
                if names & found:
                    found.add(qualname)
                    changed = True
        return found

    def has_attribute(self, attr: str) -> bool:
        """Some file of the project reads or calls `.attr`, or names it in a string (`getattr(x, "attr")`)."""
        for module in self.modules:
            for node in module.nodes:
                if isinstance(node, ast.Attribute) and node.attr == attr:
                    return True
                if isinstance(node, ast.Constant) and node.value == attr:
                    return True
        return False


def read_source(path: Path) -> str:
    """The text of a Python file, decoded as Python does (PEP 263 cookie, else UTF-8); SourceError if it is none."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise SourceError(f"is {size} bytes, too large for a training script")
        with path.open("rb") as handle:
            data = handle.read()
    except OSError as failed:
        raise SourceError(f"cannot be read: {failed.strerror or failed}") from None
    if b"\0" in data:
        raise SourceError("is not Python source (it holds NUL bytes)")
    try:
        encoding, _ = tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        raise SourceError("is not Python source text (it does not decode as UTF-8 or its declared encoding)") from None


def _imported_names(module: Module, is_package: bool) -> Iterator[str]:
    """Dotted names a module imports, with every parent package (`a.b.c` gives `a`, `a.b`, `a.b.c`)."""
    for node in module.nodes:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.name.split(".") if module.name else []
                if not is_package:
                    parts = parts[:-1]
                parts = parts[: max(len(parts) - (node.level - 1), 0)]
                base = ".".join(p for p in (".".join(parts), base) if p)
            names = [base] + [f"{base}.{a.name}" if base else a.name for a in node.names if a.name != "*"]
        else:
            continue
        for name in names:
            parts = name.split(".")
            for end in range(1, len(parts) + 1):
                yield ".".join(parts[:end])


def _local_file(root: Path, name: str) -> tuple[Path, bool] | None:
    """The file of module `name` under `root` (`a/b.py` or `a/b/__init__.py`), and whether it is a package."""
    if not name or not all(part.isidentifier() for part in name.split(".")):
        return None
    base = root.joinpath(*name.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    return None


def import_roots(script: Path, extra: Iterable[Path] = ()) -> list[Path]:
    """Where the script's imports are looked for: its folder; when that folder is a package, the folder above
    the outermost package too (`python -m pkg.train` finds `pkg` there); then `extra` folders."""
    roots = [script.parent]
    top = script.parent
    while (top / "__init__.py").is_file() and top.parent != top:
        top = top.parent
    if top != script.parent:
        roots.append(top)
    roots.extend(Path(p) for p in extra)
    return roots


def _find(roots: list[Path], name: str) -> tuple[Path, bool] | None:
    for root in roots:
        found = _local_file(root, name)
        if found is not None:
            return found
    return None


def load_project(script: Path, text: str, extra_roots: Iterable[Path] = ()) -> Project:
    """The script (already read as `text`) and, breadth first, the modules it imports from its folder (see
    `import_roots`)."""
    project = Project(script=script)
    roots = import_roots(script, extra_roots)
    queue: deque[tuple[Path, str, bool, str | None]] = deque([(script, script.stem, False, text)])
    seen = {script.resolve()}
    while queue:
        path, name, is_package, source = queue.popleft()
        if source is None:
            try:
                source = read_source(path)
            except SourceError:
                continue
        module = _parse(project, path, name, source, is_package)
        if module is None:
            continue
        for imported in _imported_names(module, is_package):
            found = _find(roots, imported)
            if found is None or found[0].resolve() in seen:
                continue
            seen.add(found[0].resolve())
            if len(seen) > MAX_MODULES + 1:
                project.skipped += 1
                continue
            queue.append((found[0], imported, found[1], None))
    return project


def _parse(project: Project, path: Path, name: str, source: str, is_package: bool) -> Module | None:
    try:
        module = parse_module(path, name, source, is_package)
    except SyntaxError as failed:
        project.broken.append(Broken(path, failed.lineno or 1, failed.offset or 1, failed.msg or "invalid syntax"))
        return None
    except (ValueError, RecursionError, MemoryError) as failed:
        project.broken.append(Broken(path, 1, 1, str(failed) or type(failed).__name__))
        return None
    project.modules.append(module)
    project.by_name[name] = module
    _index(project, module)
    return module


def _index(project: Project, module: Module) -> None:
    """Functions, methods and classes under their qualified names; every call with its resolved callee."""
    for node in module.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            project.functions[f"{module.name}.{node.name}"] = Function(module, node, f"{module.name}.{node.name}")
        elif isinstance(node, ast.ClassDef):
            project.classes[f"{module.name}.{node.name}"] = (module, node)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    qualname = f"{module.name}.{node.name}.{item.name}"
                    project.functions[qualname] = Function(module, item, qualname)
    project.calls[id(module)] = [(n, module.resolve(n.func)) for n in module.nodes if isinstance(n, ast.Call)]
