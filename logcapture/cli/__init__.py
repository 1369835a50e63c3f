"""The ``logcapture`` command: a thin layer over the library.

The commands live by concern in the modules beside this one (``capture_commands``: run, check;
``read_commands``: ls, logs, show, search, export, serve; ``admin_commands``: upload, agent,
db, reader, grafana; ``slurm_commands``: the slurm group; ``options``: what they share). This
is the only module that turns ``LogcaptureError`` into a message and an exit code:
``main()`` prints ``logcapture: error: <message>`` on stderr and exits with the error's
``exit_code``. Every command has help text (a test enforces it).
"""

from __future__ import annotations

import os
import sys

import click

from .. import __version__
from ..errors import LogcaptureError, failure
from .admin_commands import agent, db_group, grafana_group, reader_group, upload
from .capture_commands import check, run
from .read_commands import export_cmd, logs, ls_cmd, search, serve, show
from .slurm_commands import slurm_group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="logcapture")
def cli() -> None:
    """Capture, render and store the console output of batch jobs.

    Run any command under a pseudo-terminal with `logcapture run -- CMD ARGS`; its output
    still reaches your terminal and files unchanged, and a rendered copy (progress bars
    collapsed, repeats dropped, JSON lines as metadata) goes to a local spool.
    """


for command in (run, check, ls_cmd, logs, show, search, serve, export_cmd, upload, agent,
                db_group, reader_group, grafana_group, slurm_group):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="logcapture", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("logcapture: aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:  # one line, as every other error (docs/cli.md)
        command = e.ctx.command_path if e.ctx is not None else "logcapture"
        message = " ".join(e.format_message().split())
        click.echo(f"logcapture: error: {message} (see '{command} --help')", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except BrokenPipeError:
        # `logcapture logs RUN | head`: the reader left; not an error.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        sys.exit(0)
    except (LogcaptureError, OSError) as e:  # one line and an exit code (errors.failure)
        said, code = failure(e)  # type: ignore[misc]
        click.echo(said, err=True)
        sys.exit(code)

