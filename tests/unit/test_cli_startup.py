"""The CLI must start without importing the heavy dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "pandas", "submitit", "numpy")


def _modules_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_cli_imports_no_heavy_module() -> None:
    loaded = _modules_after("import ddpslurm.cli")
    assert not [m for m in HEAVY if m in loaded]


def test_help_imports_no_heavy_module() -> None:
    loaded = _modules_after(
        "import ddpslurm.cli\n"
        "try:\n    ddpslurm.cli.cli.main(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass"
    )
    assert not [m for m in HEAVY if m in loaded]
    assert "ddpslurm.cli" in loaded


def test_help_exits_zero_and_lists_commands() -> None:
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    assert "Usage:" in done.stdout


def test_unknown_command_is_a_usage_error_without_traceback() -> None:
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "frobnicate"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
