"""`ddpslurm lint`: static checks for the DDP mistakes that cost a night on the cluster, found before the job
is queued.

In: a training script (and the modules it imports from its own folder). Out: findings, each with a rule id,
level, file:line:column, message, why it breaks under DDP on Slurm, and the fix. Pure standard library (ast):
nothing here imports torch, the analyzer or the launcher (the launcher imports this, for `submit --lint`).
"""

from __future__ import annotations

from ddpslurm.lint.engine import LintReport, lint_paths, lint_script
from ddpslurm.lint.model import Finding
from ddpslurm.lint.rules import RULES

__all__ = ["RULES", "Finding", "LintReport", "lint_paths", "lint_script"]
