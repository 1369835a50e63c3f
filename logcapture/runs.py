"""Reading runs back from the spool: find a run, summarise it, follow it live.

Used by the CLI's ``ls``, ``logs`` and ``show``. Reads only; never writes to a spool.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import NotFound, SpoolError
from .insights import Diagnoser, run_insights
from .insights.efficiency import admin_thresholds
from .records import (
    NOTE_BLANK,
    NOTE_MODE,
    NOTE_REPEAT,
    NOTE_WARNING,
    OUTPUT_STREAMS,
    Command,
    End,
    Line,
    Metadata,
    Note,
    Record,
    Sample,
    Start,
)
from .sampler import summarize as summarize_samples
from .spool import ReadStats, find_run_dirs, iter_run, read_segment, segments
from .xaxis import choose_x_axis


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

    @property
    def start_text(self) -> str:
        if self.start is None:
            return "-"
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.start.ts))

    @property
    def duration_text(self) -> str:
        if self.end is not None:
            seconds = self.end.duration
        elif self.start is not None:
            seconds = max(0.0, time.time() - self.start.ts)
        else:
            return "-"
        if seconds < 60:
            return f"{seconds:.1f}s"
        m, s = divmod(int(seconds), 60)
        h, m = divmod(m, 60)
        return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"

    @property
    def command_text(self) -> str:
        if self.start is None:
            return ""
        return " ".join(self.start.command)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_id, "state": self.state,
            "start": self.start.ts if self.start else None,
            "duration": self.end.duration if self.end else None,
            "exit_status": self.end.exit_status if self.end else None,
            "signal": self.end.signal if self.end else None,
            "lines": self.lines,
            "command": list(self.start.command or ()) if self.start else [],
            "user": self.start.user if self.start else None,
            "slurm": dict(self.start.slurm or {}) if self.start else {},
        }


def summarize(run_dir: Path) -> RunSummary:
    start = _first_record(run_dir)
    end = _end_record(run_dir)
    if end is not None:
        lines = sum(end.counts.get(s, {}).get("lines", 0) for s in OUTPUT_STREAMS)
    else:
        lines = sum(1 for r in iter_run(run_dir) if isinstance(r, Line))
    return RunSummary(run_dir.name, start if isinstance(start, Start) else None, end, lines)


def list_summaries(root: Path) -> list[RunSummary]:
    out = []
    for run_dir in find_run_dirs(root):
        try:
            out.append(summarize(run_dir))
        except SpoolError:
            continue
    return out


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


def describe_run(run_dir: Path) -> dict[str, Any]:
    """What ``logcapture show`` prints."""
    stats = ReadStats()
    start: Start | None = None
    end: End | None = None
    lines: Counter[str] = Counter()
    repeats: Counter[str] = Counter()
    blanks: Counter[str] = Counter()
    warnings = 0
    modes: list[str] = []
    keys: set[str] = set()
    metadata_rows: list[dict[str, Any]] = []  # stream order is time order
    samples: list[Sample] = []
    commands = 0
    diagnoser = Diagnoser()
    feed = diagnoser.feed
    for rec in iter_run(run_dir, stats):
        if isinstance(rec, Line):
            lines[rec.stream] += 1
            feed(rec.stream, rec.seq, rec.text)
        elif isinstance(rec, Start):
            start = rec
        elif isinstance(rec, End):
            end = rec
        elif isinstance(rec, Metadata):
            keys.update(rec.fields)
            metadata_rows.append(dict(rec.fields))
        elif isinstance(rec, Sample):
            samples.append(rec)
        elif isinstance(rec, Command):
            commands += 1
        elif isinstance(rec, Note):
            if rec.note == NOTE_REPEAT:
                repeats[rec.stream] += rec.count
            elif rec.note == NOTE_BLANK:
                blanks[rec.stream] += rec.count
            elif rec.note == NOTE_MODE and rec.stream == "stdout":
                modes.append(rec.text)  # the classifier notes a change in both streams
            elif rec.note == NOTE_WARNING:
                warnings += 1
    info: dict[str, Any] = {
        "insights": [i.to_dict() for i in run_insights(
            diagnoser, start, end, samples, thresholds=admin_thresholds())],
        "run": run_dir.name}
    if start is not None:
        info["owner"] = f"{start.user} (uid {start.uid})"
        info["command"] = " ".join(start.command)
        info["cwd"] = start.cwd
        info["host"] = start.host
        info["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start.ts))
        info["initial mode"] = start.mode
        if start.slurm:
            info["slurm"] = dict(start.slurm)
    if end is not None:
        info["state"] = end.state
        info["exit status"] = end.exit_status if end.signal is None else f"signal {end.signal}"
        info["duration"] = f"{end.duration:.1f}s"
    else:
        info["state"] = "RUNNING"
    info["lines"] = {s: lines[s] for s in OUTPUT_STREAMS}
    info["dropped repetitions"] = {s: repeats[s] for s in OUTPUT_STREAMS}
    info["dropped blank lines"] = {s: blanks[s] for s in OUTPUT_STREAMS}
    info["commands"] = commands
    info["mode changes"] = modes
    info["metadata keys"] = sorted(keys)
    info["x axis"] = choose_x_axis(metadata_rows) or "-"
    if samples:
        summary = summarize_samples(samples, wall_seconds=end.duration if end else None)
        info["resources"] = {k: v for k, v in summary.items()
                             if not isinstance(v, (dict, list)) and v is not None}
    info["warnings"] = warnings
    if stats.torn or stats.bad:
        info["spool problems"] = f"{stats.torn} torn line(s), {len(stats.bad)} invalid line(s)"
    return info
