"""Reading runs back from the spool: find a run, summarise it, follow it live.

Used by the read layer (``query.py``). Reads only; never writes to a spool.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
    """A run directory by run id, by Slurm job id (``1234`` or ``1234_5`` for an array
    task), or the latest run when ``ref`` is None or ``latest``."""
    runs = find_run_dirs(root)
    if ref is None or ref == "latest":
        if not runs:
            raise NotFound(f"no runs in {root}")
        return runs[-1]
    for run_dir in runs:
        if run_dir.name == ref:
            return run_dir
    for run_dir in reversed(runs):
        start = _first_record(run_dir)
        if isinstance(start, Start):
            slurm = start.slurm
            if ref in (slurm.get("job_id"),
                       f"{slurm.get('array_job_id')}_{slurm.get('array_task_id')}"):
                return run_dir
    raise NotFound(f"no run {ref!r} in {root} (see `logcapture ls`)")


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
