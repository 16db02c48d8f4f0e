"""One Python file as the linter reads it: its tree, parent links, import aliases and suppression comments.

Names are resolved the way the file spells them: `import torch.distributed as dist` makes `dist.barrier` mean
`torch.distributed.barrier`, `from torch.nn.parallel import DistributedDataParallel as DDP` makes `DDP` the class,
and module-level functions and classes resolve to `<module>.<name>`. Resolved names are canonical: torch's
internal submodules (`distributed_c10d`, `parallel.distributed`, `utils.data.distributed`) are dropped.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: torch's internal module paths and the public path the same object has
_CANONICAL_PREFIXES = (
    ("torch.distributed.distributed_c10d.", "torch.distributed."),
    ("torch.nn.parallel.distributed.", "torch.nn.parallel."),
    ("torch.utils.data.distributed.", "torch.utils.data."),
    ("torch.utils.data.dataloader.", "torch.utils.data."),
    ("torch.utils.data.dataset.", "torch.utils.data."),
    ("torch.multiprocessing.spawn.", "torch.multiprocessing."),
)
_SUPPRESS = re.compile(r"#\s*ddpslurm:\s*ignore(?P<file>-file)?(?:\[(?P<ids>[A-Za-z0-9_,\s]*)\])?", re.IGNORECASE)
#: a suppression that names no rule: every rule
ALL = frozenset({"*"})
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def canonical(name: str) -> str:
    """`name` with torch's internal module paths replaced by the public ones."""
    for internal, public in _CANONICAL_PREFIXES:
        if name.startswith(internal):
            return public + name[len(internal):]
    return name


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, None for anything else (a call, a subscript)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def last_name(node: ast.AST) -> str | None:
    """The last identifier of a Name/Attribute (`args.local_rank` -> `local_rank`), or of a call's callee."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function (or module) body, not those of the functions and classes defined in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def scopes(module: Module) -> Iterator[ast.AST]:
    """The module itself and every function in it."""
    yield module.tree
    yield from module.functions


@dataclass
class Module:
    """A parsed file of the project. `name` is its dotted name relative to the script's folder."""

    path: Path
    name: str
    text: str
    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)
    line_ignores: dict[int, frozenset[str]] = field(default_factory=dict)
    file_ignores: frozenset[str] = frozenset()
    lines: list[str] = field(default_factory=list)
    nodes: list[ast.AST] = field(default_factory=list)
    functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=list)
    _own: dict[int, list[ast.AST]] = field(default_factory=dict)

    def own(self, scope: ast.AST) -> list[ast.AST]:
        """`own_nodes(scope)`, computed once per scope."""
        if id(scope) not in self._own:
            self._own[id(scope)] = list(own_nodes(scope))
        return self._own[id(scope)]

    def resolve(self, node: ast.AST) -> str | None:
        """The canonical qualified name `node` stands for, or None when its head is no import or definition."""
        text = dotted(node)
        if text is None:
            return None
        head, _, rest = text.partition(".")
        base = self.aliases.get(head)
        if base is None:
            return None
        return canonical(f"{base}.{rest}" if rest else base)

    def ancestors(self, node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        """(child, parent) pairs from `node` up to the module."""
        child = node
        while child in self.parents:
            parent = self.parents[child]
            yield child, parent
            child = parent

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        for _, parent in self.ancestors(node):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return parent
        return None

    def suppressed(self, rule: str, lines: tuple[int, ...]) -> bool:
        """A `# ddpslurm: ignore[...]` on one of `lines`, or an `ignore-file[...]` anywhere, covers `rule`."""
        if self.file_ignores & {rule, "*"}:
            return True
        return any(self.line_ignores.get(line, frozenset()) & {rule, "*"} for line in lines)

    def snippet(self, node: ast.AST, limit: int = 60) -> str:
        """The source text of `node` on one line, shortened to `limit` characters."""
        try:
            text = ast.unparse(node)
        except (ValueError, TypeError, RecursionError):  # an odd node: say nothing rather than fail
            return "..."
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_module(path: Path, name: str, text: str, is_package: bool = False) -> Module:
    """Parse `text`; raises SyntaxError (or ValueError for NUL bytes) as `ast.parse` does. `is_package`: an
    `__init__.py`, whose relative imports start from its own package."""
    tree = ast.parse(text, filename=str(path))
    module = Module(path=path, name=name, text=text, tree=tree, lines=text.splitlines())
    stack: list[ast.AST] = [tree]
    while stack:  # one pass: every node, its parent, the functions
        parent = stack.pop()
        module.nodes.append(parent)
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.functions.append(parent)
        for child in ast.iter_child_nodes(parent):
            module.parents[child] = parent
            stack.append(child)
    module.aliases = _aliases(module, name, is_package)
    if "ddpslurm" in text:
        module.line_ignores, module.file_ignores = _suppressions(text)
    return module


def _package_of(name: str, level: int, is_package: bool) -> str:
    """The package a relative import of `level` dots starts from, in module `name`."""
    parts = name.split(".") if name else []
    if not is_package:
        parts = parts[:-1]
    keep = len(parts) - (level - 1)
    return ".".join(parts[: max(keep, 0)])


def _aliases(module: Module, name: str, is_package: bool = False) -> dict[str, str]:
    """Local name -> qualified name: imports anywhere in the file, module-level definitions and plain aliases."""
    tree = module.tree
    aliases: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            aliases[node.name] = f"{name}.{node.name}" if name else node.name
    for node in module.nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    aliases.setdefault(head, head)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(name, node.level, is_package)
                base = ".".join(p for p in (package, base) if p)
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name
    _assignment_aliases(tree, aliases)
    return aliases


def _assignment_aliases(tree: ast.Module, aliases: dict[str, str]) -> None:
    """`DDP = torch.nn.parallel.DistributedDataParallel` at module level: `DDP` names the class too."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = dotted(node.value)
            if text and "." in text and text.split(".")[0] in aliases:
                head, _, rest = text.partition(".")
                aliases[node.targets[0].id] = f"{aliases[head]}.{rest}"


def _suppressions(text: str) -> tuple[dict[int, frozenset[str]], frozenset[str]]:
    """The `# ddpslurm: ignore[...]` comments per line and the `ignore-file[...]` ones, read as comment tokens."""
    per_line: dict[int, frozenset[str]] = {}
    whole: set[str] = set()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return per_line, frozenset()
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        for match in _SUPPRESS.finditer(token.string):
            ids = match.group("ids")
            named = frozenset(i.strip().upper() for i in ids.split(",") if i.strip()) if ids else ALL
            if match.group("file"):
                whole |= named
            else:
                per_line[token.start[0]] = per_line.get(token.start[0], frozenset()) | named
    return per_line, frozenset(whole)
