"""What is pending of the runs being shipped, and the batches of bytes cut from it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpoolError
from ..spool.layout import Segment, segments
from ..spool.reading import read_segment_bytes
from ..store import Identity
from ..userfiles import RefusedFile
from .cursor import Cursor, RunCursor
from .result import UploadResult


@dataclass
class _Pending:
    seg: Segment
    skip: int
    data: bytes  # the complete lines after ``skip``, each ending in a newline
    count: int  # how many
    torn: bool
    direct: bool = False  # a closed segment the store reads itself (``_ship_direct``)
    unread: bool = False  # to be read here when the batches reach it (``_pieces``)


_UNKNOWN = 1 << 62  # the lines of a direct segment until the store has read it: never shipped


@dataclass
class _RunJob:
    """One run being shipped: its locked cursor, identity and what is pending."""

    run_dir: Path
    rc: RunCursor
    identity: Identity
    pending: list[_Pending] = field(default_factory=list)
    newly_done: bool = False  # its last line reached the store in this shipping


@dataclass
class _Piece:
    job: _RunJob
    seg: Segment
    start: int  # lines of the segment before this piece
    count: int  # lines in this piece
    data: bytes


def _pending(run_dir: Path, cur: Cursor, direct: bool) -> list[_Pending]:
    """The segments with lines pending, none read yet: their lines are counted when they are
    read (``_pieces``). ``direct``: a closed segment none of which is shipped yet is left for
    the store to read itself (``_ship_direct``)."""
    out = []
    for seg in segments(run_dir):
        if seg.index in cur.aside:
            continue
        skip = cur.lines.get(seg.index, 0)
        d = direct and seg.closed and not skip
        out.append(_Pending(seg, skip, b"", _UNKNOWN, False, direct=d, unread=not d))
    return out


def _read_pending(run_dir: Path, cur: Cursor, p: _Pending, result: UploadResult) -> bool:
    """Read what is pending of ``p``'s segment here; set the segment aside when it cannot be
    read (False)."""
    try:
        p.data, p.count, p.torn, p.seg = read_segment_bytes(p.seg, p.skip)
    except SpoolError as e:
        why = f"{e.message}: not shipped" if isinstance(e, RefusedFile) else e.message
        cur.aside[p.seg.index] = why
        result.set_aside.append((run_dir.name, p.seg.path.name, why))
        return False
    p.direct = p.unread = False
    return True


def _load(job: _RunJob, p: _Pending, result: UploadResult) -> bool:
    """Read ``p`` now (``_read_pending``) and report a torn last line, unless it is the run's
    open segment still being written; a segment that cannot be read leaves the run's
    pending list (False)."""
    if not _read_pending(job.run_dir, job.rc.cursor, p, result):
        job.pending.remove(p)
        return False
    if p.torn and (p.seg.closed or p is not job.pending[-1]):
        _note_torn(job, p, result)
    return True


def _note_torn(job: _RunJob, p: _Pending, result: UploadResult) -> None:
    result.torn += 1
    result.warnings.append(f"run {job.run_dir.name}: {p.seg.path.name}: torn last line skipped")


def _prepare(job: _RunJob, result: UploadResult, force: bool, direct: bool = False) -> None:
    cur = job.rc.cursor
    name = job.run_dir.name
    if force:
        cur.lines.clear()
        cur.aside.clear()
        cur.end_shipped = False
        cur.shipped_at = ""
        if cur.deleted:
            result.warnings.append(f"run {name}: {len(cur.deleted)} segment(s) were deleted "
                                   "after shipping and are not sent again")
    job.pending = _pending(job.run_dir, cur, direct)


def _pieces(jobs: list[_RunJob], max_bytes: int, result: UploadResult
            ) -> Iterator[list[_Piece]]:
    """Batches of about ``max_bytes``, across segments and runs, in spool order. A segment is
    read only when the batch reaches it and let go once cut, so the caller ships a batch
    before the next segment is read: memory stays near a batch and a segment however much is
    pending. Its bytes are cut at the first line end past the room left (``find``/``count``:
    no per-line Python loop)."""
    batch: list[_Piece] = []
    size = 0
    for job in jobs:
        for p in list(job.pending):  # ``_load`` drops a segment that cannot be read
            if p.direct or (p.unread and not _load(job, p, result)):
                continue
            data, p.data = p.data, b""
            start = 0
            line = 0  # lines of p.data before ``start``
            while start < len(data):
                room = max(1, max_bytes - size)
                cut = len(data) if len(data) - start <= room else data.find(
                    b"\n", start + room - 1) + 1
                cut = cut or len(data)
                piece = data[start:cut] if (start or cut < len(data)) else data
                n = piece.count(b"\n")
                batch.append(_Piece(job, p.seg, p.skip + line, n, piece))
                size += len(piece)
                line += n
                start = cut
                if size >= max_bytes:
                    yield batch
                    batch, size = [], 0
    if batch:
        yield batch
