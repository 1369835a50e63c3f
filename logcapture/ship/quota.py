"""The store's per-user daily bound, applied where the shipper writes the store."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import LogcaptureError, StoreError
from ..records import NOTE_WARNING, Note, run_lines
from ..store import Store
from .pending import _Piece, _RunJob
from .result import UploadResult

QUOTA_REFRESH = 300.0  # seconds between two reads of what a user stored today
QUOTA_SEQ = 1 << 50  # the daily bound's notes: one a shipping, by its time in milliseconds


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
        kept = run_lines(piece.data)
        gone = self.left_out.setdefault(str(piece.job.run_dir), [0, 0])
        gone[0] += piece.count - len(kept)
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
                store.insert_records([note], job.identity)
            except StoreError as e:
                result.warnings.append(f"run {job.run_dir.name}: {e.message}")
            result.warnings.append(f"run {job.run_dir.name}: {gone[0]} lines not stored: "
                                   f"{job.identity.user}'s daily bound reached")


def user_quota() -> UserQuota | None:
    """The admin config's ``user_daily_bytes`` as a ``UserQuota`` (None: no bound)."""
    from ..config.admin import load_admin

    try:
        limit = int(load_admin().user_daily_bytes)
    except LogcaptureError:
        return None
    return UserQuota(limit) if limit > 0 else None
