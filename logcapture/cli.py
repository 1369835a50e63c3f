"""The ``logcapture`` command: a thin layer over the library.

This is the only module that turns ``LogcaptureError`` into a message and an exit code
``main()`` prints ``logcapture: error: <message>`` on stderr and exits
with the error's ``exit_code``. Every command has help text (a test enforces it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import LogcaptureError, Warner, failure
from .records import MODES, OUTPUT_STREAMS, STDERR, STREAMS_MERGED
from .search import DEFAULT_LIMIT as DEFAULT_SEARCH_LIMIT
from .spool import default_root

# ------------------------------------------------------------------------------ helpers


def _spool_option(f: Any) -> Any:
    return click.option(
        "--spool", "spool", type=click.Path(path_type=Path), default=None,
        help="Spool directory (default: $LOGCAPTURE_SPOOL or "
             "$XDG_STATE_HOME/logcapture/spool).")(f)


def _root(spool: Path | None) -> Path:
    return spool if spool is not None else default_root()


def _store_option(f: Any) -> Any:
    return click.option(
        "--store", "store_dsn", default=None, metavar="DSN",
        help="The store: chdb:///PATH (embedded) or http(s)://USER:PASS@HOST:8123/DB "
             "(default: $LOGCAPTURE_STORE, the config file's `store`, else "
             "chdb://$XDG_STATE_HOME/logcapture/store).")(f)


def _source_option(f: Any) -> Any:
    return click.option(
        "--source", type=click.Choice(["auto", "spool", "store"]), default="auto",
        show_default=True,
        help="Where to read: auto = the store once the run is shipped (or gone from the "
             "spool), else the spool.")(f)


def _retention_options(f: Any) -> Any:
    """--retention-days and --keep (the shipper's ``retention_days``: None with --keep)."""
    f = click.option("--keep", is_flag=True, help="Never delete shipped spool segments.")(f)
    return click.option(
        "--retention-days", type=float, default=7.0, show_default=True,
        help="Delete a closed spool segment this many days after the store accepted "
             "it (0: at once).")(f)


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


@cli.command(cls=_RunCommand, context_settings={"ignore_unknown_options": True,
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
    still flows; a `logcapture:` warning on stderr says what went wrong (at most five
    distinct ones a run).
    """
    from .capture import run_command  # also reached without click: entry.main

    sys.exit(run_command(spool, run_id, mode, sample, command))


# ------------------------------------------------------------------------------ reading


def format_insights(insights: list[dict[str, Any]], evidence: int = 3) -> list[str]:
    """``show``'s first lines: each insight, the lines it rests on, what to try."""
    if not insights:
        return []
    out = ["insights:"]
    for i in insights:
        out.append(f"  {i['kind']}: {i['message']}")
        quoted = [e for e in i.get("evidence") or () if e.get("text") is not None]
        for e in quoted[-evidence:]:
            out.append(f"    {e['stream']} line {e['seq']}: {e['text']}")
        if i.get("hint"):
            out.append(f"    try: {i['hint']}")
    return out


def _reader(spool: Path | None, store_dsn: str | None, source: str = "auto") -> Any:
    """The Reader a reading command asks (``query.Reader``): the caller's own spool, and the
    read service where this machine has one (``reader.client.expected_socket``; not with
    ``--store``), else the caller's own store."""
    from .query import LocalReader

    def warn(message: str) -> None:
        click.echo(f"logcapture: {message}", err=True)

    remote = None
    if store_dsn is None and source != "spool":
        from .reader.client import expected_socket

        path = expected_socket()
        if path is not None:
            remote = _service(path, own_spool=spool is not None, warn=warn)
    return LocalReader(_root(spool), store_dsn, source=source, warn=warn, remote=remote)


def _service(path: Path, own_spool: bool, warn: Callable[[str], None]) -> Any:
    """The read service on ``path``, once it answered. Where it does not, the command cannot
    do its work (the service alone reads this machine's store and the job spools): the error
    says so (``reader.client.unreachable``) and nothing else is read in its place, unless the
    caller named a spool of their own (``--spool``): then that and their own store, with a
    warning."""
    from .errors import ServiceUnavailable
    from .reader.client import ServiceReader

    remote = ServiceReader(path)
    try:
        remote.whoami()
    except ServiceUnavailable as e:
        if not own_spool:
            raise ServiceUnavailable(f"{e.message}. To read a spool or store of your own "
                                     "instead: --spool DIR, --store DSN") from None
        warn(f"{e.message}; reading your own spool and store")
        return None
    return remote


@cli.command(name="ls")
@_spool_option
@_store_option
@_source_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run.")
@click.argument("job", metavar="[JOB]", required=False)
def ls_cmd(spool: Path | None, store_dsn: str | None, source: str, as_json: bool,
           job: str | None) -> None:
    """List your runs, newest first, from the spool and the store: job id, job name, state
    (as sacct says it), exit code, start, duration, nodes, lines, insights (the first kind
    `show` explains, and how many more). JOB: only that job's runs (an array job's tasks, a
    requeued job's earlier runs), and each task of its srun steps (JOB.STEP.RANK, its node),
    which are left out of the list of all runs. For an array job, a last line counts its
    tasks by state and first insight."""
    from contextlib import closing

    from . import jobref
    from .views import ls_rows, table

    with closing(_reader(spool, store_dsn, source)) as reader:
        summaries = reader.runs()
    if job is not None:
        wanted = {d["run"] for d in jobref.select(job, summaries)}
        if not wanted:  # as logs and show say it
            raise jobref.not_found(job)
        summaries = [d for d in summaries if d["run"] in wanted]
    else:  # one row per job: its task runs are listed by `ls JOB`
        summaries = [d for d in summaries if not jobref.is_task(d)]
    if as_json:
        for d in summaries:
            click.echo(json.dumps(d))
        return
    if not summaries:
        click.echo(f"no runs in {_root(spool)} or in the store", err=True)
        return
    for line in table(ls_rows(summaries)):
        click.echo(line)
    if job is not None:
        from .arrays import summary_for, summary_text

        array = summary_for(job, summaries)
        if array is not None:  # an array job: its tasks by state and first insight
            click.echo(summary_text(array))


@cli.command()
@_spool_option
@click.option("--stream", type=click.Choice([*OUTPUT_STREAMS, "all"]), default="all",
              show_default=True, help="Which stream to show.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@_store_option
@_source_option
@click.option("--rank", "ranks", multiple=True, metavar="N",
              help="Only the task(s) of the job's srun steps with this rank (SLURM_PROCID): "
                   "N, a range 0-3 or a list 0-3,8; repeatable.")
@click.option("--node", "nodes", multiple=True, metavar="NAME",
              help="Only the tasks that ran on this node; repeatable.")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="Write the lines' colours back as ANSI escape sequences "
              "(auto: when stdout is a terminal and NO_COLOR is not set).")
@click.argument("run_ref", metavar="RUN", required=False)
def logs(spool: Path | None, stream: str, follow: bool, store_dsn: str | None, source: str,
         ranks: tuple[str, ...], nodes: tuple[str, ...], color: str, run_ref: str | None
         ) -> None:
    """Print the log of RUN (a run id or Slurm job id; default: the latest run) as the job
    page and Grafana show it (logview.py): rendered lines, commands, notes, and metadata
    lines the log does not already show. From the store once the run is shipped, else from
    the spool. A job with tasks of srun steps (each a run: `logcapture ls JOB` lists them):
    the batch script's lines and its tasks' merged in the order they were read, each task's
    prefixed with its rank as `srun --label` does, the same line of several ranks shown once
    with a note naming them; --rank and --node: only those tasks (one rank: as printed)."""
    from contextlib import closing
    from itertools import islice

    from .jobfollow import follow_lines
    from .logview import NOTE, LogView
    from .rankview import job_runs, read_job, several_ranks, text_lines
    from .records import from_dict
    from .sgr import shown_text, wants_color

    paint = wants_color(color, sys.stdout.isatty(), os.environ)
    text = shown_text(paint)
    streams = OUTPUT_STREAMS if stream == "all" else (stream,)
    view = LogView(streams=streams)
    with closing(_reader(spool, store_dsn, source)) as reader:
        # A job of several ranks (rankview.py): its runs' entries merged, labelled, folded
        runs = None if follow else job_runs(reader, run_ref, ranks, nodes)
        if runs is not None:
            lines = text_lines(read_job(reader, runs, streams), several_ranks(runs), text)
            while batch := list(islice(lines, 1000)):  # 1000 lines an echo
                click.echo("\n".join(batch), color=paint)
            return
        run = _wait_for_job(reader, run_ref) if follow else reader.resolve(run_ref)
        if follow and (job := follow_lines(reader, run_ref, run, streams, ranks, nodes, text,
                                           lambda m: click.echo(f"logcapture: {m}", err=True))):
            for line in job:  # a job's runs, as they come (jobfollow.py)
                click.echo(line, color=paint)
            return
        printed = False  # any output of the job's (notes are logcapture's)
        if follow:  # each entry as it comes
            for d in reader.follow(run):
                for e in view.feed((from_dict(d),)):
                    click.echo(text(e), color=paint)
                    printed = printed or e.kind != NOTE
        else:
            entries = view.feed(from_dict(d) for d in reader.lines(
                run, None if stream == "all" else stream))
            printed = any(e.kind != NOTE for e in entries)
            # A thousand lines an echo (one echo a line is a third of a 10,000-line log's
            # whole command).
            for i in range(0, len(entries), 1000):
                click.echo("\n".join(map(text, entries[i:i + 1000])), color=paint)
        if stream == STDERR and not printed and not follow and str(
                reader.describe(run).get("streams", "")).startswith(STREAMS_MERGED):
            click.echo("logcapture: stdout and stderr of this run went to the same place and "
                       "were captured as one stream, in the order written: see --stream "
                       "stdout (#SBATCH -e FILE or 2>FILE keeps them apart)", err=True)


def _wait_for_job(reader: Any, ref: str | None, poll: float = 1.0) -> str:
    """``logs -f JOB`` right after ``sbatch``: while Slurm has the job queued or starting and
    no run of it is there yet, wait for its run (a message on stderr says so once)."""
    from . import jobref
    from .errors import NotFound
    from .slurm.jobs import ACTIVE_STATES, slurm_job

    told = ""
    while True:
        try:
            return str(reader.resolve(ref))
        except NotFound:
            parsed = jobref.parse(ref)
            if parsed is None or parsed.restart is not None:
                raise
            spec = parsed.job + (f"_{parsed.task}" if parsed.task else "")
            job = slurm_job(spec, timeout=5.0)
            state = job.get("JobState", "")
            if state not in ACTIVE_STATES or not _may_read(job.get("UserId", "")):
                if told:
                    raise NotFound(f"job {ref} ended ({state or 'gone from the queue'}) and "
                                   "logcapture has no run of it: was ~/.logoptin there when "
                                   "it started?") from None
                raise
            if state != told:
                click.echo(f"logcapture: job {ref} is {state}: waiting for its output", err=True)
                told = state
            time.sleep(poll)


def _may_read(user_id: str) -> bool:
    """Whether this user may read a job of Slurm's ``UserId`` (``name(uid)``): their own, or
    any for root. Another user's running job is not waited for: it will never be theirs."""
    uid = user_id.rpartition("(")[2].rstrip(")")
    return os.getuid() == 0 or (uid.isdigit() and int(uid) == os.getuid())


@cli.command()
@_spool_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_store_option
@_source_option
@click.argument("run_ref", metavar="RUN", required=False)
def show(spool: Path | None, as_json: bool, store_dsn: str | None, source: str,
         run_ref: str | None) -> None:
    """Summarise RUN (a job id as Slurm users write it, a run id, default: the latest run):
    job, state, exit status, times, resources with their units, lines per stream, dropped
    repetitions, one line per mode change, metadata keys (from the store once the run is
    shipped, else the spool). --json: the same fields, snake_case, numbers as numbers."""
    from contextlib import closing

    with closing(_reader(spool, store_dsn, source)) as reader:
        info = reader.describe(reader.resolve(run_ref))
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    from .views import show_lines

    insights = info.pop("insights", None) or []
    for line in format_insights(insights):
        click.echo(line)
    for line in show_lines(info):
        click.echo(line)


# ------------------------------------------------------------------------------ search


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("pattern")
@click.option("--regex", "-E", "regex", is_flag=True,
              help="PATTERN is a regular expression (RE2 syntax; the index cannot help).")
@click.option("--job", "-j", "jobs", multiple=True, metavar="J",
              help="Only this run or Slurm job id (J or J_T); repeatable.")
@click.option("--since", default=None, metavar="WHEN",
              help="Only lines since WHEN: an age (30d, 12h, 90m, 2w) or a local date and "
                   "time (2026-11-01, '2026-11-01 12:00').")
@click.option("--until", default=None, metavar="WHEN", help="Only lines until WHEN (as --since).")
@click.option("--stream", type=click.Choice(OUTPUT_STREAMS), default=None,
              help="Only this stream (default: both).")
@click.option("--state", "states", multiple=True, metavar="STATE",
              help="Only runs in this state (FAILED, COMPLETED, TIMEOUT, RUNNING, ...); "
                   "repeatable, or comma-separated.")
@click.option("-C", "--context", "context", type=int, default=0, show_default=True,
              metavar="N", help="Show N lines before and after each matching line.")
@click.option("--limit", type=int, default=DEFAULT_SEARCH_LIMIT, show_default=True,
              metavar="N", help="Show at most the newest N matching lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as one JSON object.")
@_spool_option
@_store_option
@_source_option
@click.option("--rank", "ranks", multiple=True, metavar="N",
              help="Only the tasks of srun steps with this rank (of --job's jobs, else of "
                   "any): N, a range 0-3 or a list 0-3,8; repeatable.")
@click.option("--node", "nodes", multiple=True, metavar="NAME",
              help="Only the tasks that ran on this node; repeatable.")
def search(pattern: str, regex: bool, jobs: tuple[str, ...], since: str | None,
           until: str | None, stream: str | None, states: tuple[str, ...], context: int,
           limit: int, as_json: bool, spool: Path | None, store_dsn: str | None,
           source: str, ranks: tuple[str, ...], nodes: tuple[str, ...]) -> None:
    """Find the lines of your runs that match PATTERN, newest first, grouped by run.

    PATTERN is words, all of which must occur in a line as whole tokens (case-sensitive:
    `NCCL timeout`), and "quoted phrases" that must occur as written
    (`'"CUDA out of memory"'`); with --regex a regular expression. --rank and --node: only
    in the tasks of srun steps with those ranks, on those nodes. Exit status: 0 when lines
    matched, 1 when none did, 2 on an error (as grep's)."""
    from contextlib import closing

    from .errors import NotFound, UsageError
    from .search import Request, parse_when

    now = time.time()
    req = Request(pattern, regex, tuple(jobs),
                  parse_when(since, "--since", now) if since else None,
                  parse_when(until, "--until", now) if until else None, stream,
                  tuple(x.strip().upper() for s in states for x in s.split(",") if x.strip()),
                  context, limit).checked()
    with closing(_reader(spool, store_dsn, source)) as reader:
        try:
            if ranks or nodes:  # the task runs they name (rankview.py)
                from .rankview import task_run_ids

                req = req._replace(jobs=task_run_ids(reader, jobs, ranks, nodes))
            found = reader.search(req.to_dict())
        except NotFound as e:  # a --job that names none of the caller's runs
            raise UsageError(e.message) from None
    if as_json:
        click.echo(json.dumps(found))
    else:
        _print_search(found, limit)
    if not found["matches"]:
        sys.exit(1)


def _print_search(found: dict[str, Any], limit: int) -> None:
    """grep's -n layout under a heading per run: STREAM:SEQ:TEXT for a matching line,
    STREAM:SEQ-TEXT for context, ``--`` where lines were left out."""
    from .query import current_user

    me = current_user()[0]
    for i, g in enumerate(found["groups"]):
        start = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(g["start"]))
                 if g["start"] else "-")
        head = [g["run"]]
        if g["job_id"] and g["job_id"] != g["run"]:
            head.append(f"job {g['job_id']}")
        if g["name"]:
            head.append(g["name"])
        head += [g["state"], start]
        if g["owner"] != me:
            head.append(f"({g['owner']})")
        if g["source"] == "spool":
            head.append("[not yet shipped]")
        if i:
            click.echo("")
        click.echo("== " + "  ".join(head))
        for d in g["lines"]:
            if d["gap"]:
                click.echo("--")
            click.echo(f"{d['stream']}:{d['seq']}{':' if d['match'] else '-'}{d['text']}")
    if found["truncated"]:
        click.echo(f"logcapture: showing the newest {limit} matching lines; there are more "
                   "(--limit N for more, --since/--job/--state to narrow)", err=True)
# ------------------------------------------------------------------------------ serve


@cli.command()
@_spool_option
@_store_option
@click.option("--port", type=click.IntRange(0, 65535), default=8750, show_default=True,
              help="Port to listen on (0: any free port; 8750 taken: the next free one).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Keep the default and reach it from your laptop "
                   "through `ssh -L` (docs/user.md).")
@click.option("--no-browser", is_flag=True, help="Do not open a web browser.")
def serve(spool: Path | None, store_dsn: str | None, port: int, host: str,
          no_browser: bool) -> None:
    """Show your runs as web pages: the runs, each job's live log, metadata table and
    graphs, resource graphs, runs compared, downloads.

    The first line printed is the page's URL with an access token (anyone without it gets
    403). Read-only; stop it with Ctrl+C.
    """
    from .web import serve as serve_pages

    serve_pages(_reader(spool, store_dsn), host=host, port=port, open_browser=not no_browser)


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
    click.echo(f"{path}: valid; mode: {result.config.mode}; streams: {streams} ({how})")


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
    from .slurm.hooks import prolog_main

    sys.exit(prolog_main())


@slurm_group.command(name="epilog")
def slurm_epilog() -> None:
    """Record the end of the job in SLURM_JOB_ID (exit status from the wrapper's End record,
    Slurm's state), ship its runs or leave them to the agent, and clean up. Exits 1 after a
    problem, which is logged; the epilog script still exits 0."""
    from .slurm.hooks import epilog_main

    sys.exit(epilog_main())


@slurm_group.command(name="task", context_settings={"allow_interspersed_args": False})
@click.option("--socket", "sock_fd", type=int, required=True, metavar="FD",
              help="The plugin's socket, where the task's pty slaves are sent.")
@click.option("--step", required=True, help="The step id (S_JOB_STEPID).")
@click.option("--rank", required=True, help="The task's global id (S_TASK_GLOBAL_ID).")
@click.option("--local-rank", required=True, help="The task's id on this node (S_TASK_ID).")
@click.option("--task-pid", type=int, required=True, help="The task's pid.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def slurm_task(sock_fd: int, step: str, rank: str, local_rank: str, task_pid: int,
               command: tuple[str, ...]) -> None:
    """Capture one task of a job step as a run of its job (run id JOB.STEP.RANK). Started
    by the logcapture_task SPANK plugin in each task of an opted-in job's steps, as the
    job's user (docs/admin.md); not for interactive use."""
    from .slurm.task import task_main

    sys.exit(task_main(sock_fd, step, rank, local_rank, task_pid, list(command)))


@slurm_group.command(name="sampler")
@click.option("--job", "job_id", required=True, metavar="ID",
              help="The job id; must equal SLURM_JOB_ID (it names the process for the epilog).")
def slurm_sampler(job_id: str) -> None:
    """The node sampler the prolog starts detached for an opted-in job: samples the job's
    cgroup and GPUs on this node every sample_interval seconds into the root-owned
    <spool root>/.samples/ until the epilog stops it (TERM). Not for interactive use."""
    from .slurm.nodesampler import sampler_main

    sys.exit(sampler_main(job_id))


# ------------------------------------------------------------------------------ reader


@cli.group(name="reader")
def reader_group() -> None:
    """The read service: lets users on a login node read their own runs from the store
    without its credentials. See docs/admin.md."""


@reader_group.command(name="serve")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), default=None,
              help="The Unix socket to answer on (default: the admin config's reader_socket, "
                   "else /run/logcapture/reader.sock).")
@_store_option
@click.option("--admin-group", default=None, metavar="GROUP",
              help="Members of this group read every user's runs (default: the admin "
                   "config's admin_group; root always does).")
def reader_serve(socket_path: Path | None, store_dsn: str | None,
                 admin_group: str | None) -> None:
    """Answer users' reading commands on a Unix socket, as the user the kernel says
    connected, until TERM or INT. Run by the administrator, with the store's credentials."""
    import logging
    import signal

    from .config import load_admin
    from .reader.client import DEFAULT_SOCKET
    from .reader.server import ReadService
    from .reader.sessions import store_sessions
    from .store import redact, resolve_dsn

    admin = load_admin()
    path = socket_path or Path(admin.reader_socket or DEFAULT_SOCKET)
    group = admin_group or admin.admin_group
    logging.basicConfig(level=logging.INFO, format="logcapture reader: %(message)s")
    sessions = store_sessions(store_dsn)
    settings = {name: value for name in ("max_clients", "max_clients_per_user",
                                       "max_follows_per_user", "request_timeout")
              if (value := getattr(admin, "reader_" + name)) is not None}
    service = ReadService(path, sessions, admin_group=group, **settings)
    service.bind()

    def stop(signum: int, frame: object) -> None:
        service._stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    limits = service.limits
    click.echo(f"logcapture: read service on {path} for {redact(resolve_dsn(store_dsn))}"
               + (f", admin group {group}" if group else "")
               + f"; at most {limits.max_total} clients, {limits.per_user} per user, "
                 f"{limits.follows_per_user} following per user; requests within "
                 f"{service.request_timeout:g}s", err=True)
    try:
        service.serve_forever()
    finally:
        service.stop()
        sessions.close()
    click.echo(f"logcapture: read service stopped after {service.served} request(s)", err=True)


@reader_group.command(name="whoami")
def reader_whoami() -> None:
    """Ask the read service who you are to it (user, uid, whether you read every user's
    runs): a check that it runs and that you reach it."""
    from .errors import ServiceUnavailable
    from .reader.client import ServiceReader, expected_socket

    path = expected_socket()
    if path is None:
        raise ServiceUnavailable("no read service socket here (set LOGCAPTURE_READER_SOCKET "
                                 "or the admin config's reader_socket)")
    me = ServiceReader(path).whoami()
    click.echo(f"{me['user']} (uid {me['uid']}){': reads every user' if me['admin'] else ''}"
               f" via {path}")


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
    try:
        from .grafana import install, make_connection, password_reference
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "grafana_foundation_sdk":
            raise
        from .errors import UsageError

        raise UsageError("building the dashboards needs Grafana's SDK, which is not installed: "
                         "pip install 'logcapture[grafana]'") from None

    password = password_reference(env=password_env, file=password_file, clear=clear_password,
                                  none=no_password)
    conn = make_connection(store_url, host=host, port=port, user=user, database=database,
                           protocol=protocol, secure=secure, password=password,
                           forward_user=forward_user)
    for path in install(directory, conn, dashboards_path):
        click.echo(str(path))


# ------------------------------------------------------------------------------ store


@cli.command()
@_spool_option
@_store_option
@click.argument("run_arg", metavar="[RUN]", required=False)
@click.option("--run", "run_opt", default=None, metavar="ID",
              help="Ship this run (default: the latest run).")
@click.option("--all", "all_runs", is_flag=True,
              help="Ship every run not yet shipped, oldest first (shipped runs are skipped).")
@click.option("--force", is_flag=True,
              help="Ship again runs that were already shipped (the store drops duplicates).")
@click.option("--timeout", type=float, default=300.0, show_default=True,
              help="Total seconds to keep retrying an unreachable store.")
@_retention_options
def upload(spool: Path | None, store_dsn: str | None, run_arg: str | None,
           run_opt: str | None, all_runs: bool, force: bool, timeout: float,
           retention_days: float, keep: bool) -> None:
    """Ship runs from the spool to the store: the latest run, RUN (or --run ID), or --all.

    Exit status 0 when everything selected is in the store, 1 when part of it is (corrupt
    lines skipped, segments the store refused set aside), 2 on failure (store unreachable
    past --timeout, credentials refused, no such run, run already shipped without --force).
    Safe to run while `logcapture agent` runs: they share a cursor per run.
    """
    from .errors import UsageError
    from .ship import describe_dsn
    from .ship import upload as do_upload
    from .store import check_engine

    if run_arg and run_opt and run_arg != run_opt:
        raise UsageError("give the run once: RUN or --run ID")
    run = run_opt or run_arg
    if run and all_runs:
        raise UsageError("--run and --all are mutually exclusive")
    check_engine(store_dsn)
    warn = Warner(limit=20)
    res = do_upload(_root(spool), run=run, all=all_runs, force=force, dsn=store_dsn,
                    deadline=timeout, retention_days=None if keep else retention_days,
                    identify=_trusted_identity, warn=warn, job_info=_trusted_job_info)
    for run_id, seg, no, why in res.bad_lines[:20]:
        click.echo(f"logcapture: warning: run {run_id}: {seg} line {no}: corrupt line "
                   f"skipped: {why}", err=True)
    for run_id, seg, why in res.set_aside:
        click.echo(f"logcapture: warning: run {run_id}: segment {seg} set aside: {why}",
                   err=True)
    for w in res.warnings[:20]:
        click.echo(f"logcapture: warning: {w}", err=True)
    # A failure that shipped nothing says only what failed.
    if not res.exit_code or res.runs or res.records:
        click.echo(f"logcapture: {res.summary()} to {describe_dsn(store_dsn)}", err=True)
    if res.exit_code:
        err = LogcaptureError(res.error or ("partly shipped; see the warnings above"
                                            if res.exit_code == 1 else "upload failed"))
        err.exit_code = res.exit_code
        raise err


@cli.command()
@_spool_option
@_store_option
@click.option("--batch-bytes", type=int, default=64 * 1024 * 1024, show_default=True,
              help="Ship when this many new spool bytes are waiting.")
@click.option("--interval", type=float, default=2.0, show_default=True,
              help="Ship at least this often (seconds) when anything is waiting.")
@click.option("--live-every", type=float, default=30.0, show_default=True,
              help="Look for stalled runs this often (seconds); the admin config's "
                   "stall_seconds says how long without output is a stall.")
@_retention_options
def agent(spool: Path | None, store_dsn: str | None, batch_bytes: int, interval: float,
          live_every: float, retention_days: float, keep: bool) -> None:
    """Tail the spool and ship new lines to the store in batches, until TERM or INT (then
    ship what is waiting and exit 0). Holds an embedded store only while shipping a batch.
    Run as root on each node for every user's spool (the admin config's spool_root, default
    /var/spool/logcapture), the node samplers' samples (<spool root>/.samples) included.
    While jobs run it finds stalls and metrics that turned NaN, stores every finished run's
    insights, and sends the messages users asked for in their .logoptin (docs/insights.md)."""
    from .config import load_admin
    from .insights.notify import Notifier
    from .ship import Agent, describe_dsn
    from .slurm.jobrecords import NOTIFIED_DIR, samples_job_ended
    from .store import check_engine

    check_engine(store_dsn)  # a store to ship to, before waiting for anything to ship
    admin = load_admin()
    # Root's agent ships the node's spool root, where the prolog and the job wrapper write.
    root = spool if spool is not None else default_root(process="agent",
                                                        configured=admin.spool_root)
    notifier = Notifier(root / NOTIFIED_DIR, mail_prog=admin.mail_prog,
                        webhook=admin.notify_webhook)
    a = Agent(root, store_dsn, batch_bytes=batch_bytes, batch_interval=interval,
              retention_days=None if keep else retention_days,
              identify=_trusted_identity, job_ended=samples_job_ended,
              job_info=_trusted_job_info, notifier=notifier,
              stall_seconds=admin.stall_seconds, live_every=live_every,
              warn=Warner(limit=1000),
              log=lambda m: click.echo(f"logcapture: {m}", err=True))
    a.install_signal_handlers()
    click.echo(f"logcapture: agent shipping {root} to {describe_dsn(store_dsn)}", err=True)
    stats = a.run()
    click.echo(f"logcapture: agent stopped: {stats.records} records shipped in "
               f"{stats.flushes} flushes, {stats.failures} failed", err=True)


def _trusted_job_info(run_dir: Path) -> dict[str, Any]:
    """What Slurm said of a run's job (state, request), from the root-owned job record of a
    Slurm run (``<root>/<job id>/<run>``); {} for any other run."""
    job_id = run_dir.parent.name
    if not job_id.isdigit():
        return {}
    try:
        from .slurm.jobrecords import read_job_record
        from .slurm.jobs import job_insight_info

        return job_insight_info(read_job_record(str(run_dir.parent.parent), job_id))
    except Exception:  # noqa: BLE001 - no record: the diagnosis goes without Slurm's word
        return {}


def _trusted_identity(run_dir: Path) -> Any:
    from .ship import trusted_identity

    return trusted_identity(run_dir)


@cli.group(name="db")
def db_group() -> None:
    """The store's schema."""


@db_group.command(name="init")
@_store_option
@click.option("--ttl-days", type=int, default=None,
              help="Rows expire after this many days (0: never; default: the config file's "
                   "retention_days when set, else leave the TTL as it is).")
@click.option("--row-policies", is_flag=True,
              help="Create row policies: each ClickHouse user sees only rows they own; the "
                   "role logcapture_admin sees all (a server only).")
def db_init(store_dsn: str | None, ttl_days: int | None, row_policies: bool) -> None:
    """Create or migrate the store's schema (versioned; running it again changes nothing)."""
    from .store import open_store, redact, resolve_dsn

    with open_store(store_dsn, wait=30.0, create=False) as st:
        version = st.init_schema(ttl_days=ttl_days, row_policies=row_policies)
    click.echo(f"logcapture: schema version {version} in {redact(resolve_dsn(store_dsn))}"
               + (f", TTL {ttl_days} days" if ttl_days else "")
               + (", row policies created" if row_policies else ""), err=True)


@cli.command(name="export")
@_spool_option
@_store_option
@_source_option
@click.argument("run_ref", metavar="RUN")
@click.option("--what", type=click.Choice(["lines", "metadata", "samples", "progress"]),
              default="metadata", show_default=True, help="Which data to write.")
@click.option("--format", "fmt", type=click.Choice(["csv", "ndjson", "parquet"]),
              default="csv", show_default=True, help="The file format.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Write here (default: standard output).")
def export_cmd(spool: Path | None, store_dsn: str | None, source: str, run_ref: str,
               what: str, fmt: str, output: Path | None) -> None:
    """Write your own data of RUN: its lines, metadata (one column per key), resource
    samples or progress-bar points, as CSV, NDJSON or Parquet, from the store once the run
    is shipped, else from the spool. RUN: a run id, a Slurm job id, or `latest` (your
    newest run)."""
    from contextlib import closing, nullcontext

    from .store import check_export, write_rows

    check_export(what, fmt)
    with closing(_reader(spool, store_dsn, source)) as reader:
        run = reader.resolve(run_ref)
        rows = reader.export_rows(run, what)
        # the engine writes the file: the store's when there is one, else an in-memory one
        with reader.held() if reader.held.available else nullcontext() as store:
            if output is None:
                out = sys.stdout.buffer
                write_rows(rows, fmt, out, store)
                out.flush()
            else:
                tmp = output.with_name(output.name + ".tmp")
                try:
                    f = open(tmp, "wb")  # noqa: SIM115 - closed below, its error named first
                except OSError as e:  # the file the user named, not our temporary one
                    from .errors import UsageError

                    raise UsageError(f"-o {output}: {e.strerror}") from None
                with f:
                    write_rows(rows, fmt, f, store)
                os.replace(tmp, output)
    click.echo(f"logcapture: {len(rows)} {what} row(s) of run {run}"
               + (f" written to {output}" if output else ""), err=True)


# ------------------------------------------------------------------------------ entry point


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

