"""The reading commands: ``ls``, ``logs``, ``show``, ``search``, ``export`` and ``serve`` (the
pages), each asking the read layer (``query``) through ``options.open_reader``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from ..errors import UsageError
from ..records import OUTPUT_STREAMS, STDERR, STREAMS_MERGED
from ..search import DEFAULT_LIMIT as DEFAULT_SEARCH_LIMIT
from .options import (
    node_option,
    open_reader,
    source_option,
    spool_option,
    spool_root,
    store_option,
)


def format_insights(insights: list[dict[str, Any]], evidence: int = 3) -> list[str]:
    """``show``'s first lines: each insight, the lines it rests on, what to try."""
    if not insights:
        return []
    out = ["insights:"]
    for i in insights:
        out.append(f"  {i['kind']}: {i['message']}")
        quoted = [e for e in i.get("evidence") or () if e.get("text") is not None]
        for e in quoted[-evidence:]:
            where = f"line {e['line']} ({e['stream']})" if e.get("line") else e["stream"]
            out.append(f"    {where}: {e['text']}")
        if i.get("hint"):
            out.append(f"    try: {i['hint']}")
    return out


@click.command(name="ls")
@spool_option
@store_option
@source_option
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

    from .. import jobref
    from ..views import ls_rows, table

    with closing(open_reader(spool, store_dsn, source)) as reader:
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
        click.echo(f"no runs in {spool_root(spool)} or in the store", err=True)
        return
    for line in table(ls_rows(summaries)):
        click.echo(line)
    if job is not None:
        from ..arrays import summary_for, summary_text

        array = summary_for(job, summaries)
        if array is not None:  # an array job: its tasks by state and first insight
            click.echo(summary_text(array))


@click.command()
@spool_option
@click.option("--stream", type=click.Choice([*OUTPUT_STREAMS, "all"]), default="all",
              show_default=True, help="Which stream to show.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@store_option
@source_option
@click.option("--rank", "ranks", multiple=True, metavar="N",
              help="Only the task(s) of the job's srun steps with this rank (SLURM_PROCID): "
                   "N, a range 0-3 or a list 0-3,8; repeatable.")
@node_option
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="Write the lines' colours back as ANSI escape sequences "
              "(auto: when stdout is a terminal and NO_COLOR is not set).")
@click.option("-n", "--line-numbers", "numbers", is_flag=True,
              help="Number the lines as the job page and search do: one number a line in "
                   "the run's log, both streams counted; notes have none.")
@click.argument("run_ref", metavar="RUN", required=False)
def logs(spool: Path | None, stream: str, follow: bool, store_dsn: str | None, source: str,
         ranks: tuple[str, ...], nodes: tuple[str, ...], color: str, numbers: bool,
         run_ref: str | None) -> None:
    """Print the log of RUN (a run id or Slurm job id; default: the latest run) as the job
    page and Grafana show it (logview.py): rendered lines, commands, notes, and metadata
    lines the log does not already show. From the store once the run is shipped, else from
    the spool. A job with tasks of srun steps (each a run: `logcapture ls JOB` lists them):
    the batch script's lines and its tasks' merged in the order they were read, each task's
    prefixed with its rank as `srun --label` does, the same line of several ranks shown once
    with a note naming them; --rank and --node: only those tasks (one rank: as printed)."""
    from contextlib import closing
    from itertools import islice

    from ..jobfollow import follow_lines
    from ..logview import NOTE, LogView, numbered_text
    from ..rankview import job_runs, read_job, several_ranks, text_lines
    from ..records import from_dict
    from ..sgr import shown_text, wants_color

    paint = wants_color(color, sys.stdout.isatty(), os.environ)
    shown = shown_text(paint)  # a job's entries are numbered in the job's log (rankview)
    text = numbered_text(shown) if numbers else shown
    streams = OUTPUT_STREAMS if stream == "all" else (stream,)
    view = LogView(streams=streams)
    with closing(open_reader(spool, store_dsn, source)) as reader:
        # A job of several ranks (rankview.py): its runs' entries merged, labelled, folded
        runs = None if follow else job_runs(reader, run_ref, ranks, nodes)
        if runs is not None:
            lines = text_lines(read_job(reader, runs, streams), several_ranks(runs), shown,
                               numbers)
            while batch := list(islice(lines, 1000)):  # 1000 lines an echo
                click.echo("\n".join(batch), color=paint)
            return
        run = _wait_for_job(reader, run_ref) if follow else reader.resolve(run_ref)
        if follow and (job := follow_lines(reader, run_ref, run, streams, ranks, nodes, shown,
                                           numbers)):
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
            # Numbers count both streams: read both when numbering.
            entries = view.feed(from_dict(d) for d in reader.lines(
                run, None if stream == "all" or numbers else stream))
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
    from .. import jobref
    from ..errors import NotFound
    from ..slurm.jobs import ACTIVE_STATES, slurm_job

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


@click.command()
@spool_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@store_option
@source_option
@click.option("--rank", "ranks", multiple=True, metavar="N|all",
              help="A job of several ranks: whose metadata keys and X axis (default 0; a "
                   "rank, a range like 0-3, or all).")
@click.argument("run_ref", metavar="RUN", required=False)
def show(spool: Path | None, as_json: bool, store_dsn: str | None, source: str,
         ranks: tuple[str, ...], run_ref: str | None) -> None:
    """Summarise RUN (a job id as Slurm users write it, a run id, default: the latest run):
    job, state, exit status, times, resources with their units, lines per stream, dropped
    repetitions, one line per mode change, metadata keys (from the store once the run is
    shipped, else the spool). A job of several ranks: its ranks, the root cause among them,
    each node's figures. --json: the same fields, snake_case, numbers as numbers."""
    from contextlib import closing

    from ..jobview import chosen_ranks, describe_job, describe_labelled

    with closing(open_reader(spool, store_dsn, source)) as reader:
        info = reader.describe(reader.resolve(run_ref))
        if run_ref is not None:
            info = describe_job(reader, run_ref, info, chosen_ranks(ranks))
        if ranks and "ranks" not in info:  # a run whose workers' rows carry their labels
            info = describe_labelled(reader, info, chosen_ranks(ranks))
    if ranks and "metadata_ranks" not in info:
        raise UsageError(f"--rank: {run_ref or 'the run'} is no job with tasks of srun steps "
                         "captured, nor a run whose metadata rows carry launchers' labels that "
                         "repeat (one series per worker)")
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    from ..views import show_lines

    insights = info.pop("insights", None) or []
    for line in format_insights(insights):
        click.echo(line)
    for line in show_lines(info):
        click.echo(line)


@click.command(context_settings={"ignore_unknown_options": False})
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
@spool_option
@store_option
@source_option
@click.option("--rank", "ranks", multiple=True, metavar="N",
              help="Only the tasks of srun steps with this rank (of --job's jobs, else of "
                   "any): N, a range 0-3 or a list 0-3,8; repeatable.")
@node_option
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

    from ..errors import NotFound, UsageError
    from ..search import Request, parse_when

    now = time.time()
    req = Request(pattern, regex, tuple(jobs),
                  parse_when(since, "--since", now) if since else None,
                  parse_when(until, "--until", now) if until else None, stream,
                  tuple(x.strip().upper() for s in states for x in s.split(",") if x.strip()),
                  context, limit).checked()
    with closing(open_reader(spool, store_dsn, source)) as reader:
        try:
            if ranks or nodes:  # the task runs they name (rankview.py)
                from ..rankview import task_run_ids

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
    """grep's -n layout under a heading per run: STREAM:N:TEXT for a matching line,
    STREAM:N-TEXT for context (N: the line number, as `logs -n` and the page give it),
    ``--`` where lines were left out."""
    from ..query import current_user

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
            click.echo(f"{d['stream']}:{d.get('line') or '?'}{':' if d['match'] else '-'}"
                       f"{d['text']}")
    if found["truncated"]:
        click.echo(f"logcapture: showing the newest {limit} matching lines; there are more "
                   "(--limit N for more, --since/--job/--state to narrow)", err=True)


@click.command()
@spool_option
@store_option
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
    from ..web import serve as serve_pages

    serve_pages(open_reader(spool, store_dsn), host=host, port=port, open_browser=not no_browser,
                start_afresh_when_worn=True)


@click.command(name="export")
@spool_option
@store_option
@source_option
@click.argument("run_ref", metavar="RUN")
@click.option("--what", type=click.Choice(["lines", "metadata", "samples", "progress"]),
              default="metadata", show_default=True, help="Which data to write.")
@click.option("--format", "fmt", type=click.Choice(["csv", "ndjson", "parquet"]),
              default="csv", show_default=True, help="The file format.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Write here (default: standard output).")
@click.option("--rank", "ranks", multiple=True, metavar="N",
              help="A job of several ranks: only these ranks' lines or metadata (a rank, a "
                   "range like 0-3; repeatable). Default: the batch script's and every rank's.")
@node_option
def export_cmd(spool: Path | None, store_dsn: str | None, source: str, run_ref: str,
               what: str, fmt: str, output: Path | None, ranks: tuple[str, ...],
               nodes: tuple[str, ...]) -> None:
    """Write your own data of RUN: its lines, metadata (one column per key), resource
    samples or progress-bar points, as CSV, NDJSON or Parquet, from the store once the run
    is shipped, else from the spool. RUN: a run id, a Slurm job id, or `latest` (your
    newest run)."""
    from contextlib import closing, nullcontext

    from ..jobview import export_job
    from ..store import check_export, export_rows, write_rows

    check_export(what, fmt)
    with closing(open_reader(spool, store_dsn, source)) as reader:
        run = reader.resolve(run_ref)
        job = export_job(reader, run_ref, run, what, ranks, nodes)
        rows = reader.export_rows(run, what) if job is None else export_rows(what, job)
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
                    from ..errors import UsageError

                    raise UsageError(f"-o {output}: {e.strerror}") from None
                with f:
                    write_rows(rows, fmt, f, store)
                os.replace(tmp, output)
    click.echo(f"logcapture: {len(rows)} {what} row(s) of run {run}"
               + (f" written to {output}" if output else ""), err=True)

