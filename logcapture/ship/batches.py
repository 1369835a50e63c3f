"""Shipping what is pending of runs: batches of bytes, and whole closed segments the store
reads itself; the cursor moved past what the store took."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ..config.defaults import SEGMENT_BYTES, SPOOL_RETENTION_DAYS
from ..errors import SpoolError, StoreAuthError, StoreDataError, StoreError
from ..insights.notify import Notifier
from ..records import NOTE_WARNING, Note, kind_suffix
from ..spool.layout import mtime as _mtime
from ..spool.layout import segment_index
from ..spool.reading import open_segment
from ..store import Identity, SegmentProbe, Store
from .cursor import RunCursor
from .diagnosis import JobInfo, diagnose_run
from .pending import _Pending, _Piece, _pieces, _prepare, _RunJob
from .quota import UserQuota, user_quota
from .result import UploadResult
from .retention import _retire

BATCH_BYTES = 64 * 1024 * 1024  # bench_store: 16 MiB inserts ran 20-30 % slower, 4 MiB at half
# Closed segments the store reads itself go in groups of this many batches: the engine streams
# them (no memory here), and 256 MiB (2M lines; two inserts at once, each about one part of
# ~1M rows) ran 1.1-1.2x the rate of 64 MiB groups in bench_store, with fewer parts to merge.
DIRECT_BATCHES = 4
_END_MARK = kind_suffix("end")  # a string value can never contain this unescaped


def _accept(piece: _Piece, rows: int, result: UploadResult) -> None:
    cur = piece.job.rc.cursor
    if _END_MARK in piece.data:
        cur.end_shipped = True
    cur.lines[piece.seg.index] = piece.start + piece.count
    cur.records += rows
    result.records += rows
    result.bytes += len(piece.data)


def _ship_batch(store: Store, batch: list[_Piece], result: UploadResult,
                quota: UserQuota | None = None) -> None:
    """One insert for the whole batch; when the store refuses it as data, piece by piece
    (each parsed line by line if need be), setting aside the segments it still refuses.
    ``quota``: the pieces' lines past their user's daily bound are left out."""
    if quota is not None:
        for p in batch:
            p.data = quota.admit(store, p)
    try:
        store.insert_many([(p.data, p.job.identity) for p in batch])
        for p in batch:
            _accept(p, p.count, result)
    except StoreDataError:
        for p in batch:
            name = p.job.run_dir.name
            if p.seg.index in p.job.rc.cursor.aside:
                continue
            try:
                ins = store.insert_ndjson(p.data, p.job.identity)
            except StoreDataError as e:
                p.job.rc.cursor.aside[p.seg.index] = e.message
                result.set_aside.append((name, p.seg.path.name, e.message))
                continue
            for lineno, why in ins.bad:
                result.bad_lines.append((name, p.seg.path.name, p.start + lineno, why))
            _accept(p, ins.rows, result)
    for rc in {id(p.job.rc): p.job.rc for p in batch}.values():
        rc.save()


def _direct_groups(jobs: list[_RunJob], max_bytes: int) -> list[list[tuple[_RunJob, _Pending]]]:
    """The direct segments of ``jobs`` in spool order, at most ``DIRECT_BATCHES * max_bytes``
    (uncompressed) a group (``SEGMENT_BYTES`` each: a closed segment is about that size), in
    groups of even size (38 segments: 19 and 19, not 32 and 6)."""
    flat = [(job, p) for job in jobs for p in job.pending if p.direct]
    most = max(1, DIRECT_BATCHES * max_bytes // SEGMENT_BYTES)
    per = -(-len(flat) // -(-len(flat) // most)) if flat else 1
    return [flat[i:i + per] for i in range(0, len(flat), per)]


def _ship_direct(store: Store, group: list[tuple[_RunJob, _Pending]],
                 result: UploadResult) -> None:
    """Ship whole closed segments that the store reads itself (``Store.probe_segments``,
    ``Store.insert_segments``): no decompressing or copying here. Each segment is opened here
    (``spool.reading.open_segment``: refused unless a plain file of the run directory's owner) and
    the store reads that descriptor. A segment the store cannot read, one whose last line is
    torn, and a group the store refuses as data are read here instead and go the bytes way
    (``_ship_batch``, which skips and reports bad lines, or sets the segment aside) when
    ``_pieces`` reaches them."""
    opened: dict[int, tuple[_RunJob, _Pending]] = {}

    def fall_back(job: _RunJob, p: _Pending) -> None:
        p.direct, p.unread = False, True  # read by ``_pieces`` when its batch comes

    try:
        for job, p in group:
            try:
                opened[open_segment(p.seg)[0]] = (job, p)
            except SpoolError:
                fall_back(job, p)  # sets it aside with the same message
        runs = _probed(store, opened, fall_back)
        if not runs:
            return
        try:
            store.insert_segments([(mine, job.identity) for job, mine in runs.values()])
        except StoreDataError:
            for job, mine in runs.values():
                for fd in mine:
                    fall_back(job, opened[fd][1])
            return
        _count_shipped(runs, opened, result)
    finally:
        for fd in opened:
            os.close(fd)


_Probed = dict[int, tuple[_RunJob, dict[int, SegmentProbe]]]


def _probed(store: Store, opened: dict[int, tuple[_RunJob, _Pending]],
            fall_back: Callable[[_RunJob, _Pending], None]) -> _Probed:
    """The opened segments the store can read whole, by run (``id`` of its job: descriptor ->
    probe); the others ``fall_back``."""
    try:
        probes = store.probe_segments(list(opened))
    except StoreAuthError:
        raise
    except StoreError:
        probes = {}
    runs: _Probed = {}
    for fd, (job, p) in opened.items():
        probe = probes.get(fd)
        if probe is None or not probe.complete:
            fall_back(job, p)
            continue
        p.count = probe.lines
        runs.setdefault(id(job), (job, {}))[1][fd] = probe
    return runs


def _count_shipped(runs: _Probed, opened: dict[int, tuple[_RunJob, _Pending]],
                   result: UploadResult) -> None:
    """Move each run's cursor past the segments the store took, and count them."""
    for job, mine in runs.values():
        cur = job.rc.cursor
        for fd, probe in mine.items():
            p = opened[fd][1]
            p.direct = False
            if any(_END_MARK in line for line in probe.others):
                cur.end_shipped = True
            cur.lines[p.seg.index] = p.count
            cur.records += p.count
            result.records += p.count
            result.bytes += probe.size
        job.rc.save()


def _finish(job: _RunJob, result: UploadResult, retention_days: float | None) -> bool:
    cur = job.rc.cursor
    done = (cur.end_shipped and not cur.aside and all(p.seg.closed for p in job.pending)
            and all(cur.lines.get(p.seg.index, 0) >= p.skip + p.count
                    for p in job.pending))
    if done and not cur.shipped_at:
        cur.shipped_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        job.newly_done = True
    _retire(job.rc, job.pending, retention_days, result)
    job.rc.save()
    return done


ShippedHook = Callable[[_RunJob, bytes], None]


def ship_runs(store: Store, jobs: list[_RunJob], result: UploadResult, *,
              max_bytes: int = BATCH_BYTES, retention_days: float | None = SPOOL_RETENTION_DAYS,
              force: bool = False, job_info: JobInfo | None = None,
              notifier: Notifier | None = None, until: Callable[[], bool] | None = None,
              shipped: ShippedHook | None = None) -> list[bool]:
    """Ship what is pending of ``jobs`` in batches; whether each run is now in the store
    whole. ``until``: asked between batches; True leaves the rest for the next shipping (the
    cursors hold what the store took). ``shipped``: shown the bytes of each batch the store
    took, by run, once it took them (the agent's live watch)."""
    ready = []
    had_end = {id(job): job.rc.cursor.end_shipped for job in jobs}
    quota = user_quota()
    direct = store.reads_files and quota is None  # the bound counts what the shipper sends
    for job in jobs:
        _take_warnings(job.rc, result)
        try:
            _prepare(job, result, force, direct)
            ready.append(job)
        except SpoolError as e:  # this run cannot be read now; the others go on
            result.warnings.append(f"run {job.run_dir.name}: {e.message}")
            result.failed.append(job.run_dir.name)
    jobs_ok = {id(j) for j in ready}
    for group in _direct_groups(ready, max_bytes):  # closed segments: the store reads them
        if until is not None and until():
            break
        _ship_direct(store, group, result)
    for batch in _pieces(ready, max_bytes, result):  # the rest, and what it could not read
        if until is not None and until():
            break
        _ship_batch(store, batch, result, quota)
        if shipped is not None:
            for piece in batch:
                shipped(piece.job, piece.data)
    _note_set_aside(store, jobs, result)
    if quota is not None:
        quota.note(store, jobs, result)
    done = [id(job) in jobs_ok and _finish(job, result, retention_days) for job in jobs]
    aside_now = {run for run, _, _ in result.set_aside}
    for job in jobs:
        cur = job.rc.cursor
        # A run with a segment set aside is never done (the segment stays for a look), but
        # once its end is in the store it is diagnosed, its gap among its insights.
        incomplete = bool(cur.aside) and cur.end_shipped and (
            not had_end[id(job)] or job.run_dir.name in aside_now)
        if job.newly_done or incomplete:
            diagnose_run(store, job.identity,
                         job_info(job.run_dir) if job_info is not None else {}, result,
                         notifier, missing_segments=len(cur.aside))
    return done


# The seq of the note that says a segment was set aside: in the run stream, far above any seq
# a writer gives (a handful of run records), one per segment, so a second shipping of the
# same note is the same row (the store deduplicates on run, stream, seq).
SET_ASIDE_SEQ = 1 << 40


def _note_set_aside(store: Store, jobs: list[_RunJob], result: UploadResult) -> None:
    """A note in the store for each segment set aside in this shipping: its lines are
    missing, and the log says so there (at the time its file was last written)."""
    by_name = {job.run_dir.name: job for job in jobs}
    for run, name, why in result.set_aside:
        job = by_name.get(run)
        index = segment_index(name)
        if job is None or index is None:
            continue
        note = Note(run=job.identity.run, stream="run", seq=SET_ASIDE_SEQ + index,
                    ts=_mtime(job.run_dir / name) or time.time(), note=NOTE_WARNING,
                    text=f"spool segment {name} could not be stored ({why[:200]}): the lines "
                    "it held are missing here")
        try:
            store.insert_records([note], job.identity)
        except StoreError as e:
            result.warnings.append(f"run {run}: cannot note the set-aside {name}: {e.message}")


def ship_run(store: Store, run_dir: Path, identity: Identity, rc: RunCursor,
             result: UploadResult, *, max_bytes: int = BATCH_BYTES,
             retention_days: float | None = SPOOL_RETENTION_DAYS, force: bool = False,
             job_info: JobInfo | None = None, notifier: Notifier | None = None) -> bool:
    """Ship what the cursor says is pending of one run (the caller holds the cursor lock,
    ``lock_cursor``) as ``identity``'s rows. Returns True when the whole run is in the store
    (end record shipped, every segment closed and fully shipped). Raises StoreUnavailable or
    StoreAuthError (the cursor keeps only what the store accepted); data errors set the
    segment aside and are reported in ``result``."""
    return ship_runs(store, [_RunJob(run_dir, rc, identity)], result, max_bytes=max_bytes,
                     retention_days=retention_days, force=force, job_info=job_info,
                     notifier=notifier)[0]


def _take_warnings(rc: RunCursor, result: UploadResult) -> None:
    """The files ``rc`` refused (``userfiles``), once each in ``result``."""
    result.warnings += [f"run {rc.run_dir.name}: {w}" for w in rc.warnings
                        if f"run {rc.run_dir.name}: {w}" not in result.warnings]
