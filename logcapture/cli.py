"""The ``logcapture`` command: a thin layer over the library.

This is the only module that turns ``LogcaptureError`` into a message and an exit code
(STYLE.md practice 5): ``main()`` prints ``logcapture: error: <message>`` on stderr and exits
with the error's ``exit_code``. Every command has help text (a test enforces it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import LogcaptureError
from .records import (
    MODES,
    NOTE_BLANK,
    NOTE_CUT,
    NOTE_MODE,
    NOTE_REPEAT,
    NOTE_WARNING,
    OUTPUT_STREAMS,
    Command,
    Line,
    Note,
    Record,
)
from .spool import default_root

# ------------------------------------------------------------------------------ helpers


class Warner:
    """``logcapture:`` warnings on the real stderr: each distinct message once, at most
    ``limit`` in all, so a failing disk cannot flood the job's error file."""

    def __init__(self, fd: int = 2, limit: int = 5):
        self.fd = fd
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message in self.seen or len(self.seen) >= self.limit:
            return
        self.seen.add(message)
        text = message if message.startswith("logcapture:") else f"logcapture: {message}"
        try:
            os.write(self.fd, (text + "\n").encode("utf-8", "replace"))
        except OSError:
            pass


def _spool_option(f: Any) -> Any:
    return click.option(
        "--spool", "spool", type=click.Path(path_type=Path), default=None,
        help="Spool directory (default: $LOGCAPTURE_SPOOL or "
             "$XDG_STATE_HOME/logcapture/spool).")(f)


def _root(spool: Path | None) -> Path:
    return spool if spool is not None else default_root()


# ------------------------------------------------------------------------------ the group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="logcapture")
def cli() -> None:
    """Capture, render and store the console output of batch jobs.

    Run any command under a pseudo-terminal with `logcapture run -- CMD ARGS`; its output
    still reaches your terminal and files unchanged, and a rendered copy (progress bars
    collapsed, repeats dropped, JSON lines as metadata) goes to a local spool.
    """


# ------------------------------------------------------------------------------ run


@cli.command(context_settings={"ignore_unknown_options": True,
                               "allow_interspersed_args": False})
@_spool_option
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
    still flows; one `logcapture:` warning says what went wrong.
    """
    warn = Warner()
    try:
        from .pipeline import capture_command
    except Exception as e:  # noqa: BLE001 - a broken install must not break the job
        warn(f"capture unavailable ({type(e).__name__}: {e}); running the command without it")
        try:
            os.execvp(command[0], command)
        except OSError as err:
            warn(f"{command[0]}: {err.strerror}")
            sys.exit(127 if isinstance(err, FileNotFoundError) else 126)

    code = capture_command(list(command), spool_root=_root(spool), run_id=run_id, mode=mode,
                           warn=warn, sample=sample)
    sys.exit(code)


# ------------------------------------------------------------------------------ reading


def _format_record(rec: Record, show_stream: bool) -> str | None:
    prefix = f"{rec.stream}: " if show_stream else ""
    if isinstance(rec, Line):
        return prefix + rec.text
    if isinstance(rec, Command):
        return prefix + rec.text
    if isinstance(rec, Note):
        return prefix + format_note(rec)
    return None


def format_note(note: Note) -> str:
    if note.note == NOTE_REPEAT:
        s = "" if note.count == 1 else "s"
        return f"[logcapture: previous line repeated {note.count} more time{s}, dropped]"
    if note.note == NOTE_BLANK:
        s = "" if note.count == 1 else "s"
        return f"[logcapture: {note.count} more blank line{s} dropped]"
    if note.note == NOTE_CUT:
        return f"[logcapture: line cut, {note.count} characters dropped]"
    if note.note == NOTE_MODE:
        return f"[logcapture: {note.text}]"
    if note.note == NOTE_WARNING:
        return f"[logcapture: warning: {note.text}]"
    return f"[logcapture: {note.note}: {note.text}]"


@cli.command(name="ls")
@_spool_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run.")
def ls_cmd(spool: Path | None, as_json: bool) -> None:
    """List the runs in the spool: id, state, start, duration, lines, command."""
    from .runs import list_summaries

    summaries = list_summaries(_root(spool))
    if as_json:
        for s in summaries:
            click.echo(json.dumps(s.as_dict()))
        return
    if not summaries:
        click.echo(f"no runs in {_root(spool)}", err=True)
        return
    rows = [("RUN", "STATE", "START", "DURATION", "LINES", "COMMAND")]
    for s in summaries:
        rows.append((s.run_id, s.state, s.start_text, s.duration_text, str(s.lines),
                     s.command_text))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True))
                   + "  " + r[5])


@cli.command()
@_spool_option
@click.option("--stream", type=click.Choice([*OUTPUT_STREAMS, "all"]), default="all",
              show_default=True, help="Which stream to show.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@click.argument("run_ref", metavar="RUN", required=False)
def logs(spool: Path | None, stream: str, follow: bool, run_ref: str | None) -> None:
    """Print the rendered lines and notes of RUN (a run id or Slurm job id; default: the
    latest run)."""
    from .runs import find_run, follow_records
    from .spool import iter_run

    run_dir = find_run(_root(spool), run_ref)
    streams = OUTPUT_STREAMS if stream == "all" else (stream,)
    records = follow_records(run_dir) if follow else iter_run(run_dir)
    for rec in records:
        if rec.stream not in streams and not (rec.stream == "run" and isinstance(rec, Note)):
            continue
        if (len(streams) > 1 and rec.stream == "stderr" and isinstance(rec, Note)
                and rec.note == NOTE_MODE):
            continue  # a mode change is noted in both streams; show it once
        text = _format_record(rec, show_stream=False)
        if text is not None:
            click.echo(text)


@cli.command()
@_spool_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.argument("run_ref", metavar="RUN", required=False)
def show(spool: Path | None, as_json: bool, run_ref: str | None) -> None:
    """Summarise RUN: owner, command, status, lines per stream, dropped repetitions, mode
    changes, metadata keys."""
    from .runs import describe_run, find_run

    info = describe_run(find_run(_root(spool), run_ref))
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    for key, value in info.items():
        if isinstance(value, dict):
            click.echo(f"{key}:")
            for k, v in value.items():
                click.echo(f"  {k}: {v}")
        elif isinstance(value, list):
            click.echo(f"{key}: {', '.join(map(str, value)) if value else '-'}")
        else:
            click.echo(f"{key}: {value}")


# ------------------------------------------------------------------------------ check


@cli.command()
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
    from .config import load_optin, optin_path

    path = file if file is not None else optin_path()
    result = load_optin(path, uid=uid)
    if not result.opted_in and not result.problems:
        click.echo(f"{path}: does not exist: logging is off for your jobs "
                   "(opt in with: touch ~/.logoptin)")
        sys.exit(1)
    if result.problems:
        for problem in result.problems:
            click.echo(problem)
        n = len(result.problems)
        click.echo(f"{path}: invalid ({n} problem{'s' if n != 1 else ''}): jobs started now "
                   "are logged in mode disabled (only /LOGCOMMAND lines are kept)")
        sys.exit(1)
    click.echo(f"{path}: valid; mode: {result.config.mode}")


# ------------------------------------------------------------------------------ slurm


@cli.group(name="slurm")
def slurm_group() -> None:
    """Slurm integration: what the prolog and epilog run, as root, on every node of a job.

    Installed by docs/admin.md; try it on one machine with slurm/dev-cluster.
    """


@slurm_group.command(name="prolog")
def slurm_prolog() -> None:
    """Prepare this node for the job in SLURM_JOB_ID: its spool directory (owned by the
    job's user, mode 0700) and its trusted job record. Exits 1 after a problem, which is
    logged; the prolog script still exits 0."""
    from .slurm import prolog_main

    sys.exit(prolog_main())


@slurm_group.command(name="epilog")
def slurm_epilog() -> None:
    """Record the end of the job in SLURM_JOB_ID (exit status from the wrapper's End record,
    Slurm's state), ship its runs or leave them to the agent, and clean up. Exits 1 after a
    problem, which is logged; the epilog script still exits 0."""
    from .slurm import epilog_main

    sys.exit(epilog_main())


# ------------------------------------------------------------------------------ grafana


@cli.group(name="grafana")
def grafana_group() -> None:
    """Grafana: provisioning for the ClickHouse data source and logcapture's dashboards
    (job details, jobs, compare jobs), generated as code. See docs/grafana.md."""


@grafana_group.command(name="install")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--store-url", default=None,
              help="The ClickHouse server as Grafana reaches it: http(s)://[USER@]HOST[:PORT]"
                   "[/DB] or clickhouse(s)://... for the native protocol. No password here.")
@click.option("--host", default=None, help="ClickHouse host (default: localhost).")
@click.option("--port", type=int, default=None,
              help="ClickHouse port (default: 9000 native, 8123 HTTP; 9440/8443 secure).")
@click.option("--protocol", type=click.Choice(["native", "http"]), default=None,
              help="Protocol of the plugin's connection (default: native, or the URL's).")
@click.option("--secure/--insecure", default=None, help="TLS to ClickHouse.")
@click.option("--user", default=None, help="ClickHouse user of the data source "
              "(default: grafana).")
@click.option("--database", default=None, help="Database of the tables (default: logcapture).")
@click.option("--password-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Grafana reads the password from this file ($__file{PATH}); the secret is "
                   "not copied.")
@click.option("--password-env", metavar="VAR", default=None,
              help="Grafana reads the password from this environment variable ($__env{VAR}; "
                   "default LOGCAPTURE_CLICKHOUSE_PASSWORD).")
@click.option("--password", "clear_password", default=None,
              help="Write this password in clear into the data source file (mode 0600).")
@click.option("--no-password", is_flag=True, help="No password (per-user identities, see "
              "docs/grafana.md).")
@click.option("--forward-user", is_flag=True,
              help="Forward Grafana's user headers (X-Grafana-User) to ClickHouse over HTTP, "
                   "for per-user row policies behind a mapping proxy.")
@click.option("--dashboards-path", type=click.Path(path_type=Path), default=None,
              help="Where Grafana will find the dashboard JSON, if not where it is written.")
def grafana_install(directory: Path, store_url: str | None, host: str | None,
                    port: int | None, protocol: str | None, secure: bool | None,
                    user: str | None, database: str | None, password_file: Path | None,
                    password_env: str | None, clear_password: str | None, no_password: bool,
                    forward_user: bool, dashboards_path: Path | None) -> None:
    """Write Grafana provisioning under DIRECTORY: datasources/logcapture.yaml (the
    grafana-clickhouse-datasource plugin), dashboards/logcapture.yaml (a file provider) and
    the dashboards. Prints the files written."""
    from .grafana import install, make_connection, password_reference

    password = password_reference(env=password_env, file=password_file, clear=clear_password,
                                  none=no_password)
    conn = make_connection(store_url, host=host, port=port, user=user, database=database,
                           protocol=protocol, secure=secure, password=password,
                           forward_user=forward_user)
    for path in install(directory, conn, dashboards_path):
        click.echo(str(path))


# ------------------------------------------------------------------------------ entry point


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="logcapture", standalone_mode=False)
    except LogcaptureError as e:
        click.echo(f"logcapture: error: {e.message}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("logcapture: aborted", err=True)
        sys.exit(130)
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

