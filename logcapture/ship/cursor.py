"""The cursor: what has been shipped of one run, and the lock that guards it.

``upload()`` and the ``Agent`` share one **cursor** per run directory
(``.logcapture-cursor.json``), guarded by an ``flock`` on ``.logcapture-cursor.lock``, so they
can run at the same time without sending a line twice (gpufl's cursor-file convention). The
cursor counts the complete lines shipped per segment *index*: a segment is renamed
``seg-N.ndjson`` -> ``seg-N.ndjson.gz`` when closed, which changes its bytes but not its lines.
A shipper holds the run's lock from reading the segment to writing the cursor. If it dies
between the store accepting a batch and the cursor being written, the next shipper sends those
lines again, and the store's ReplacingMergeTree (read with FINAL) shows each record once.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpoolError
from ..spool.layout import CURSOR_NAME
from ..store import flock_within
from ..userfiles import RefusedFile, UserDir

CURSOR_LOCK_NAME = ".logcapture-cursor.lock"
MAX_CURSOR_BYTES = 16 * 1024 * 1024  # a cursor holds a few numbers per segment


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
            elif not flock_within(fd, wait):
                yield None
                return
            yield RunCursor(run_dir, d, warnings)
        finally:
            os.close(fd)
    finally:
        d.close()
