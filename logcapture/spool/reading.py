"""Reading spool segments: the one reader of segment files. Every reader (``logs``, ``show``,
the read layer, the shipper) opens a segment through ``open_segment`` (as every file of a user's
run directory is opened: ``userfiles``, no link followed, a regular file of the directory's
owner with one link) and reads it through ``segment_data`` (gunzipped when closed, at most
``MAX_SEGMENT_BYTES``). On top of that: records (``read_segment``, ``iter_run``), lines
(``read_lines``), lines of some record kinds (``lines_of_kinds``), the bytes to ship
(``read_segment_bytes``) and a run's first line (``first_line``).

A torn last line (no newline after a crash) is skipped and counted; a line that is not a valid
record is skipped, counted and reported by line number.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import RecordError, SpoolError
from ..records import Record, from_dict, kind_suffix
from ..userfiles import UserDir
from .layout import Segment, segment_name, segments

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)

class ReadStats:
    """What reading a run met: ``lines`` complete lines read (the cursor unit), ``torn`` an
    incomplete last line of a closed segment or finished run, ``bad`` the lines that are not
    records, as (segment, line number, why)."""

    __slots__ = ("lines", "torn", "bad")

    def __init__(self, lines: int = 0, torn: int = 0,
                 bad: list[tuple[str, int, str]] | None = None):
        self.lines = lines
        self.torn = torn
        self.bad: list[tuple[str, int, str]] = [] if bad is None else bad

    def __repr__(self) -> str:
        return f"ReadStats(lines={self.lines}, torn={self.torn}, bad={self.bad!r})"


MAX_LINE_BYTES = 16 * 1024 * 1024


def _closed_meanwhile(seg: Segment) -> Segment | None:
    """The closed form of an open segment that the writer closed since it was listed
    (``SpoolWriter._compress``: ``.gz`` written and renamed into place, then the plain file
    unlinked), or None when that is not what happened. A live run's segment can close between
    a reader's listing and its reading (the shipper, ``logs``, ``show``)."""
    if seg.closed or os.path.lexists(seg.path):
        return None
    gz = seg.path.with_name(segment_name(seg.index, closed=True))
    return Segment(seg.index, gz, True) if os.path.lexists(gz) else None


def open_segment(seg: Segment) -> tuple[int, Segment]:
    """Open a segment for reading: the descriptor and the segment opened. The one way any
    reader opens a segment (root reads user-owned spools): ``userfiles.UserDir.open``, so a
    symlink, a FIFO, a file of someone else or a hard link is refused (``RefusedFile``). An
    open segment that the writer closed since it was listed is opened under its ``.gz`` name
    (``_closed_meanwhile``)."""
    try:
        with UserDir(seg.path.parent) as d:
            return d.open(seg.path.name), seg
    except FileNotFoundError as e:
        if (closed := _closed_meanwhile(seg)) is not None:
            return open_segment(closed)
        raise SpoolError(f"cannot open segment {seg.path}: {e.strerror}") from None


# The most a segment may hold (raw, and decompressed): the writer closes a segment once it
# reaches ``segment_bytes`` (8 MiB), after the batch that took it there (a flood's batch, or one
# line of at most MAX_LINE_BYTES), so a real segment stays far below this. Anything larger was
# planted or corrupted, and reading it whole (a sparse file of 20 GB costs nothing to make)
# would take the reader's memory, be it the user's `ls` or root's shipping agent.
MAX_SEGMENT_BYTES = 256 * 1024 * 1024


def segment_data(seg: Segment) -> tuple[bytes, Segment]:
    """A segment's content (gunzipped when closed) and the segment read (``open_segment``:
    its ``.gz`` when it was closed meanwhile). SpoolError when it is corrupt or holds more
    than ``MAX_SEGMENT_BYTES``, which is then not read."""
    fd, seg = open_segment(seg)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_SEGMENT_BYTES:
            raise SpoolError(_too_large(seg, f"{size} bytes"))
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_SEGMENT_BYTES:  # a file still growing stops at the limit too
            chunk = os.read(fd, min(1 << 22, MAX_SEGMENT_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > MAX_SEGMENT_BYTES:
        raise SpoolError(_too_large(seg, f"over {MAX_SEGMENT_BYTES} bytes"))
    raw = b"".join(chunks)
    return (_gunzip(seg, raw) if seg.closed else raw), seg


def _too_large(seg: Segment, what: str) -> str:
    return (f"segment {seg.path} holds {what}, more than the {MAX_SEGMENT_BYTES >> 20} MiB "
            "a segment can: not read (logcapture closes a segment at 8 MiB)")


def _gunzip(seg: Segment, raw: bytes) -> bytes:
    """A gzip file's content, every member, at most ``MAX_SEGMENT_BYTES`` (a small file may
    inflate to any size)."""
    out: list[bytes] = []
    total = 0
    while raw:
        d = zlib.decompressobj(wbits=31)
        try:
            out.append(d.decompress(raw, MAX_SEGMENT_BYTES + 1 - total))
        except zlib.error as e:
            raise SpoolError(f"segment {seg.path} is corrupt: {e}") from None
        total += len(out[-1])
        if total > MAX_SEGMENT_BYTES or d.unconsumed_tail:
            raise SpoolError(_too_large(seg, f"over {MAX_SEGMENT_BYTES} bytes decompressed"))
        if not d.eof:
            raise SpoolError(f"segment {seg.path} is corrupt: compressed file ended before "
                             "the end-of-stream marker was reached")
        raw = d.unused_data
    return b"".join(out)


def read_lines(seg: Segment, skip: int = 0) -> tuple[list[bytes], bool]:
    """Complete lines of a segment after the first ``skip``, and whether an incomplete last
    line was present (``segment_data``)."""
    data, _ = segment_data(seg)
    parts = data.split(b"\n")
    tail = parts.pop()  # b"" when the data ends with a newline
    return parts[skip:], bool(tail)


def lines_of_kinds(seg: Segment, kinds: Iterable[str]) -> dict[str, list[bytes]]:
    """The complete lines of a segment whose record is of one of ``kinds``, in order, found by
    the bytes that end such a record's line (``records.kind_suffix``: a record's kind is its
    last key, and the text of a line cannot imitate it) without splitting
    the segment into lines: the graphs' metadata and samples of a 2M-line run take the
    segments' decompression and little more."""
    data, _ = segment_data(seg)
    return records_of_kinds(data, kinds)


def records_of_kinds(data: bytes, kinds: Iterable[str]) -> dict[str, list[bytes]]:
    """``lines_of_kinds`` of a segment's data already read."""
    found: dict[str, list[bytes]] = {}
    for kind in kinds:
        tail = kind_suffix(kind) + b"\n"
        out: list[bytes] = []
        end = data.find(tail)
        while end >= 0:
            stop = end + len(tail) - 1
            out.append(data[data.rfind(b"\n", 0, end) + 1:stop])
            end = data.find(tail, stop)
        found[kind] = out
    return found


def parse_lines(name: str, lines: Iterable[bytes], first_lineno: int,
                stats: ReadStats) -> Iterator[Record]:
    for i, raw in enumerate(lines, start=first_lineno):
        stats.lines += 1
        if not raw.strip():
            continue
        try:
            yield from_dict(json.loads(raw))
        except (ValueError, RecordError) as e:
            stats.bad.append((name, i, str(e)[:200]))


def read_segment(seg: Segment, skip: int = 0, stats: ReadStats | None = None,
                 final: bool | None = None) -> Iterator[Record]:
    """Records of one segment after the first ``skip`` lines. A torn last line is counted in
    ``stats.torn`` when the segment is closed or ``final`` is true (an open segment's last
    line may still be being written)."""
    stats = stats if stats is not None else ReadStats()
    lines, torn = read_lines(seg, skip)
    if torn and (seg.closed if final is None else final):
        stats.torn += 1
    yield from parse_lines(seg.path.name, lines, skip + 1, stats)


def iter_run(run_dir: Path, stats: ReadStats | None = None) -> Iterator[Record]:
    """Every record of a run, in spool order. A segment that cannot be read (not a regular
    file, corrupt, larger than any segment is: ``segment_data``) is counted in ``stats.bad``
    as its line 0 and the others are read: one bad segment hides nothing else of the run."""
    stats = stats if stats is not None else ReadStats()
    segs = segments(run_dir)
    for i, seg in enumerate(segs):
        try:
            records = list(read_segment(seg, 0, stats, final=seg.closed or i < len(segs) - 1))
        except SpoolError as e:
            stats.bad.append((seg.path.name, 0, e.message[:300]))
            continue
        yield from records


def read_segment_bytes(seg: Segment, skip: int = 0) -> tuple[bytes, int, bool, Segment]:
    """The complete lines of a segment after the first ``skip`` as one bytes object (each
    line ending in a newline), their number, whether an incomplete last line was present,
    and the segment read (``open_segment``: its ``.gz`` if it was closed meanwhile):
    ``read_lines`` without a Python object per line (the agent's hot path)."""
    data, seg = segment_data(seg)
    end = data.rfind(b"\n") + 1
    torn = end < len(data)
    start = 0
    if skip:
        parts = data.split(b"\n", skip)  # skip small objects, then the rest in one piece
        start = end if len(parts) <= skip else len(data) - len(parts[-1])
        start = min(start, end)
    body = data[start:end] if (start or end < len(data)) else data
    return body, body.count(b"\n"), torn, seg


def first_line(seg: Segment, limit: int = 1 << 20) -> bytes:
    """The first complete line of a segment (the Start record), reading at most ~``limit``
    bytes: 64 KiB at a time until a newline for an open segment (the agent asks for every
    live run's at every flush)."""
    fd, seg = open_segment(seg)
    try:
        if seg.closed:
            raw = os.read(fd, limit)
        else:
            raw = b""
            while len(raw) < limit:
                chunk = os.read(fd, 1 << 16)
                raw += chunk
                if not chunk or b"\n" in chunk:
                    break
    finally:
        os.close(fd)
    if seg.closed:
        try:
            data = zlib.decompressobj(wbits=31).decompress(raw, limit)
        except zlib.error as e:
            raise SpoolError(f"segment {seg.path} is corrupt: {e}") from None
    else:
        data = raw
    nl = data.find(b"\n")
    return data[:nl] if nl >= 0 else b""


def begun(run_dir: Path) -> bool:
    """Whether the run's first line is complete (the agent reads a run's identity only then);
    True when that cannot be told, so that shipping reports the problem."""
    try:
        segs = segments(run_dir)
        if not segs:
            return False
        return segs[0].closed or bool(first_line(segs[0]))
    except SpoolError:
        return True
