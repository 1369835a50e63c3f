"""Reading runs back from the spool: find a run, summarise it, follow it live.

Used by the read layer (``query``). Reads, and writes one thing: the end of a run whose
writer is gone (``spool.abandoned.close_abandoned``), so that no run stays RUNNING after its
process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import jobref
from .errors import NotFound, SpoolError
from .logview import NUMBERED_ENDS, numbered_lines
from .records import (
    OUTPUT_STREAMS,
    End,
    Line,
    Record,
    Start,
    kind_suffix,
)
from .spool.abandoned import close_abandoned
from .spool.layout import find_run_dirs, segments
from .spool.reading import (
    ReadStats,
    iter_run,
    parse_lines,
    read_lines,
    read_segment,
    segment_data,
)


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
    # The end record is among the last lines written: look from the end for its kind and
    # parse that line alone (a whole 8 MiB segment through json and from_dict took ~0.4 s,
    # on every `ls` and every page listing the run).
    try:
        lines, _ = read_lines(segs[-1])
    except SpoolError:
        return None
    end = kind_suffix("end")
    for raw in reversed(lines):
        if raw.endswith(end):
            for rec in parse_lines(segs[-1].path.name, [raw], 0, ReadStats()):
                if isinstance(rec, End):
                    return rec
    return None


@dataclass
class RunSummary:
    run_id: str
    start: Start | None
    end: End | None
    lines: int
    last: float | None = None  # the newest record's time (the End record's, once ended)

    @property
    def state(self) -> str:
        if self.end is not None:
            return self.end.state
        return "RUNNING" if self.start is not None else "EMPTY"


def summarize(run_dir: Path) -> RunSummary:
    start = _first_record(run_dir)
    end = _end_record(run_dir)
    if end is None and isinstance(start, Start):
        closed = close_abandoned(run_dir)
        end = closed if isinstance(closed, End) else None
    if end is not None:
        lines = sum(end.counts.get(s, {}).get("lines", 0) for s in OUTPUT_STREAMS)
        last: float | None = end.ts
    else:  # read whole while it runs: its lines, and its newest record's time
        lines, last = 0, None
        for r in iter_run(run_dir):
            lines += isinstance(r, Line)
            last = r.ts if last is None else max(last, r.ts)
    return RunSummary(run_dir.name, start if isinstance(start, Start) else None, end, lines,
                      last)


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


class SpoolTail:
    """New records of a run since the last call, read segment by segment: each call to
    :meth:`read` returns the records written since the previous one (complete lines only).
    ``ended`` turns true once the end record has been read."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.ended = False
        self._done: dict[int, int] = {}  # segment index -> complete lines already read
        self._finished: set[int] = set()  # closed segments read to their end

    def read(self) -> list[Record]:
        out: list[Record] = []
        for seg in segments(self.run_dir):
            if seg.index in self._finished:
                continue
            stats = ReadStats()
            skip = self._done.get(seg.index, 0)
            mark = len(out)
            try:
                for rec in read_segment(seg, skip, stats, final=False):
                    out.append(rec)
            except SpoolError:
                del out[mark:]  # renamed to .gz while read: read it again next round
                continue
            self.ended = self.ended or any(isinstance(r, End) for r in out[mark:])
            self._done[seg.index] = skip + stats.lines
            if seg.closed:
                self._finished.add(seg.index)
        return out


# How often a follow that reads nothing new asks whether the run's writer is gone.
ABANDON_CHECK = 5.0
SPOOL_POLL = 0.25  # seconds between a follower's reads of the spool


class SpoolFollow:
    """A run followed without waiting: each :meth:`read` returns the records written since
    the last one; when nothing new came for ``check`` seconds it asks whether the writer is
    gone (``spool.abandoned.close_abandoned``) and reads what that wrote. ``ended`` turns
    true once the end record has been read. ``follow_records`` and a job's follow
    (``jobfollow``) poll it."""

    def __init__(self, run_dir: Path, check: float = ABANDON_CHECK) -> None:
        self.run_dir = run_dir
        self.check = check
        self._tail = SpoolTail(run_dir)
        self._checked = time.monotonic()

    @property
    def ended(self) -> bool:
        return self._tail.ended

    def read(self) -> list[Record]:
        got = self._tail.read()
        if not got and not self.ended and time.monotonic() - self._checked >= self.check:
            self._checked = time.monotonic()
            close_abandoned(self.run_dir)
            got = self._tail.read()
        return got


def follow_records(run_dir: Path, poll: float = SPOOL_POLL,
                   check: float = ABANDON_CHECK) -> Iterator[Record]:
    """Every record of a run, then new ones as they are written, until the end record (one
    that ``spool.abandoned.close_abandoned`` writes when the writer is gone, too)."""
    follow = SpoolFollow(run_dir, check)
    while True:
        yield from follow.read()
        if follow.ended:
            return
        time.sleep(poll)


def line_numbers(run_dir: Path, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The line numbers (``logview.py``) of the spool run's records ``keys`` (``(stream,
    seq)``), for those that are lines: found by their identity, which a record's JSON begins
    with, and numbered by the lines written before them (the spool holds a run's records in
    the log's order), all with byte searches, so a few look-ups in a long run cost no parsing
    of its lines."""
    wanted = {(s, int(q)): _identity_bytes(run_dir.name, s, int(q)) for s, q in keys}
    found: dict[tuple[str, int], int] = {}
    before = 0  # the lines of the segments before
    for seg in segments(run_dir):
        if len(found) == len(wanted):
            break
        try:
            data, _ = segment_data(seg)
        except SpoolError:
            continue
        for key, needle in wanted.items():
            if key in found:
                continue
            at = data.find(b"\n" + needle)
            at = 0 if data.startswith(needle) else (at + 1 if at >= 0 else -1)
            if at < 0:
                continue
            end = data.find(b"\n", at)
            record = data[at:end if end >= 0 else len(data)]
            if numbered_lines((record,)):
                found[key] = before + _count_lines(data, at) + 1
        before += _count_lines(data, len(data))
    return found


def _identity_bytes(run: str, stream: str, seq: int) -> bytes:
    # As every record's JSON begins (records.Record.to_dict: run, stream, seq first; the
    # run's id is its directory's name), at the start of a line of the segment.
    return (f'{{"run":{json.dumps(run, ensure_ascii=False)},"stream":{json.dumps(stream)},'
            f'"seq":{seq},').encode()


def _count_lines(data: bytes, end: int) -> int:
    """The numbered lines among a segment's records before byte ``end``."""
    return sum(data.count(suffix + b"\n", 0, end) for suffix in NUMBERED_ENDS)
