"""The `ddpslurm` command line: parse, call one library function, render. Nothing else.

Heavy modules (torch, pandas, submitit, rich) are imported inside the commands that need them, so
`ddpslurm --help` starts fast. All known errors become one line and an exit code in `main()`.
"""

from __future__ import annotations

import sys

import click

from ddpslurm import __version__
from ddpslurm.errors import DdpSlurmError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="ddpslurm")
@click.option("--debug", is_flag=True, help="Show full Python tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Launch PyTorch DDP scripts on Slurm, and tell why a multi-node job failed.

    \b
      ddpslurm submit train.py --nodes 2 --gpus-per-node 8 -- --lr 0.1
      ddpslurm status 1234
      ddpslurm analyze ddpslurm_jobs/job_1234/
      ddpslurm template --list
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _debug_requested(argv: list[str]) -> bool:
    """`--debug` may come before the subcommand only; look for it without parsing everything."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--debug":
            return True
    return False


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and map every known failure to one line + exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(args)
    try:
        cli.main(args=args, prog_name="ddpslurm", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.Abort:
        click.echo("ddpslurm: aborted.", err=True)
        sys.exit(130)
    except click.ClickException as usage:
        usage.show()
        sys.exit(usage.exit_code)
    except DdpSlurmError as error:
        if debug:
            raise
        click.echo(f"ddpslurm: error: {error.one_line()}", err=True)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        click.echo("ddpslurm: interrupted.", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(1)
    except Exception as unexpected:
        if debug:
            raise
        click.echo(
            f"ddpslurm: internal error: {type(unexpected).__name__}: {unexpected}. "
            "Rerun with `ddpslurm --debug ...` for the traceback and report it.",
            err=True,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
