"""Shipping: spool -> store. ``upload()`` ships after the fact; ``Agent`` tails spools.

The package is split by concern, each module using only those before it:

- ``cursor``: what has been shipped of a run and the lock that guards it (``lock_cursor``).
- ``result``: what a shipping did (``UploadResult``).
- ``pending``: the segments pending of the runs being shipped, and the pieces cut from them.
- ``quota``: the store's per-user daily bound (``UserQuota``).
- ``retention``: deleting shipped segments once older than the retention (``retire_shipped``).
- ``diagnosis``: insights at ship time (``diagnose_run``, ``notify_event``).
- ``batches``: shipping the pending lines in batches, or as whole segments the store reads
  itself (``ship_runs``, ``ship_run``).
- ``retry``: the backoff of a store that is unavailable (``RetryPolicy``).
- ``uploading``: ``upload()``, the CLI's ``upload`` and the Slurm epilog.
- ``agent``: ``Agent``, which tails every run of a spool root.

Segments are read through ``spool.reading``, the one reader of segment files. A whole closed
segment bound for the embedded store is opened by the shipper (``spool.reading.open_segment``)
and read by the engine itself (``batches._ship_direct``); the open segment, what is left of a
partly shipped one, and anything the engine cannot read or refuses are read as bytes
(``read_segment_bytes``) and sent as they are, one segment at a time as the batches reach them
(``pending._pieces``, a generator): a shipper holds one batch and one segment, whatever the
backlog after an outage.

Failures (as Vector's ClickHouse sink and gpufl sort them):

- ``StoreUnavailable`` (connection refused, timeout, a chDB folder locked by another process):
  retried with exponential backoff inside a total deadline; the spool is kept.
- ``StoreDataError`` (codes 117, 53, 27, 26, 72, ...): the segment is set aside (recorded in
  the cursor, never deleted, reported) and the rest continues. Bad lines never get that far:
  they are skipped, counted and reported by segment and line number.
- ``StoreAuthError`` (516, 192, 497, HTTP 401/403): stop at once.
"""

from __future__ import annotations

from ..ownership import identity_from_spool, trusted_identity
from ..spool.layout import CURSOR_NAME
from .agent import (
    BATCH_INTERVAL,
    LIVE_EVERY,
    REMIND_EVERY,
    SAMPLES_DIR,
    SAMPLES_IDLE,
    STOP_GRACE,
    SWEEP_EVERY,
    Agent,
    AgentStats,
    AgentStopped,
)
from .batches import BATCH_BYTES, DIRECT_BATCHES, SET_ASIDE_SEQ, ShippedHook, ship_run, ship_runs
from .cursor import CURSOR_LOCK_NAME, MAX_CURSOR_BYTES, Cursor, RunCursor, is_shipped, lock_cursor
from .diagnosis import JobInfo, diagnose_run, notify_event
from .pending import _RunJob
from .quota import QUOTA_REFRESH, QUOTA_SEQ, UserQuota, user_quota
from .result import UploadResult
from .retention import retire_shipped
from .retry import RETRY, STORE_WAIT, RetryPolicy, Warn
from .uploading import DEADLINE, describe_dsn, upload

__all__ = [
    "BATCH_BYTES", "BATCH_INTERVAL", "CURSOR_LOCK_NAME", "CURSOR_NAME", "DEADLINE",
    "DIRECT_BATCHES", "LIVE_EVERY", "MAX_CURSOR_BYTES", "QUOTA_REFRESH", "QUOTA_SEQ",
    "REMIND_EVERY", "RETRY", "SAMPLES_DIR", "SAMPLES_IDLE", "SET_ASIDE_SEQ",
    "STOP_GRACE", "STORE_WAIT", "SWEEP_EVERY", "Agent", "AgentStats", "AgentStopped", "Cursor",
    "JobInfo", "RetryPolicy", "RunCursor", "ShippedHook", "UploadResult", "UserQuota", "Warn",
    "_RunJob", "describe_dsn", "diagnose_run", "identity_from_spool", "is_shipped", "lock_cursor",
    "notify_event", "retire_shipped", "ship_run", "ship_runs",
    "trusted_identity", "upload", "user_quota",
]
