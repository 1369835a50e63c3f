"""Deleting shipped segments once they are older than the retention.

A segment is deleted only after the store accepted all its lines, once it is closed, and then
per ``retention_days`` (0: at once; None: never; by default
``config.defaults.SPOOL_RETENTION_DAYS``, 7). The spool's retention, not the store's TTL
(the admin config's ``store_ttl_days``).
"""

from __future__ import annotations

import time

from ..errors import SpoolError
from ..spool.layout import segments
from .cursor import RunCursor
from .pending import _Pending
from .result import UploadResult


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
