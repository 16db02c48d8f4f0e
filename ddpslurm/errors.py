"""One exception root for everything ddpslurm reports to a person.

Every error carries a message (what is wrong) and a hint (what to do). The CLI maps the classes to
exit codes in one place (`ddpslurm.cli.main`) and prints them as one line, without a traceback unless
`--debug` is given.
"""

from __future__ import annotations

from collections.abc import Sequence


class DdpSlurmError(Exception):
    """Root of ddpslurm's own errors. `exit_code` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """The message and the hint as a single line for a terminal."""
        text = self.message.rstrip(". ")
        return f"{text}. {self.hint}" if self.hint else f"{text}."


class UsageError(DdpSlurmError):
    """The command line itself is wrong (bad flag value, contradictory options)."""

    exit_code = 2


class EnvDerivationError(DdpSlurmError):
    """Slurm variables are missing or inconsistent, so ranks and addresses cannot be derived."""


class SlurmNotFoundError(DdpSlurmError):
    """A Slurm command (sbatch, srun, sacct, ...) is not on PATH."""


class SlurmCommandError(DdpSlurmError):
    """A Slurm command ran and failed; keeps the argv and its stderr for the message."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str, hint: str | None = None) -> None:
        first = next((ln.strip() for ln in stderr.splitlines() if ln.strip()), "no error output")
        super().__init__(f"`{argv[0]}` failed with exit code {returncode}: {first}", hint)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


class SubmitError(DdpSlurmError):
    """A job could not be planned or submitted (missing script, unwritable folder, ...)."""


class LintRefusedError(SubmitError):
    """`submit --lint error`: the script has error-level findings of `ddpslurm lint`, so nothing was submitted."""


class JobNotFoundError(DdpSlurmError):
    """A job id or job folder that ddpslurm cannot find."""


class AnalyzeInputError(DdpSlurmError):
    """A path given to `analyze` cannot be read as logs at all."""


class TemplateError(DdpSlurmError):
    """An unknown template name or a value that cannot go into a template."""
