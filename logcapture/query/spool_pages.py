"""A page of a spool run's log, and its metadata and samples, without reading the run whole
(``SpoolRun``: the job page's questions of a run that is not yet in the store).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..errors import SpoolError
from ..logview import NUMBERED_ENDS, Entry, LogView, numbered_lines, parse_cursor, sort_key, ts_ns
from ..records import STDERR, kind_suffix
from ..spool.layout import Segment, segments
from ..spool.reading import ReadStats, lines_of_kinds, parse_lines, read_lines
from .interface import entry_json


def _ts_of(raw: bytes) -> int | None:
    """A spool line's time stamp in ns (``logview.cursor_of``'s unit), or None."""
    try:
        return ts_ns(json.loads(raw)["ts"])
    except (ValueError, KeyError, TypeError):
        return None


def _position(lines: list[bytes], ts: int, right: bool = False) -> int:
    """The index of the first line stamped at or after ``ts`` (after it, with ``right``), by
    bisection: a spool is written in time order. Entries of one time stamp (a batch of
    several streams) are ordered by stream and seq, not by place, so callers read whole
    runs of one stamp and filter by cursor."""
    lo, hi = 0, len(lines)
    while lo < hi:
        mid = (lo + hi) // 2
        t = _ts_of(lines[mid])
        if t is None:  # a bad line: decide by a neighbour
            t = next((x for x in map(_ts_of, lines[mid + 1:mid + 8]) if x is not None), ts)
        if t < ts or (right and t == ts):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _edge_ts(lines: list[bytes], last: bool = False) -> int | None:
    """The earliest time stamp among a segment's first lines (the latest among its last):
    the start record, the sampler's records and a batch's notes are stamped a little out of
    the lines' order."""
    stamps = [t for t in map(_ts_of, lines[-8:] if last else lines[:8]) if t is not None]
    return (max(stamps) if last else min(stamps)) if stamps else None


_END = kind_suffix("end")  # a record's kind is its last key


class SpoolRun:
    """The job page's questions of a spool run, without reading the run whole: a page of
    the log is found by bisection in the segment that holds it and read from a window of
    lines there (a 2M-line run's newest page costs a few thousand lines, not two million);
    metadata and samples are found by their kind at the end of each line and parsed alone.
    Closed segments never change: their lines (a few, most recently used) and their metadata
    and samples are kept."""

    KEEP = 3  # decompressed closed segments kept
    PRIME = 8  # lines before a window fed first, so a metadata line's printed twin is known

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._lines: OrderedDict[int, list[bytes]] = OrderedDict()
        self._scanned: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self._ended = False
        self._counted: dict[int, int] = {}
        self._lock = threading.Lock()

    def _read(self, seg: Segment) -> list[bytes]:
        got = self._lines.get(seg.index) if seg.closed else None
        if got is not None:
            self._lines.move_to_end(seg.index)
            return got
        try:
            lines, _torn = read_lines(seg)  # complete lines only
        except SpoolError:
            return []
        if seg.closed:
            self._lines[seg.index] = lines
            while len(self._lines) > self.KEEP:
                self._lines.popitem(last=False)
        return lines

    def _entries(self, segs: list[Segment], i: int, a: int, b: int) -> list[Entry]:
        """Log entries of lines [a, b) of segment ``segs[i]``, primed by the lines before."""
        lines = self._read(segs[i])
        prime = lines[max(0, a - self.PRIME):a]
        if a < self.PRIME and i > 0:
            prime = self._read(segs[i - 1])[-self.PRIME:] + prime
        view = LogView(stderr=True)
        view.feed(parse_lines("", prime, 0, ReadStats()))
        view.lines = sum(map(self._numbered, segs[:i])) + numbered_lines(lines[:a])
        return view.feed(parse_lines(segs[i].path.name, lines[a:b], a, ReadStats()))

    def line_key(self, n: int) -> tuple[int, str, int] | None:
        """The cursor key of the line numbered ``n``, or None."""
        with self._lock:
            for seg in segments(self.run_dir):
                count = self._numbered(seg)
                if n > count:
                    n -= count
                    continue
                raw = [r for r in self._read(seg) if r.endswith(NUMBERED_ENDS)]
                if 0 < n <= len(raw):
                    d = json.loads(raw[n - 1])
                    return ts_ns(d["ts"]), d["stream"], int(d["seq"])
                return None
        return None

    def _numbered(self, seg: Segment) -> int:
        """The segment's lines that have a line number (kept once it is closed)."""
        got = self._counted.get(seg.index) if seg.closed else None
        if got is None:
            got = numbered_lines(self._read(seg))
            if seg.closed:
                self._counted[seg.index] = got
        return got

    def _is_ended(self, segs: list[Segment]) -> bool:
        if not self._ended and segs:
            self._ended = any(line.endswith(_END)
                              for line in self._read(segs[-1])[-64:])
        return self._ended

    def page(self, stderr: bool, before: str | None, after: str | None,
             limit: int) -> dict[str, Any]:
        with self._lock:
            segs = segments(self.run_dir)
            if after is not None:
                picked, more = self._after(segs, parse_cursor(after), stderr, limit)
            else:
                picked, more = self._before(segs, parse_cursor(before) if before else None,
                                            stderr, limit)
            return {"entries": [entry_json(*e) for e in picked], "more": more,
                    "ended": self._is_ended(segs)}

    def _keep(self, e: Entry, stderr: bool) -> bool:
        return stderr or e.stream != STDERR

    def _before(self, segs: list[Segment], key: tuple[int, str, int] | None, stderr: bool,
                limit: int) -> tuple[list[Entry], bool]:
        """The newest ``limit`` entries before ``key``: windows read backwards from the last
        line stamped at the cursor's time, until more than ``limit`` are found and the
        earliest line read is older than the page's first entry (so nothing unread can
        belong to the page)."""
        found: list[Entry] = []
        window = 2 * limit
        for i in range(len(segs) - 1, -1, -1):
            lines = self._read(segs[i])
            if key is None:
                end = len(lines)
            else:
                first = _edge_ts(lines)
                if first is not None and first > key[0]:
                    continue
                end = _position(lines, key[0], right=True)
            while end > 0:
                start = max(0, end - window)
                found += [e for e in self._entries(segs, i, start, end)
                          if self._keep(e, stderr) and (key is None or _cursor_key(e) < key)]
                end = start
                if len(found) > limit:
                    found.sort(key=sort_key)
                    del found[:-limit - 1]  # the page, and one before it
                    earliest = _ts_of(lines[start]) if start < len(lines) else None
                    if earliest is not None and earliest < _cursor_key(found[1])[0]:
                        return found[1:], True
        found.sort(key=sort_key)
        return found[-limit:], len(found) > limit

    def _after(self, segs: list[Segment], key: tuple[int, str, int], stderr: bool,
               limit: int) -> tuple[list[Entry], bool]:
        """The oldest ``limit`` entries after ``key``, read forwards likewise."""
        found: list[Entry] = []
        window = 2 * limit
        for i, seg in enumerate(segs):
            lines = self._read(seg)
            last = _edge_ts(lines, last=True)
            if last is not None and last < key[0]:
                continue
            start = _position(lines, key[0])
            while start < len(lines):
                end = min(len(lines), start + window)
                found += [e for e in self._entries(segs, i, start, end)
                          if self._keep(e, stderr) and _cursor_key(e) > key]
                start = end
                if len(found) > limit:
                    found.sort(key=sort_key)
                    del found[limit + 1:]
                    latest = _ts_of(lines[end - 1])
                    if latest is not None and latest > _cursor_key(found[limit - 1])[0]:
                        return found[:limit], True
        found.sort(key=sort_key)
        return found[:limit], len(found) > limit

    def _scan(self, seg: Segment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The metadata and sample records of one segment (kept once it is closed)."""
        got = self._scanned.get(seg.index) if seg.closed else None
        if got is not None:
            return got
        try:
            found = lines_of_kinds(seg, ("metadata", "sample"))
        except SpoolError:
            return [], []
        meta = [r.to_dict() for r in parse_lines(seg.path.name, found["metadata"], 0,
                                                 ReadStats())]
        samples = [r.to_dict() for r in parse_lines(seg.path.name, found["sample"], 0,
                                                    ReadStats())]
        if seg.closed:
            self._scanned[seg.index] = (meta, samples)
        return meta, samples

    def progress(self) -> list[dict[str, Any]]:
        """Progress records, in spool order."""
        out: list[dict[str, Any]] = []
        for seg in segments(self.run_dir):
            try:
                found = lines_of_kinds(seg, ("progress",))
            except SpoolError:
                continue
            out += [r.to_dict() for r in parse_lines(seg.path.name, found["progress"], 0,
                                                     ReadStats())]
        return out

    def metadata(self) -> list[dict[str, Any]]:
        """Metadata records, newest first (as ``Reader.metadata``)."""
        with self._lock:
            out = [d for seg in segments(self.run_dir) for d in self._scan(seg)[0]]
        return out[::-1]

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            return [d for seg in segments(self.run_dir) for d in self._scan(seg)[1]]


def _cursor_key(e: Entry) -> tuple[int, str, int]:
    return ts_ns(e.ts), e.stream, e.seq

