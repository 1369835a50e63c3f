"""Reading runs back from the spool: find a run, summarise it, follow it live.

Used by the read layer (``query.py``). Reads only; never writes to a spool.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import jobref
from .errors import NotFound, SpoolError
from .records import (
    OUTPUT_STREAMS,
    End,
    Line,
    Record,
    Start,
)
from .spool import ReadStats, find_run_dirs, iter_run, read_segment, segments


def _first_record(run_dir: Path) -> Record | None:
    segs = segments(run_dir)
    if not segs:
        return None
    for rec in read_segment(segs[0], final=False):
        return rec
    return None


def _end_record(run_dir: Path) -> End | None:
    segs = segments(run_dir)
    if not segs:
        return None
    end = None
    for rec in read_segment(segs[-1], final=False):
        if isinstance(rec, End):
            end = rec
    return end


@dataclass
class RunSummary:
    run_id: str
    start: Start | None
    end: End | None
    lines: int

    @property
    def state(self) -> str:
        if self.end is not None:
            return self.end.state
        return "RUNNING" if self.start is not None else "EMPTY"


def summarize(run_dir: Path) -> RunSummary:
    start = _first_record(run_dir)
    end = _end_record(run_dir)
    if end is not None:
        lines = sum(end.counts.get(s, {}).get("lines", 0) for s in OUTPUT_STREAMS)
    else:
        lines = sum(1 for r in iter_run(run_dir) if isinstance(r, Line))
    return RunSummary(run_dir.name, start if isinstance(start, Start) else None, end, lines)


def find_run(root: Path, ref: str | None) -> Path:
    """A run directory by run id or Slurm job reference (``1234``, ``1234_5`` for an array
    task, ``1234.1`` after a requeue: ``jobref``), or the latest run when ``ref`` is None or
    ``latest``."""
    runs = find_run_dirs(root)
    if ref is None or ref == "latest":
        if not runs:
            raise NotFound(f"no runs in {root}")
        return runs[-1]
    by_name = {d.name: d for d in runs}
    try:
        return by_name[jobref.choose(ref, job_candidates(runs, ref))]
    except NotFound:
        raise NotFound(f"no run {ref!r} in {root} (see `logcapture ls`)") from None


def job_candidates(run_dirs: list[Path], ref: str) -> list[dict[str, object]]:
    """Light summaries (run, job_id, slurm, start) of the runs ``ref`` may name, newest
    first: only the Start records of runs whose name or job could match are read."""
    parsed = jobref.parse(ref)
    out: list[dict[str, object]] = []
    for run_dir in reversed(run_dirs):
        if parsed is None and run_dir.name != ref:
            continue
        start = _first_record(run_dir) if parsed is not None else None
        slurm = dict(start.slurm or {}) if isinstance(start, Start) else {}
        out.append({"run": run_dir.name, "job_id": str(slurm.get("job_id", "")),
                    "slurm": slurm, "start": start.ts if isinstance(start, Start) else None,
                    "command": list(start.command or ()) if isinstance(start, Start) else []})
    return out


def follow_records(run_dir: Path, poll: float = 0.25) -> Iterator[Record]:
    """Every record of a run, then new ones as they are written, until the end record."""
    done: dict[int, int] = {}  # segment index -> complete lines already yielded
    finished: set[int] = set()  # closed segments read to their end: never read again
    while True:
        ended = False
        for seg in segments(run_dir):
            if seg.index in finished:
                continue
            stats = ReadStats()
            skip = done.get(seg.index, 0)
            try:
                for rec in read_segment(seg, skip, stats, final=False):
                    yield rec
                    if isinstance(rec, End):
                        ended = True
            except SpoolError:
                continue  # renamed to .gz between listing and opening: next round
            done[seg.index] = skip + stats.lines
            if seg.closed:
                finished.add(seg.index)
        if ended:
            return
        time.sleep(poll)
