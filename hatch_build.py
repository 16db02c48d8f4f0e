"""The build hook: the scanner's compiled bulk path (ddpslurm/analyze/read/_bulk.c) compiled with the interpreter's
own compiler settings (sysconfig) into the wheel (which then has this platform's tag) or, for an editable install,
beside its source in the tree (git-ignored). Without a compiler, or when the compile fails, the build goes on pure
Python with a one-line note, and ddpslurm reads logs on its pure-Python path (ddpslurm/analyze/read/bulk.py).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("ddpslurm") / "analyze" / "read" / "_bulk.c"
#: the one line printed when the extension is not built
NOTE = "ddpslurm: the compiled scanner was not built ({why}); analyze reads logs on its pure-Python path"


def compile_command(source: Path, target: Path) -> list[str]:
    """gcc (or the interpreter's CC) as sysconfig says the interpreter's extensions are compiled and linked, in one
    step, without debug information."""
    def var(name: str) -> list[str]:
        return shlex.split(os.environ.get(name) or sysconfig.get_config_var(name) or "")

    link = var("LDSHARED") or ["cc", "-shared"]
    return [*link, *var("CFLAGS"), *var("CCSHARED"), "-g0", "-I", sysconfig.get_paths()["include"], str(source),
            "-o", str(target)]


def build_extension(root: Path, target: Path) -> str | None:
    """Compile the extension into `target`; None when built, else why not (one line)."""
    command = compile_command(root / SOURCE, target)
    if shutil.which(command[0]) is None:
        return f"no compiler {command[0]!r} found"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the compiler failed to run: {error}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"the compile failed: {last[:200]}"
    return None


class CustomBuildHook(BuildHookInterface):
    """Compiles `_bulk.c` for the wheel and for an editable install; never fails the build for it."""

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or os.environ.get("DDPSLURM_PURE_BUILD", "") not in ("", "0"):
            return
        root = Path(self.root)
        name = "_bulk" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
        if version == "editable":  # found where the tree's .py files are: beside its source
            target = root / SOURCE.parent / name
        else:
            self._tmp = tempfile.mkdtemp(prefix="ddpslurm-build-")
            target = Path(self._tmp) / name
        why = build_extension(root, target)
        if why is not None:
            self.app.display_warning(NOTE.format(why=why))
            return
        if version != "editable":
            build_data["force_include"][str(target)] = str(SOURCE.parent / name)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
