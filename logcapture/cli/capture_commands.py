"""The commands of the capture side: ``run`` (a command captured; the usual path starts it
without click, ``entry.main``) and ``check`` (a .logoptin validated).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..records import MODES
from .options import spool_option


class _RunCommand(click.Command):
    """``run``: the command's own options pass through unparsed (``ignore_unknown_options``),
    so click alone would run ``logcapture run --bogus -- true`` as a command named
    ``--bogus``. An option word before ``--`` and before the command's name is ``run``'s, or
    an error here; after ``--``, or once the command's name is given, every word is the
    command's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value: dict[str, bool] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                for name in (*param.opts, *param.secondary_opts):
                    takes_value[name] = not param.is_flag
        i = 0
        while i < len(args) and args[i] != "--" and args[i].startswith("-"):
            name, eq, _ = args[i].partition("=")
            if name not in takes_value:
                import difflib

                raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(
                    name, list(takes_value)), ctx=ctx)
            i += 2 if takes_value[name] and not eq else 1
        return super().parse_args(ctx, args)


@click.command(cls=_RunCommand, context_settings={"ignore_unknown_options": True,
                                                "allow_interspersed_args": False})
@spool_option
@click.option("--run-id", default=None, help="Id of this run (default: the Slurm job id, or "
              "a time-host-pid id). Letters, digits, '.', '_' and '-'.")
@click.option("--mode", type=click.Choice(MODES), default=None,
              help="Start in this mode instead of the one in ~/.logoptin.")
@click.option("--sample/--no-sample", default=True, show_default=True,
              help="Sample this node's GPUs and the command's CPU and memory "
                   "(interval: LOGCAPTURE_SAMPLE_INTERVAL, default 10 s).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(spool: Path | None, run_id: str | None, mode: str | None, sample: bool,
        command: tuple[str, ...]) -> None:
    """Run COMMAND under a pseudo-terminal and capture what it prints.

    The command's exit status, signals, stdin, environment (plus LOGCAPTURE_RUN_ID) and
    output are unchanged; `logcapture run` exits the way the command did. If capture fails
    (spool unwritable, disk full, internal error) the command still runs and its output
    still flows; a `logcapture:` warning on stderr says what went wrong (at most five
    distinct ones a run).
    """
    from ..capture import run_command  # also reached without click: entry.main

    sys.exit(run_command(spool, run_id, mode, sample, command))


@click.command()
@click.option("--uid", type=int, default=None,
              help="Check that the file belongs to this uid (default: yours); for "
                   "administrators checking a user's file.")
@click.argument("file", type=click.Path(path_type=Path), required=False)
def check(uid: int | None, file: Path | None) -> None:
    """Validate a .logoptin FILE and explain every problem.

    FILE defaults to $LOGCAPTURE_OPTIN, else ~/.logoptin. Exits 0 when the file is valid,
    1 when it is invalid or missing. A job started with an invalid file still runs, logged
    in mode disabled (only /LOGCOMMAND lines are kept) until the file is fixed.
    """
    from ..config.optin import load_optin, optin_path

    path = file if file is not None else optin_path()
    result = load_optin(path, uid=uid)
    if not result.opted_in and not result.problems:
        import shlex

        click.echo(f"{path}: does not exist: logging is off for your jobs "
                   f"(opt in with: touch {shlex.quote(str(path))})")
        sys.exit(1)
    if result.problems:
        for problem in result.problems:
            click.echo(problem)
        n = len(result.problems)
        click.echo(f"{path}: invalid ({n} problem{'s' if n != 1 else ''}): jobs started now "
                   "are logged in mode disabled (only /LOGCOMMAND lines are kept)")
        sys.exit(1)
    for warning in result.warnings:
        click.echo(warning)
    streams = result.config.streams
    how = ("stdout and stderr are one stream (stdout) when they go to the same file or "
           "terminal, two otherwise" if streams == "auto" else
           "stdout and stderr are always two streams (where they share a file, the order "
           "of their lines there may differ from a run without logcapture)")
    said = f"{path}: valid; mode: {result.config.mode}; streams: {streams} ({how})"
    if result.config.interactive:
        said += "; interactive: true (srun --pty and salloc shells are captured too)"
    click.echo(said)

