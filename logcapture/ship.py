"""Shipping: spool -> store. ``upload()`` ships after the fact; ``Agent`` tails spools.

Both share one **cursor** per run directory (``.logcapture-cursor.json``), guarded by an
``flock`` on ``.logcapture-cursor.lock``, so they can run at the same time without sending a
line twice (gpufl's cursor-file convention). The cursor counts the complete lines
shipped per segment *index*: a segment is renamed ``seg-N.ndjson`` -> ``seg-N.ndjson.gz`` when
closed, which changes its bytes but not its lines. A shipper holds the run's lock from reading
the segment to writing the cursor. If it dies between the store accepting a batch and the
cursor being written, the next shipper sends those lines again, and the store's
ReplacingMergeTree (read with FINAL) shows each record once.

Failures (as Vector's ClickHouse sink and gpufl sort them):

- ``StoreUnavailable`` (connection refused, timeout, a chDB folder locked by another process):
  retried with exponential backoff inside a total deadline; the spool is kept.
- ``StoreDataError`` (codes 117, 53, 27, 26, 72, ...): the segment is set aside (recorded in
  the cursor, never deleted, reported) and the rest continues. Bad lines never get that far:
  they are skipped, counted and reported by segment and line number.
- ``StoreAuthError`` (516, 192, 497, HTTP 401/403): stop at once.

A segment is deleted only after the store accepted all its lines, once it is closed, and then
per ``retention_days`` (0: at once; None: never).

Reading: a whole closed segment bound for the embedded store is opened here (as every file
of a user's run directory is: ``userfiles``, no link followed, a regular file of the
directory's owner with one link) and read by the engine itself (``_ship_direct``); the open segment,
what is left of a partly shipped one, and anything the engine cannot read or refuses are read
here as bytes (``read_segment_bytes``) and sent as they are. Those are read one segment at a
time as the batches reach them (``_pieces``, a generator): a shipper holds one batch and one
segment, whatever the backlog after an outage.

Identity (privacy): the owner and run id of shipped rows come from ``identify(run_dir)``,
a trusted source chosen by the caller. The default, ``identity_from_spool``, takes the owner from
the run directory's owner (which a user cannot forge: ``chown`` to another user needs root) and
the run id from the directory name; the Start record only adds cluster and job id as
information. The Slurm epilog/agent passes the root-owned prolog record instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import signal
import stat
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import (
    LogcaptureError,
    SpoolError,
    StoreAuthError,
    StoreDataError,
    StoreError,
    StoreUnavailable,
)
from .insights.live import LiveWatch
from .insights.notify import Notifier
from .records import LOST, NOTE_WARNING, Note, Start, from_dict
from .runs import find_run
from .spool import (
    CURSOR_NAME,
    SEGMENT_BYTES,
    Segment,
    check_run_id,
    close_abandoned,
    find_run_dirs,
    open_segment,
    segment_data,
    segment_index,
    segments,
    writer_gone,
)
from .spool import (
    mtime as _mtime,
)
from .store import Identity, SegmentProbe, Store, flock_within, open_store, redact
from .userfiles import RefusedFile, UserDir

CURSOR_LOCK_NAME = ".logcapture-cursor.lock"
BATCH_BYTES = 64 * 1024 * 1024  # bench_store: 16 MiB inserts ran 20-30 % slower, 4 MiB at half
# Closed segments the store reads itself go in groups of this many batches: the engine streams
# them (no memory here), and 256 MiB (2M lines; two inserts at once, each about one part of
# ~1M rows) ran 1.1-1.2x the rate of 64 MiB groups in bench_store, with fewer parts to merge.
DIRECT_BATCHES = 4
BATCH_INTERVAL = 2.0
DEADLINE = 300.0  # gpufl's total timeout (5 min)
RETENTION_DAYS = 7.0
# Seconds a shipper waits for an embedded store that another process holds (the read service
# lets go as soon as it sees a process waiting: store.store_wanted) before it retries later.
STORE_WAIT = 5.0
# How often the agent looks for segments of shipped runs that have outlived the retention
# (a run is shipped while its segments are young; nothing else comes back to it).
SWEEP_EVERY = 3600.0
MAX_CURSOR_BYTES = 16 * 1024 * 1024  # a cursor holds a few numbers per segment
_END_MARK = b'"kind":"end"'  # a string value can never contain this unescaped
SAMPLES_DIR = ".samples"  # slurm.SAMPLES_DIR: the node samplers' spool, inside the spool root
SAMPLES_IDLE = 900.0  # seconds without a new sample after which a samples-only run is done
# How often the agent looks for runs that stalled: a stall is found within a minute.
LIVE_EVERY = 30.0

Warn = Callable[[str], None]


# --- identity ------------------------------------------------------------------------------------
def identity_from_spool(run_dir: Path) -> Identity:
    """The default trusted identity of a run directory: owner = the directory's owner (uid and
    its user name), run = the directory's name. Cluster and job id come from the Start record
    (informational: never part of the row key or of the owner)."""
    st = os.stat(run_dir, follow_symlinks=False)
    uid = st.st_uid
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    cluster = job_id = ""
    try:
        segs = segments(run_dir)
        if segs:
            first = _first_line(segs[0])
            if first:
                rec = from_dict(json.loads(first))
                if isinstance(rec, Start) and rec.slurm:  # null in a hand-made record
                    cluster = str(rec.slurm.get("cluster", ""))
                    job_id = str(rec.slurm.get("job_id", ""))
    except (LogcaptureError, ValueError, OSError):
        pass
    return Identity(run=check_run_id(run_dir.name), user=user, uid=uid, cluster=cluster,
                    job_id=job_id)


# --- reading segments as bytes -------------------------------------------------------------
def trusted_identity(run_dir: Path, job_record: Mapping[str, object] | None = None
                     ) -> Identity:
    """Who owns a run's rows: the one rule every shipper and reader applies. A Slurm run
    (``<spool root>/<job id>/<run>``, or the node sampler's ``<spool root>/.samples/<job id>/
    <run>``) belongs to the user of the job's root-owned prolog record (``job_record``, else
    read beside the run); any other run, or one without such a record, to its directory's
    owner (``identity_from_spool``). Nothing a job writes into its spool can change it."""
    job_id = run_dir.parent.name
    if job_record is None and job_id.isdigit():
        try:
            from .slurm.jobrecords import read_job_record

            job_record = read_job_record(str(run_dir.parent.parent), job_id)
        except (OSError, LogcaptureError):
            job_record = None
    if job_record:
        uid, user = job_record.get("uid"), job_record.get("user")
        if isinstance(uid, int) and isinstance(user, str):
            return Identity(run=check_run_id(run_dir.name), user=user, uid=uid,
                            cluster=str(job_record.get("cluster", "")), job_id=job_id)
    return identity_from_spool(run_dir)


def read_segment_bytes(seg: Segment, skip: int = 0) -> tuple[bytes, int, bool, Segment]:
    """The complete lines of a segment after the first ``skip`` as one bytes object (each
    line ending in a newline), their number, whether an incomplete last line was present,
    and the segment read (``open_segment``: its ``.gz`` if it was closed meanwhile):
    ``spool.read_lines`` without a Python object per line (the agent's hot path)."""
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


def _first_line(seg: Segment, limit: int = 1 << 20) -> bytes:
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


def _begun(run_dir: Path) -> bool:
    """Whether the run's first line is complete (the agent reads a run's identity only then);
    True when that cannot be told, so that shipping reports the problem."""
    try:
        segs = segments(run_dir)
        if not segs:
            return False
        return segs[0].closed or bool(_first_line(segs[0]))
    except SpoolError:
        return True


# --- finding runs -------------------------------------------------------------------------
# --- the cursor ---------------------------------------------------------------------------
@dataclass
class Cursor:
    """What has been shipped of one run: complete lines per segment index."""

    lines: dict[int, int] = field(default_factory=dict)
    aside: dict[int, str] = field(default_factory=dict)  # segment index -> why
    deleted: list[int] = field(default_factory=list)
    end_shipped: bool = False
    shipped_at: str = ""  # set when the whole run (through its end record) is in the store
    records: int = 0  # lines shipped in all

    def to_json(self) -> str:
        return json.dumps({"version": 1, "lines": {str(k): v for k, v in self.lines.items()},
                           "aside": {str(k): v for k, v in self.aside.items()},
                           "deleted": self.deleted, "end_shipped": self.end_shipped,
                           "shipped_at": self.shipped_at, "records": self.records},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> Cursor:
        d = json.loads(text)
        return cls(lines={int(k): int(v) for k, v in d.get("lines", {}).items()},
                   aside={int(k): str(v) for k, v in d.get("aside", {}).items()},
                   deleted=[int(i) for i in d.get("deleted", [])],
                   end_shipped=bool(d.get("end_shipped")),
                   shipped_at=str(d.get("shipped_at", "")), records=int(d.get("records", 0)))


def is_shipped(run_dir: Path) -> bool:
    """Whether the whole run (through its end record) is in the store, by its cursor; an
    unreadable, refused (``userfiles``) or corrupt cursor says no (the spool is then the place
    to read it)."""
    try:
        with UserDir(run_dir) as d:
            cursor, _ = _read_cursor(d)
        return bool(cursor.shipped_at)
    except (OSError, SpoolError):
        return False


def _read_cursor(d: UserDir) -> tuple[Cursor, str | None]:
    """The cursor in run directory ``d``, and a warning when the file there was refused
    (``userfiles.UserDir.open``: not a plain file of the directory's owner): then the run
    starts from an empty cursor, its lines are sent again (the store drops the copies) and
    the next save replaces that name. SpoolError when it cannot be read or is corrupt."""
    try:
        fd = d.open(CURSOR_NAME)
    except FileNotFoundError:
        return Cursor(), None
    except RefusedFile as e:
        return Cursor(), f"{e.message}: not read (the run's lines are sent again)"
    with os.fdopen(fd, "rb") as f:
        text = f.read(MAX_CURSOR_BYTES + 1)
    path = d.path / CURSOR_NAME
    try:
        if len(text) > MAX_CURSOR_BYTES:
            raise ValueError(f"over {MAX_CURSOR_BYTES} bytes")
        return Cursor.from_json(text.decode()), None
    except (ValueError, TypeError, AttributeError) as e:
        raise SpoolError(f"cursor {path} is corrupt ({e}); delete it to re-ship the "
                         "run (the store drops duplicates)") from None


class RunCursor:
    """The locked cursor of one run directory (use ``lock_cursor``, which opens the directory
    as ``userfiles.UserDir`` and holds it while the cursor is). ``warnings``: the files
    refused on the way (``userfiles``), for the caller's result."""

    def __init__(self, run_dir: Path, d: UserDir, warnings: list[str] | None = None):
        self.run_dir = run_dir
        self.dir = d
        self.path = run_dir / CURSOR_NAME
        self.warnings: list[str] = warnings if warnings is not None else []
        self.cursor = self._load()

    def _load(self) -> Cursor:
        cursor, refused = _read_cursor(self.dir)
        if refused is not None and refused not in self.warnings:
            self.warnings.append(refused)
        return cursor

    def save(self) -> None:
        """Write the cursor to a temporary file made anew (``UserDir.create``: exclusive, no
        link followed, the directory owner's) and rename it over the cursor."""
        tmp = CURSOR_NAME + ".tmp"
        fd = self.dir.create(tmp)
        try:
            os.write(fd, self.cursor.to_json().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.dir.replace(tmp, CURSOR_NAME)


@contextmanager
def lock_cursor(run_dir: Path, wait: float | None = None) -> Iterator[RunCursor | None]:
    """Hold the run's cursor lock. ``wait`` None blocks; otherwise gives up after ``wait``
    seconds and yields None (another shipper is working on this run). The lock file is the
    directory owner's (their own ``upload`` takes it too); one that is not a plain file of
    theirs (``userfiles``) is replaced, and the cursor's ``warnings`` say so."""
    path = run_dir / CURSOR_LOCK_NAME
    try:
        d = UserDir(run_dir)
    except FileNotFoundError as e:
        raise SpoolError(f"cannot open cursor lock {path}: {e.strerror}") from None
    warnings: list[str] = []
    try:
        fd, refused = d.open_or_create(CURSOR_LOCK_NAME)
        if refused is not None:
            warnings.append(f"{refused.message}: replaced by a new lock file")
        try:
            if wait is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            elif not flock_within(fd, wait, poll=0.02):
                yield None
                return
            yield RunCursor(run_dir, d, warnings)
        finally:
            os.close(fd)
    finally:
        d.close()


# --- results -----------------------------------------------------------------------------------
@dataclass
class UploadResult:
    """What an upload did. ``exit_code``: 0 everything selected shipped, 1 partial (bad lines
    skipped, segments set aside, some runs failed), 2 failure (nothing could be shipped:
    store unreachable past the deadline, authentication refused, no such run, already
    shipped without --force)."""

    exit_code: int = 0
    runs: list[str] = field(default_factory=list)  # runs that shipped completely
    skipped: list[str] = field(default_factory=list)  # already shipped (--all)
    failed: list[str] = field(default_factory=list)
    records: int = 0  # spool lines shipped
    bytes: int = 0
    bad_lines: list[tuple[str, str, int, str]] = field(default_factory=list)  # run, seg, no, why
    torn: int = 0
    set_aside: list[tuple[str, str, str]] = field(default_factory=list)  # run, segment, why
    deleted: int = 0  # segments deleted after shipping
    insights: int = 0  # insights stored for runs that finished shipping
    warnings: list[str] = field(default_factory=list)
    error: str = ""
    elapsed: float = 0.0

    @property
    def success(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        parts = [f"shipped {self.records} records ({self.bytes / 1e6:.1f} MB) of "
                 f"{len(self.runs)} run(s) in {self.elapsed:.1f}s"]
        if self.skipped:
            parts.append(f"{len(self.skipped)} already shipped")
        if self.bad_lines:
            parts.append(f"{len(self.bad_lines)} corrupt line(s) skipped")
        if self.torn:
            parts.append(f"{self.torn} torn line(s) skipped")
        if self.set_aside:
            parts.append(f"{len(self.set_aside)} segment(s) set aside")
        return "; ".join(parts)


# --- shipping ---------------------------------------------------------------------------------
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


# A line about the run as a whole (start, notes, end) begins so (``to_json``: run, stream,
# seq, ...; a quote inside a value is escaped, so no text can imitate it).
_RUN_LINE = b'","stream":"run","'
QUOTA_REFRESH = 300.0  # seconds between two reads of what a user stored today


class UserQuota:
    """The store's per-user daily bound (admin config ``user_daily_bytes``): bytes of output
    lines one user's runs may add in a UTC day, counted where the store is written. Past it
    a batch keeps only its lines about the run (start, notes, end: the run still ends in the
    store), the output lines are counted and left in the spool, and the run gets a note.
    What the user stored is read from the store at most every ``QUOTA_REFRESH`` seconds and
    counted here between, so shippers on several nodes may together pass it by what each
    ships in that time."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.time):
        self.limit = limit
        self.clock = clock
        self._used: dict[str, tuple[int, float, int]] = {}  # user -> (day, read at, bytes)
        self.left_out: dict[str, list[int]] = {}  # run dir -> [lines, bytes]

    def admit(self, store: Store, piece: _Piece) -> bytes:
        """What of ``piece`` goes to the store."""
        user, now = piece.job.identity.user, self.clock()
        day = int(now // 86400)
        have = self._used.get(user)
        if have is None or have[0] != day or now - have[1] >= QUOTA_REFRESH:
            have = (day, now, store.user_text_bytes_since(user, day * 86400.0))
        used = have[2]
        if used + len(piece.data) <= self.limit:
            self._used[user] = (day, have[1], used + len(piece.data))
            return piece.data
        self._used[user] = (day, have[1], used)
        lines = piece.data.splitlines(True)
        kept = [ln for ln in lines if _RUN_LINE in ln[:160]]
        gone = self.left_out.setdefault(str(piece.job.run_dir), [0, 0])
        gone[0] += len(lines) - len(kept)
        gone[1] += len(piece.data) - sum(map(len, kept))
        return b"".join(kept)

    def note(self, store: Store, jobs: list[_RunJob], result: UploadResult) -> None:
        """A note in each run that had lines left out in this shipping."""
        for job in jobs:
            gone = self.left_out.pop(str(job.run_dir), None)
            if not gone or not gone[0]:
                continue
            now = self.clock()
            note = Note(run=job.identity.run, stream="run", seq=QUOTA_SEQ + int(now * 1000),
                        ts=now, note=NOTE_WARNING, count=gone[0], text=(
                            f"{gone[0]} lines ({gone[1]} bytes) of this run were not stored: "
                            f"the store's daily bound for {job.identity.user} "
                            f"(user_daily_bytes, {self.limit} bytes) was reached; they stay in "
                            "the node's spool until its retention"))
            try:
                store.insert_ndjson(note.to_json().encode() + b"\n", job.identity)
            except StoreError as e:
                result.warnings.append(f"run {job.run_dir.name}: {e.message}")
            result.warnings.append(f"run {job.run_dir.name}: {gone[0]} lines not stored: "
                                   f"{job.identity.user}'s daily bound reached")


def user_quota() -> UserQuota | None:
    """The admin config's ``user_daily_bytes`` as a ``UserQuota`` (None: no bound)."""
    from .config import load_admin

    try:
        limit = int(load_admin().user_daily_bytes)
    except LogcaptureError:
        return None
    return UserQuota(limit) if limit > 0 else None


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
    (``spool.open_segment``: refused unless a plain file of the run directory's owner) and
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


JobInfo = Callable[[Path], dict[str, Any]]


def diagnose_run(store: Store, identity: Identity, info: dict[str, Any],
                 result: UploadResult, notifier: Notifier | None = None,
                 missing_segments: int = 0) -> int:
    """Store the insights of a run whose last line the store just took (its diagnosis when
    it ended badly, its efficiency notes): ``info`` is what Slurm said of the job
    (``slurm_state``, ``request``; ``{}`` outside Slurm). A run that failed, of a user who
    asked for it (``notify: [failed]``), gets its message through ``notifier``. A failure
    here is a warning: the run is shipped all the same."""
    from .insights import EFFICIENCY, FAILURE
    from .insights.efficiency import admin_thresholds
    from .insights.report import diagnose_stored

    try:
        rec = store.run_info(identity.run, identity.user, counts=False)
        start, end = rec["start_record"], rec["end_record"]
        found = diagnose_stored(store, identity.run, start, end,
                                store.samples(identity.run, identity.user),
                                slurm_state=str(info.get("slurm_state") or ""),
                                thresholds=admin_thresholds(), request=info.get("request"),
                                owner=identity.user, missing_segments=missing_segments)
        dicts = [i.to_dict() for i in found]
        n = store.insert_insights(identity, dicts, time.time(),
                                  replace=(FAILURE, EFFICIENCY))
    except LogcaptureError as e:
        result.warnings.append(f"run {identity.run}: no diagnosis: {e.message}")
        return 0
    result.insights += n
    failures = [d for d in dicts if d["category"] == FAILURE]
    if notifier is not None and failures:
        result.warnings += notify_event(notifier, "failed", identity, start, failures)
    return n


def notify_event(notifier: Notifier, event: str, identity: Identity, start: Any,
                 insights: list[dict[str, Any]]) -> list[str]:
    """Send ``event``'s message when the run's user asked for it (its Start record's
    ``config.notify``); the problems, as warnings."""
    from .insights.notify import wanted

    notify = wanted(start, event)
    if notify is None:
        return []
    try:
        problems = notifier.send(event, identity.run, identity.user, identity.uid,
                                 identity.job_id, insights, notify)
    except OSError as e:
        problems = [f"no message: {e.strerror or type(e).__name__}"]
    return [f"run {identity.run}: {p}" for p in problems]


ShippedHook = Callable[[_RunJob, bytes], None]


def ship_runs(store: Store, jobs: list[_RunJob], result: UploadResult, *,
              max_bytes: int = BATCH_BYTES, retention_days: float | None = RETENTION_DAYS,
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
QUOTA_SEQ = 1 << 50  # the daily bound's notes: one a shipping, by its time in milliseconds


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
            store.insert_ndjson(note.to_json().encode() + b"\n", job.identity)
        except StoreError as e:
            result.warnings.append(f"run {run}: cannot note the set-aside {name}: {e.message}")


def ship_run(store: Store, run_dir: Path, identity: Identity, rc: RunCursor,
             result: UploadResult, *, max_bytes: int = BATCH_BYTES,
             retention_days: float | None = RETENTION_DAYS, force: bool = False,
             job_info: JobInfo | None = None, notifier: Notifier | None = None) -> bool:
    """Ship what the cursor says is pending of one run (the caller holds the cursor lock,
    ``lock_cursor``) as ``identity``'s rows. Returns True when the whole run is in the store
    (end record shipped, every segment closed and fully shipped). Raises StoreUnavailable or
    StoreAuthError (the cursor keeps only what the store accepted); data errors set the
    segment aside and are reported in ``result``."""
    return ship_runs(store, [_RunJob(run_dir, rc, identity)], result, max_bytes=max_bytes,
                     retention_days=retention_days, force=force, job_info=job_info,
                     notifier=notifier)[0]


def _retire(rc: RunCursor, pending: list[_Pending], retention_days: float | None,
            result: UploadResult) -> None:
    """Delete closed segments the store fully accepted, once older than the retention. The
    names are looked at and removed in the run directory's descriptor (``rc.dir``); removing
    a name never changes the file it named, whatever the user put there."""
    if retention_days is None:
        return
    cur = rc.cursor
    now = time.time()
    for p in pending:
        if not p.seg.closed or p.seg.index in cur.aside:
            continue
        if cur.lines.get(p.seg.index, 0) < p.skip + p.count:
            continue
        try:
            if now - rc.dir.lstat(p.seg.path.name).st_mtime < retention_days * 86400:
                continue
            rc.dir.unlink(p.seg.path.name)
        except FileNotFoundError:
            pass
        except (OSError, SpoolError) as e:
            why = e.message if isinstance(e, SpoolError) else e.strerror
            result.warnings.append(f"cannot delete shipped segment {p.seg.path}: {why}")
            continue
        cur.deleted.append(p.seg.index)
        result.deleted += 1


def retire_shipped(rc: RunCursor, retention_days: float, result: UploadResult) -> bool:
    """Delete the closed segments of a shipped run (``rc.cursor.shipped_at``: every line of
    it is in the store) once older than the retention; whether any went, so that the caller,
    who holds the cursor lock, saves the cursor."""
    if not rc.cursor.shipped_at:
        return False
    try:
        segs = segments(rc.run_dir)
    except SpoolError as e:
        result.warnings.append(f"run {rc.run_dir.name}: {e.message}")
        return False
    done = [_Pending(seg, 0, b"", 0, False) for seg in segs if seg.closed]
    deleted = result.deleted
    _retire(rc, done, retention_days, result)
    return result.deleted != deleted


def _take_warnings(rc: RunCursor, result: UploadResult) -> None:
    """The files ``rc`` refused (``userfiles``), once each in ``result``."""
    result.warnings += [f"run {rc.run_dir.name}: {w}" for w in rc.warnings
                        if f"run {rc.run_dir.name}: {w}" not in result.warnings]


# --- retrying ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """How long a shipper waits before it tries a failing store again: ``first`` seconds,
    then twice the last wait, at most ``most`` (Vector's sinks likewise back off exponentially
    up to ``retry_max_duration_secs``, 30 s by default). The one curve of ``upload`` and the
    ``Agent``."""

    first: float = 0.5
    most: float = 30.0

    def after(self, delay: float) -> float:
        """The wait after a failure, ``delay`` being the wait before it (0: none yet)."""
        return min(max(delay * 2, self.first), self.most)


RETRY = RetryPolicy()


def _with_retry(fn: Callable[[], Any], deadline: float, sleep: Callable[[float], None],
                warn: Warn | None, policy: RetryPolicy = RETRY) -> Any:
    """Run ``fn``; retry StoreUnavailable with ``policy``'s backoff until ``deadline``
    (monotonic). Auth and data errors pass straight through."""
    delay = 0.0
    while True:
        try:
            return fn()
        except StoreUnavailable as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            delay = policy.after(delay)
            if warn:
                warn(f"{e.message}; retrying in {min(delay, left):.1f}s")
            sleep(min(delay, left))


# --- upload -----------------------------------------------------------------------------------
def upload(spool_root: Path, run: str | None = None, all: bool = False,  # noqa: A002
           force: bool = False, dsn: str | None = None, *, deadline: float = DEADLINE,
           retention_days: float | None = RETENTION_DAYS,
           identify: Callable[[Path], Identity] = identity_from_spool,
           max_bytes: int = BATCH_BYTES, warn: Warn | None = None,
           sleep: Callable[[float], None] = time.sleep,
           shipped_ok: bool = False, job_info: JobInfo | None = None,
           notifier: Notifier | None = None) -> UploadResult:
    """Ship runs from ``spool_root`` to the store ``dsn``: the latest run (default), ``run``,
    or ``all`` runs not yet shipped (oldest first). A run already shipped is refused in
    single-run mode (exit 2) and skipped with ``all``, unless ``force``; ``shipped_ok``
    skips it in single-run mode too (the epilog, which may find that the agent was first).
    Never raises for store or spool failures: they are in the result (gpufl's
    ``upload_logs``)."""
    t0 = time.monotonic()
    result = UploadResult()
    end = t0 + deadline
    try:
        selected = _select(Path(spool_root), run, all)
    except LogcaptureError as e:
        result.exit_code, result.error = 2, e.message
        return result
    if not selected:
        result.warnings.append(f"no runs in {spool_root}")
        result.elapsed = time.monotonic() - t0
        return result

    store: Store | None = None

    def get_store() -> Store:
        nonlocal store
        if store is None:
            store = _with_retry(
                lambda: open_store(dsn, wait=max(0.0, min(STORE_WAIT, end - time.monotonic()))),
                end, sleep, warn)
        return store

    try:
        for run_dir in selected:
            try:
                _upload_one(run_dir, get_store, result, force=force,
                            single=not all, shipped_ok=shipped_ok, end=end,
                            retention_days=retention_days, identify=identify,
                            max_bytes=max_bytes, sleep=sleep, warn=warn, job_info=job_info,
                            notifier=notifier)
            except StoreAuthError as e:
                result.failed.append(run_dir.name)
                result.error = e.message
                result.exit_code = 2
                break
            except StoreUnavailable as e:
                result.failed.append(run_dir.name)
                result.error = (f"{e.message} (gave up after {deadline:.0f}s; the spool is "
                                "kept, upload again later)")
                break
            except (StoreError, SpoolError) as e:
                result.failed.append(run_dir.name)
                result.error = e.message
                if isinstance(e, StoreError) and not isinstance(e, StoreDataError):
                    break
    finally:
        if store is not None:
            store.close()
    if result.exit_code == 0:
        if result.failed:
            result.exit_code = 1 if (result.runs or result.records) else 2
        elif result.bad_lines or result.set_aside or result.torn:
            result.exit_code = 1
    result.elapsed = time.monotonic() - t0
    return result


def _select(root: Path, run: str | None, all_runs: bool) -> list[Path]:
    if run and all_runs:
        raise LogcaptureError("--run and --all are mutually exclusive")
    if not root.is_dir():
        raise LogcaptureError(f"spool directory {root} does not exist")
    if run:
        # a run id, or a Slurm job reference (1234, 1234_5, 1234.1) as `ls` shows it, in a
        # user's spool or a cluster's spool root (one folder per job)
        return [find_run(root, run)]
    runs = find_run_dirs(root)
    if all_runs:
        return runs
    return runs[-1:]


def _upload_one(run_dir: Path, get_store: Callable[[], Store], result: UploadResult, *,
                force: bool, single: bool, end: float, retention_days: float | None,
                shipped_ok: bool = False,
                identify: Callable[[Path], Identity], max_bytes: int,
                sleep: Callable[[float], None], warn: Warn | None,
                job_info: JobInfo | None = None, notifier: Notifier | None = None) -> None:
    name = run_dir.name
    with lock_cursor(run_dir, wait=max(0.0, end - time.monotonic())) as rc:
        if rc is None:
            raise StoreUnavailable(f"run {name}: another shipper holds its cursor")
        if rc.cursor.shipped_at and not force:
            if single and not shipped_ok:
                raise StoreError(
                    f"run {name} was already uploaded on {rc.cursor.shipped_at} "
                    f"({rc.cursor.records} records). Pass --force to re-upload.")
            result.skipped.append(name)
            _take_warnings(rc, result)
            if retention_days is not None and retire_shipped(rc, retention_days, result):
                rc.save()
            return
        identity = identify(run_dir)

        def attempt() -> bool:
            return ship_run(get_store(), run_dir, identity, rc, result, max_bytes=max_bytes,
                            retention_days=retention_days, force=force, job_info=job_info,
                            notifier=notifier)

        first = True

        def once() -> bool:
            nonlocal first
            f, first = first, False
            if not f:
                # the failed attempt recorded nothing; re-read what is pending
                rc.cursor = rc._load()
            return attempt()

        done = _with_retry(once, end, sleep, warn)
        if done or not single or rc.cursor.records:
            result.runs.append(name)


# --- the agent -----------------------------------------------------------------------------
@dataclass
class AgentStats:
    flushes: int = 0
    records: int = 0
    failures: int = 0
    last_error: str = ""


# How often the agent says again that the store is still unreachable, and what is waiting.
REMIND_EVERY = 300.0
# Seconds a batch in flight gets after TERM before the agent gives it up and exits: within
# systemd's TimeoutStopSec (slurm/logcapture-agent.service) with room to spare. The store did
# not take what was given up, or took it and the cursor does not say so: the next start ships
# it (again; the store drops the copies).
STOP_GRACE = 5.0


class AgentStopped(BaseException):
    """Raised in the agent's main thread (``Agent.install_signal_handlers``) when a store call
    outlasts ``STOP_GRACE`` after TERM: a ``BaseException`` like ``KeyboardInterrupt``, so that
    no ``except Exception`` of the HTTP client holds it."""


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclass
class _Outage:
    """The store's state as the agent's log tells it: one line when it fails, a reminder at
    most every ``remind_every`` seconds while it stays down, one line when it is back."""

    remind_every: float
    since: float | None = None  # agent clock of the first failure
    reason: str = ""
    reminded_at: float = 0.0
    failures: int = 0
    shipped: int = 0  # records shipped since the first failure (partial flushes)
    shipped_bytes: int = 0

    def failed(self, now: float, reason: str, waiting: Callable[[], str]) -> str | None:
        self.failures += 1
        self.reason = reason
        if self.since is None:
            self.since = self.reminded_at = now
            return f"store unreachable: {reason}; keeping the spool and retrying"
        if now - self.reminded_at < self.remind_every:
            return None
        self.reminded_at = now
        return (f"store still unreachable after {_duration(now - self.since)} "
                f"({self.failures} tries): {reason}; waiting: {waiting()}")

    def shipped_some(self, result: UploadResult) -> None:
        self.shipped += result.records
        self.shipped_bytes += result.bytes

    def recovered(self, now: float) -> str | None:
        if self.since is None:
            return None
        line = (f"store reachable again after {_duration(now - self.since)} down "
                f"({self.failures} failed tries); shipped {self.shipped} records "
                f"({self.shipped_bytes / 1e6:.1f} MB) since")
        self.since, self.failures, self.shipped, self.shipped_bytes = None, 0, 0, 0
        return line


class Agent:
    """Tail every run under ``spool_root`` and ship new lines in batches: a flush happens when
    the unshipped bytes reach ``batch_bytes`` or the oldest unshipped data is
    ``batch_interval`` seconds old. The store is opened for each flush and closed after it, so
    other processes can use an embedded store in between. ``stop()`` (the CLI calls it on
    TERM/INT) makes ``run()`` flush what is pending and return.

    The node samplers' spool ``spool_root/.samples`` (docs/admin.md: laid out like a spool
    root, ``.samples/JOB/RUN``) is tailed too, so one agent per node ships both. A samples-only
    run has no End record: it is done once everything it holds is shipped and either
    ``job_ended(run_dir)`` says its job ended (the CLI reads the job's trusted record) and its
    segments are closed, or no sample came for ``samples_idle`` seconds; then it is no longer
    watched.

    Transient store failures keep the data and retry on the next flush with ``retry``'s
    backoff; ``log`` (every line printed, unlike ``warn``'s, which may print each distinct
    message once) says when the store failed, every ``remind_every`` seconds what is waiting
    while it stays down, and when it is back. An authentication failure stops the agent
    (``run()`` raises StoreAuthError). ``timeouts``: a server's connect and send/receive
    timeouts (``open_store``)."""

    def __init__(self, spool_root: Path, dsn: str | None = None, *,
                 batch_bytes: int = BATCH_BYTES, batch_interval: float = BATCH_INTERVAL,
                 poll: float = 0.25, retention_days: float | None = RETENTION_DAYS,
                 identify: Callable[[Path], Identity] = identity_from_spool,
                 job_ended: Callable[[Path], bool] = lambda run_dir: False,
                 samples_idle: float = SAMPLES_IDLE, warn: Warn | None = None,
                 job_info: JobInfo | None = None, notifier: Notifier | None = None,
                 stall_seconds: float = 1800.0, live_every: float = LIVE_EVERY,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, log: Warn | None = None,
                 retry: RetryPolicy = RETRY, remind_every: float = REMIND_EVERY,
                 timeouts: tuple[float, float] = (5.0, 60.0), stop_grace: float = STOP_GRACE):
        self.spool_root = Path(spool_root)
        self.job_ended = job_ended
        self.job_info = job_info
        self.notifier = notifier
        self.live = LiveWatch(stall_seconds)
        self.live_every = live_every
        self._live_at = 0.0  # agent clock of the next stall check
        self._live_runs: dict[tuple[str, int], tuple[Path, Identity]] = {}
        self.samples_idle = samples_idle
        self.wall = wall
        self.dsn = dsn
        self.batch_bytes = batch_bytes
        self.batch_interval = batch_interval
        self.poll = poll
        self.retention_days = retention_days
        self.identify = identify
        self.warn = warn or (lambda m: None)
        self.log = log or self.warn
        self.retry = retry
        self.timeouts = timeouts
        self.stop_grace = stop_grace
        self._outage = _Outage(remind_every)
        self._stop_by: float | None = None  # agent clock by which a stopping agent exits
        self._final = False  # in the flush after the loop (``run``)
        self._alarm = False  # a SIGALRM armed by TERM (``install_signal_handlers``)
        self.clock = clock
        self.stats = AgentStats()
        self._stop = threading.Event()
        self._seen: dict[tuple[str, int], int] = {}  # (run dir, segment index) -> size seen
        self._dirty_since: float | None = None
        self._dirty_bytes = 0
        self._backoff = 0.0
        self._retry_at = 0.0
        self._done: set[str] = set()  # runs fully shipped
        self._sweep_at = 0.0  # agent clock of the next sweep (``sweep``)
        self._said: set[str] = set()  # refused files warned of (``_say_refused``)

    def stop(self) -> None:
        """Make ``run()`` return: it ships no new batch after ``stop_grace`` seconds."""
        if self._stop_by is None:
            self._stop_by = self.clock() + self.stop_grace
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """TERM and INT stop the agent (``stop``); a store call still blocked ``stop_grace``
        seconds later (a server that accepts and never answers) is broken off by SIGALRM
        (setitimer(2)), whose handler raises ``AgentStopped``: the blocked system call returns
        EINTR and Python runs the handler (PEP 475). Main thread only, as every handler."""
        def term(*_: object) -> None:
            if not self._stop.is_set():
                self._alarm = True
                signal.setitimer(signal.ITIMER_REAL, self.stop_grace)
            self.stop()

        def alarm(*_: object) -> None:
            raise AgentStopped

        signal.signal(signal.SIGALRM, alarm)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, term)

    def run_dirs(self) -> list[Path]:
        """The runs to tail: the spool root's, then the node samplers' (``.samples``, when it
        is a directory and not a symlink)."""
        out = find_run_dirs(self.spool_root)
        samples = self.spool_root / SAMPLES_DIR
        try:
            if stat.S_ISDIR(os.stat(samples, follow_symlinks=False).st_mode):
                out += find_run_dirs(samples)
        except OSError:
            pass
        return out

    def _is_samples(self, run_dir: Path) -> bool:
        return run_dir.parent.parent == self.spool_root / SAMPLES_DIR

    def _samples_done(self, job: _RunJob) -> bool:
        """A samples-only run (no End record) is done when all its complete lines are in the
        store, nothing is set aside, and its job ended (segments closed) or it is idle."""
        cur = job.rc.cursor
        if cur.aside or any(cur.lines.get(p.seg.index, 0) < p.skip + p.count
                            for p in job.pending):
            return False
        closed = all(p.seg.closed for p in job.pending)
        if not (closed and self.job_ended(job.run_dir)):
            # segments only: the directory's mtime moves with every cursor save
            newest = max((_mtime(p.seg.path) for p in job.pending), default=0.0)
            if self.wall() - newest < self.samples_idle:
                return False
        cur.shipped_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        job.rc.save()
        return True

    def scan(self) -> int:
        """Bytes appended to spools since the last look (stat only, no reading)."""
        grown = 0
        for run_dir in self.run_dirs():
            if str(run_dir) in self._done:
                continue
            try:
                segs = segments(run_dir)
            except SpoolError:
                continue
            for seg in segs:
                key = (str(run_dir), seg.index)
                try:
                    size = os.stat(seg.path, follow_symlinks=False).st_size
                except OSError:
                    continue
                if key not in self._seen:
                    grown += size or 1
                elif size != self._seen[key]:
                    grown += abs(size - self._seen[key]) or 1
                self._seen[key] = size
        return grown

    def due(self) -> bool:
        grown = self.scan()
        now = self.clock()
        if grown:
            self._dirty_bytes += grown
            if self._dirty_since is None:
                self._dirty_since = now
        if self._dirty_since is None or now < self._retry_at:
            return False
        return (self._dirty_bytes >= self.batch_bytes
                or now - self._dirty_since >= self.batch_interval)

    def _stopping(self) -> bool:
        """Between batches: whether to leave the rest for the next start (stopped, and the
        grace is over) or for the next flush (stopped: the last flush ships what it can)."""
        return self._stop_by is not None and (self.clock() >= self._stop_by
                                              or not self._final)

    def flush(self) -> UploadResult:
        """Ship everything pending now (one store session for all runs), batch by batch,
        until the agent stops."""
        result = UploadResult()
        self._dirty_since, self._dirty_bytes = None, 0
        runs = [r for r in self.run_dirs() if str(r) not in self._done]
        if not runs:
            return result
        found: dict[int, list[Any]] = {}
        try:
            with open_store(self.dsn, wait=STORE_WAIT, connect_timeout=self.timeouts[0],
                            send_receive_timeout=self.timeouts[1]) as store, \
                    ExitStack() as stack:
                jobs = self._jobs(runs, stack)
                done = ship_runs(store, jobs, result, max_bytes=self.batch_bytes,
                                 retention_days=self.retention_days, job_info=self.job_info,
                                 notifier=self.notifier, until=self._stopping,
                                 shipped=self._watch(found))
                self._observe(store, jobs, found, result)
                self._finish(store, jobs, done, result)
            self._backoff = 0.0
            self._outage.shipped_some(result)
            if (line := self._outage.recovered(self.clock())) is not None:
                self.log(line)
        except StoreAuthError:
            raise
        except StoreError as e:
            self._failed(e, result)
        self._warn_and_count(result)
        return result

    def _failed(self, e: StoreError, result: UploadResult) -> None:
        """A flush the store failed: retry later (``retry``), and say so (``_Outage``)."""
        self.stats.failures += 1
        self.stats.last_error = e.message
        self._backoff = self.retry.after(self._backoff)
        self._retry_at = self.clock() + self._backoff
        self._dirty_since = self._dirty_since or self.clock()
        self._outage.shipped_some(result)
        line = self._outage.failed(self.clock(), e.message, self.waiting)
        if line is not None:
            self.log(line)

    def waiting(self) -> str:
        """What the spool holds that the store has not taken, for the log: runs, and the
        bytes on disk of their segments with nothing shipped yet or still open (a segment
        shipped in part is left out: this is a stat of each segment, no reading)."""
        runs = size = 0
        for run_dir in self.run_dirs():
            if str(run_dir) in self._done:
                continue
            try:
                with UserDir(run_dir) as d:
                    cur = RunCursor(run_dir, d).cursor
                if cur.shipped_at:
                    continue
                segs = [seg for seg in segments(run_dir)
                        if seg.index not in cur.aside
                        and (not seg.closed or seg.index not in cur.lines)]
                size += sum(os.stat(seg.path, follow_symlinks=False).st_size for seg in segs)
            except (SpoolError, OSError):
                continue
            runs += 1
        return f"{runs} run(s), {size / 1e6:.1f} MB of spool segments"

    def _jobs(self, runs: list[Path], stack: ExitStack) -> list[_RunJob]:
        """The runs to ship now, each with its cursor locked (in ``stack``) and its identity:
        not one an upload holds (next time), one already shipped, or one whose first line is
        not written yet (the identity would miss the Start record's cluster and job id, and
        the rows read next would carry that; its growth brings it back)."""
        jobs = []
        for run_dir in runs:
            try:
                rc = stack.enter_context(lock_cursor(run_dir, wait=0))
            except SpoolError:
                if not os.path.isdir(run_dir):
                    continue  # removed since it was listed (the epilog shipped it)
                raise
            if rc is None:
                self._dirty_since = self._dirty_since or self.clock()
                continue
            self._say_refused(rc)
            if rc.cursor.shipped_at:
                self._done.add(str(run_dir))
                continue
            if not _begun(run_dir):
                continue
            try:
                jobs.append(_RunJob(run_dir, rc, self.identify(run_dir)))
            except (LogcaptureError, OSError) as e:
                self.warn(f"run {run_dir.name}: {e}")
        return jobs

    def _say_refused(self, rc: RunCursor) -> None:
        """Warn of the files ``rc`` refused (``userfiles``) now, whatever is done with the run
        next (a run already shipped, or not begun, goes no further)."""
        for w in rc.warnings:
            said = f"run {rc.run_dir.name}: {w}"
            if said not in self._said:  # a file refused by the sweep and then by a flush
                self._said.add(said)
                self.warn(said)
        rc.warnings.clear()
        if len(self._said) > 10_000:  # said again after a while, not remembered forever
            self._said.clear()

    def _finish(self, store: Store, jobs: list[_RunJob], done: list[bool],
                result: UploadResult) -> None:
        """Stop watching the runs shipped to their end; a samples-only run is done once its
        job ended (its efficiency notes then have every sample)."""
        for job, d in zip(jobs, done, strict=True):
            if not d and self._is_samples(job.run_dir):
                d = self._samples_done(job)
                if d:
                    diagnose_run(store, job.identity, self.job_info(job.run_dir)
                                 if self.job_info else {}, result, self.notifier)
            if d:
                key = (job.identity.run, job.identity.uid)
                self.live.forget(key)
                self._live_runs.pop(key, None)
                self._done.add(str(job.run_dir))
                result.runs.append(job.run_dir.name)

    def _warn_and_count(self, result: UploadResult) -> None:
        for run, seg, no, why in result.bad_lines:
            self.warn(f"run {run}: {seg} line {no}: corrupt line skipped: {why}")
        for run, seg, why in result.set_aside:
            self.warn(f"run {run}: {seg} set aside: {why}")
        for w in result.warnings:
            self.warn(w)
        self.stats.flushes += 1
        self.stats.records += result.records

    # --- while jobs run (logcapture.insights.live)
    def _watch(self, found: dict[int, list[Any]]) -> ShippedHook:
        """``ship_runs``' hook: show the live watch each batch the store took (as it goes:
        the bytes are not kept), gathering what it finds by job (``id``) in ``found``."""
        now = self.wall()

        def shipped(job: _RunJob, data: bytes) -> None:
            if data:
                key = (job.identity.run, job.identity.uid)
                found.setdefault(id(job), []).extend(self.live.observe(key, data, now))
        return shipped

    def _observe(self, store: Store, jobs: list[_RunJob], found: dict[int, list[Any]],
                 result: UploadResult) -> None:
        """Store and announce what the live watch found in what was just shipped
        (``_watch``); every run it saw is watched for stalls from now on."""
        now = self.wall()
        for job in jobs:
            key = (job.identity.run, job.identity.uid)
            if not self._is_samples(job.run_dir):
                self._live_runs[key] = (job.run_dir, job.identity)
                self.live.observe(key, b"", now)
            if found.get(id(job)):
                self._report(store, job.identity, key, found[id(job)], "nan-metric", result)

    def _report(self, store: Store, identity: Identity, key: tuple[str, int],
                found: list[Any], event: str, result: UploadResult) -> None:
        dicts = [i.to_dict() for i in found]
        try:
            store.insert_insights(identity, dicts, self.wall())
        except StoreError as e:
            result.warnings.append(f"run {identity.run}: {event} not stored: {e.message}")
        if self.notifier is not None:
            result.warnings += notify_event(self.notifier, event, identity,
                                            self.live.start_record(key), dicts)

    def check_live(self, now: float | None = None) -> int:
        """Look for runs that stalled (every ``live_every`` seconds from ``run()``); store
        and announce them. Returns how many were found."""
        now = self.wall() if now is None else now
        stalled = []
        for key, (run_dir, identity) in list(self._live_runs.items()):
            if self.live.start_record(key) is None:
                continue  # a run seen before its Start record: not judged
            running = not self.job_ended(run_dir)
            insight = self.live.check(key, now, running)
            if insight is not None:
                stalled.append((key, identity, insight))
        if not stalled:
            return 0
        result = UploadResult()
        try:
            with open_store(self.dsn, connect_timeout=self.timeouts[0],
                            send_receive_timeout=self.timeouts[1]) as store:
                for key, identity, insight in stalled:
                    self._report(store, identity, key, [insight], "stalled", result)
        except StoreError as e:
            self.warn(f"stalled run(s) not stored: {e.message}")
        for w in result.warnings:
            self.warn(w)
        return len(stalled)

    def _slurm_end(self, run_dir: Path) -> str | None:
        """How Slurm says the run's job ended (``NODE_FAIL``, ...), asked only of a run whose
        writer lock is free; None when it has not ended or this is not a Slurm job."""
        from .slurm.jobs import END_STATES

        if self.job_info is None or not writer_gone(run_dir):
            return None
        try:
            said = str(self.job_info(run_dir).get("slurm_state") or "").split(" ")[0]
        except Exception:  # noqa: BLE001 - Slurm's answer is a hint; the grace rule stands
            return None
        return said if said in END_STATES else None

    def end_abandoned(self) -> int:
        """End the runs whose writer is gone (``spool.close_abandoned``; with the live watch):
        nothing else would end a run whose wrapper and node went away outside Slurm, and the
        agent would watch it forever. Their end record ships with the next flush."""
        ended = 0
        for run_dir in self.run_dirs():
            if str(run_dir) in self._done:
                continue
            try:
                end = close_abandoned(run_dir, state=self._slurm_end(run_dir))
                if end is not None:
                    ended += 1
                    self.log(f"run {run_dir.name}: its writer is gone; ended as "
                             f"{getattr(end, 'state', LOST)}")
            except (SpoolError, OSError) as e:
                self.warn(f"run {run_dir.name}: cannot end it: {e}")
        return ended

    def sweep(self) -> UploadResult:
        """Delete the segments of shipped runs that have outlived the retention (every
        ``SWEEP_EVERY`` seconds from ``run()``). A run busy with an upload is left for the
        next sweep."""
        result = UploadResult()
        if self.retention_days is None:
            return result
        for run_dir in self.run_dirs():
            try:
                with lock_cursor(run_dir, wait=0) as rc:
                    if rc is None:
                        continue
                    self._say_refused(rc)
                    if not rc.cursor.shipped_at:
                        continue
                    if retire_shipped(rc, self.retention_days, result):
                        rc.save()
            except (SpoolError, OSError) as e:  # removed meanwhile, or unreadable
                if os.path.isdir(run_dir):
                    self.warn(f"run {run_dir.name}: {e}")
        for w in result.warnings:
            self.warn(w)
        return result

    def run(self) -> AgentStats:
        """Loop until ``stop()``; then flush what is pending (batch by batch, until the store
        fails once or ``stop_grace`` is over) and return. A flush in progress at ``stop()``
        ends after its batch; a store call blocked past the grace is broken off
        (``install_signal_handlers``)."""
        try:
            while not self._stop.is_set():
                if self.due():
                    self.flush()
                if self.clock() >= self._live_at:
                    self._live_at = self.clock() + self.live_every
                    self.end_abandoned()
                    self.check_live()
                if self.clock() >= self._sweep_at:
                    self._sweep_at = self.clock() + SWEEP_EVERY
                    self.sweep()
                self._stop.wait(self.poll)
            self._final = True
            self.scan()
            self.flush()
        except AgentStopped:
            self.log(f"stopped after {self.stop_grace:.0f}s with a store call unanswered; "
                     "the next start ships what is left")
        finally:
            if self._alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        return self.stats


def describe_dsn(dsn: str | None) -> str:
    from .store import resolve_dsn

    return redact(resolve_dsn(dsn))
