"""Search over the runs in a spool (those not yet shipped, or all with ``--source spool``): the
same pattern as the store's (``search.Pattern.matches``), each match with its context.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import SpoolError
from ..records import OUTPUT_STREAMS, Command, Line
from ..runs import summarize
from ..search import Found, Hit, Pattern, Request, context_of, line_of, merge
from ..ship import is_shipped
from ..spool.layout import find_run_dirs
from ..spool.reading import iter_run
from ..summary_row import run_name
from .summaries import summary_of_spool


def search_spool(root: Path, req: Request, mine: Callable[[Path], tuple[str, int] | None],
                 skip_shipped: bool) -> Found:
    """The search over the runs in spool ``root`` that are the caller's (``mine``: the run's
    owner and uid, None when it is not the caller's), those not yet shipped when
    ``skip_shipped``, with the same pattern as the store's (``search.Pattern``)."""
    pattern = Pattern.parse(req.pattern, req.regex)
    hits: list[Hit] = []
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for run_dir in find_run_dirs(root):
        who = mine(run_dir)
        if who is None or skip_shipped and is_shipped(run_dir):
            continue
        try:
            s = summarize(run_dir)
        except SpoolError:
            continue
        summary = summary_of_spool(s, *who)
        if req.states and s.state not in req.states or req.jobs and not (
                {s.run_id, summary["job_id"], _array_ref(summary["slurm"])}
                & set(req.jobs)):
            continue
        matched = _search_run(run_dir, pattern, req, who[0])
        if matched:
            hits += matched
            runs[(s.run_id, who[0])] = {
                "run": s.run_id, "owner": who[0], "job_id": summary["job_id"],
                "name": run_name(summary["slurm"], summary["command"]),
                "state": s.state, "start": summary["start"], "source": "spool"}
    return merge([Found(hits, runs, False)], req.limit)


def _array_ref(slurm: dict[str, Any]) -> str:
    """``J_T`` for an array task (as ``runs.find_run`` takes it), else ''."""
    if slurm.get("array_job_id") and slurm.get("array_task_id") is not None:
        return f"{slurm['array_job_id']}_{slurm['array_task_id']}"
    return ""


def _search_run(run_dir: Path, pattern: Pattern, req: Request, owner: str) -> list[Hit]:
    """One spool run's matching lines, each with its context in its stream."""
    streams: dict[str, list[dict[str, Any]]] = {}
    n = 0  # the line number (logview.py): both streams count
    for rec in iter_run(run_dir):
        if isinstance(rec, (Line, Command)) and rec.stream in OUTPUT_STREAMS:
            n += 1
            if req.stream is None or rec.stream == req.stream:
                streams.setdefault(rec.stream, []).append(
                    {"stream": rec.stream, "seq": rec.seq, "ts": rec.ts, "text": rec.text,
                     "line": n})
    hits = []
    for lines in streams.values():
        for i, d in enumerate(lines):
            if (req.since is None or d["ts"] > req.since) and (
                    req.until is None or d["ts"] <= req.until) and pattern.matches(d["text"]):
                hits.append(Hit(run_dir.name, owner, line_of(d),
                                *context_of(lines, i, req.context)))
    return hits

