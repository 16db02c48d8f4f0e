"""Where the data folders (`analyzer/`, `sbatch_templates/`) are, installed or in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The shipped data folder `name`: inside the wheel (`ddpslurm/_data/name`) or beside the package."""
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"ddpslurm data folder {name!r} is missing from this installation")
