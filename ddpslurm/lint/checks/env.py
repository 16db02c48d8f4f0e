"""DDP004: the script overwrites the rendezvous variables the launcher set. DDP011: it spawns its own ranks."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpslurm.lint.model import WARN, Hit
from ddpslurm.lint.project import Project
from ddpslurm.lint.source import Module
from ddpslurm.lint.values import Values

#: what srun (through ddpslurm) and torchrun set on every rank
LAUNCHER_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
#: a test naming one of these (or reading the environment) decides by what the launcher set
_ENV_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "PMI_", "TORCHELASTIC_", "GROUP_RANK", "LOCAL_WORLD_SIZE")
SPAWNERS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
_ENV_READERS = frozenset({"os.environ", "os.getenv", "os.environ.get"})


def _is_environ(module: Module, node: ast.AST) -> bool:
    return module.resolve(node) == "os.environ"


def _env_word(value: object) -> bool:
    return isinstance(value, str) and (value in LAUNCHER_VARS or value.startswith(_ENV_PREFIXES))


def mentions_environment(module: Module, test: ast.AST) -> bool:
    """`test` reads the environment: `"RANK" in os.environ`, `os.environ.get("MASTER_ADDR")`, `"SLURM_PROCID"`."""
    for node in ast.walk(test):
        if isinstance(node, ast.Constant) and _env_word(node.value):
            return True
        if isinstance(node, (ast.Name, ast.Attribute)) and module.resolve(node) in _ENV_READERS:
            return True
    return False


def _decided_by_environment(module: Module, node: ast.AST, value: ast.AST | None = None) -> bool:
    """An enclosing `if`/`while` (either branch) tests the environment, so the script yields to the launcher; or
    it tests the very value written (`if port is not None:`), an override made only when someone asks for it."""
    used = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} if value is not None else set()
    for child, parent in module.ancestors(node):
        if not isinstance(parent, (ast.If, ast.IfExp, ast.While)) or child is parent.test:
            continue
        if mentions_environment(module, parent.test):
            return True
        if used & {n.id for n in ast.walk(parent.test) if isinstance(n, ast.Name)}:
            return True
    return False


def _reads_same(module: Module, value: ast.AST, key: str) -> bool:
    """`os.environ.get("MASTER_PORT", "29500")`: the launcher's value is kept when there is one."""
    for node in ast.walk(value):
        if (isinstance(node, ast.Call) and module.resolve(node.func) in ("os.environ.get", "os.getenv")
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == key):
            return True
        if (isinstance(node, ast.Subscript) and _is_environ(module, node.value)
                and isinstance(node.slice, ast.Constant) and node.slice.value == key):
            return True
    return False


def _writes(module: Module) -> Iterator[tuple[ast.AST, str, ast.AST | None]]:
    """(node, variable, value) for every write of a launcher variable: `os.environ[K] = v`, `.update`, putenv."""
    for node in module.nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (isinstance(target, ast.Subscript) and _is_environ(module, target.value)
                        and isinstance(target.slice, ast.Constant) and target.slice.value in LAUNCHER_VARS):
                    yield node, str(target.slice.value), node.value
        elif isinstance(node, ast.Call):
            name = module.resolve(node.func)
            if name == "os.environ.update":
                for keyword in node.keywords:
                    if keyword.arg in LAUNCHER_VARS:
                        yield node, keyword.arg, keyword.value
                for arg in node.args[:1]:
                    if isinstance(arg, ast.Dict):
                        for key, value in zip(arg.keys, arg.values, strict=False):
                            if isinstance(key, ast.Constant) and key.value in LAUNCHER_VARS:
                                yield node, str(key.value), value
            elif name in ("os.putenv", "os.environ.__setitem__") and len(node.args) >= 2:
                key = node.args[0]
                if isinstance(key, ast.Constant) and key.value in LAUNCHER_VARS:
                    yield node, str(key.value), node.args[1]


def _sources(module: Module, expr: ast.AST, values: Values, depth: int = 0) -> set[str]:
    """What a value is made of: the environment variables it reads, `submitit` (its JobEnvironment, which reads
    Slurm's variables) and `mpi` (mpi4py's communicator), following the names it uses through their bindings."""
    found: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and module.resolve(node.func) in ("os.environ.get", "os.getenv"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
        elif isinstance(node, ast.Subscript) and _is_environ(module, node.value):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                found.add(node.slice.value)
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = module.resolve(node) or ""
            if name.startswith("submitit"):
                found.add("submitit")
            elif name.startswith("mpi4py"):
                found.add("mpi")
            elif depth < 3 and not isinstance(getattr(node, "ctx", None), ast.Store):
                for where, bound in values.bindings(module, node):
                    found |= _sources(where, bound, values, depth + 1)
    return found


def _from_slurm(sources: set[str]) -> bool:
    """Made of Slurm's own variables only: what srun's one task per GPU gives too (SLURM_PROCID is RANK)."""
    return bool(sources) and all(s == "submitit" or s.startswith("SLURM_") for s in sources)


def _from_other_launcher(sources: set[str]) -> bool:
    return any(s == "mpi" or s.startswith(("OMPI_", "PMI_", "PMIX_", "MV2_", "MPI_")) for s in sources)


def _in_submitit_callable(module: Module, node: ast.AST) -> bool:
    """A method of a submitit callable (a `submitit.helpers.Checkpointable`): it runs in a job the script submitted
    itself through submitit, where no other launcher set anything."""
    for _, parent in module.ancestors(node):
        if isinstance(parent, ast.ClassDef):
            return any((module.resolve(base) or "").startswith("submitit.") for base in parent.bases)
    return False


def _conditional(module: Module, node: ast.AST) -> bool:
    """Inside an `if` branch (other than `if __name__ == "__main__":`) of its function."""
    for child, parent in module.ancestors(node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test and not _main_guard(parent.test):
            return True
    return False


def check_env_overrides(project: Project) -> Iterator[Hit]:
    """Writes of MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK that replace the launcher's values
    (setdefault, a guard on the environment, a copy of Slurm's own values, another launcher's behind an `if`
    are fine)."""
    values = Values.of(project)
    for module in project.modules:
        if "environ" not in module.text and "putenv" not in module.text:
            continue
        for node, key, value in _writes(module):
            if _decided_by_environment(module, node, value):
                continue
            if value is not None and _reads_same(module, value, key):
                continue
            sources = _sources(module, value, values) if value is not None else set()
            if _from_slurm(sources) or (_from_other_launcher(sources) and _conditional(module, node)):
                continue
            if _in_submitit_callable(module, node):
                continue
            shown = module.snippet(value, 40) if value is not None else "..."
            yield Hit(module, node, f"sets {key} to `{shown}` whatever the launcher set",
                      WARN if key == "MASTER_PORT" else None)


def _main_guard(test: ast.AST) -> bool:
    """`if __name__ == "__main__":` runs on every rank."""
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__")


def check_spawn(project: Project) -> Iterator[Hit]:
    """torch.multiprocessing.spawn/start_processes, unless a test of the environment decides it; a warning
    when some other condition (a flag) decides it."""
    for module, call in project.calls_to(SPAWNERS):
        if _decided_by_environment(module, call):
            continue
        condition = next(((child, parent) for child, parent in module.ancestors(call)
                          if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test
                          and not _main_guard(parent.test)), None)
        text = f"`{module.snippet(call.func)}()` starts more processes inside each rank the launcher started"
        if condition is None:
            yield Hit(module, call, text)
            continue
        child, parent = condition
        in_body = child in parent.body if isinstance(parent, ast.If) else child is parent.body
        when = "when" if in_body else "unless"
        yield Hit(module, call, f"{text} ({when} `{module.snippet(parent.test, 50)}`)", WARN)
