"""Writing a run's spool: ``SpoolWriter``.

Records are encoded by the caller's thread into an in-memory buffer; a flusher thread writes the
buffer on a time trigger (``flush_interval``), a size trigger (``flush_records``), on demand
(``flush()``) and at ``close()``, and fdatasyncs at most every ``flush_interval`` (and when the
job goes quiet), so the job never waits on disk sync (fsync per line would throttle the job: the
pty fills while the disk syncs) and a flood does not sync per batch. A segment that reaches
``segment_bytes`` is closed and gzip-compressed.

Flow control, not loss: a writer that finds ``max_pending`` records waiting writes them to disk
itself before adding its own, so a producer faster than the disk is slowed to the disk's pace
(in the capture worker that stops it reading frames, the reader stops reading the pty, and the
job waits on its terminal as on a slow one). Records are dropped only when the disk refuses
them: a failed write (disk full, the ``keep_free`` reserve reached, RLIMIT_FSIZE, I/O error) is
reported once through ``warn``, keeps the complete lines that fit, compresses the open segment
to make room, and leaves the rest buffered (up to ``max_pending`` records; past that output
records are counted in ``lost``, never a record about the run: ``stream`` ``run``), retrying on
the next trigger. ``loss`` says how many were lost since the caller last took it, and why, so
the caller can put a note where it happened. A small reserve file (``RESERVE_NAME``) holds
room for the run's last records on a full disk: ``close`` gives it back first.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..config.defaults import FLUSH_INTERVAL, FLUSH_RECORDS, SEGMENT_BYTES
from ..errors import SpoolError
from ..records import Record, run_lines
from .layout import RESERVE_NAME, gzip_compress, lock_run, segment_name

MAX_PENDING = 200_000
# Room kept on disk for a run's last records (its end record, the note of a loss): a file
# of this size made when the run starts and removed at close, before the last write, as
# journald keeps SystemKeepFree= (journald.conf(5)). An end record with every count is ~2 KiB.
RESERVE_BYTES = 64 * 1024


def _size(n: int) -> str:
    return f"{n / 1048576:.1f} MiB" if n >= 1048576 else f"{n} bytes"


class SpoolWriter:
    """Append records to a run's spool. Thread-safe; never raises from ``write``."""

    def __init__(self, run_dir: Path, *, segment_bytes: int = SEGMENT_BYTES,
                 flush_interval: float = FLUSH_INTERVAL, flush_records: int = FLUSH_RECORDS,
                 max_pending: int = MAX_PENDING, keep_free: int = 0,
                 warn: Callable[[str], None] | None = None, fsync: bool = True):
        self.run_dir = run_dir
        self.segment_bytes = max(1024, segment_bytes)
        self.flush_interval = flush_interval
        self.flush_records = max(1, flush_records)
        self.max_pending = max_pending
        self.keep_free = max(0, keep_free)  # bytes the spool leaves free on its filesystem
        self._warn = warn or (lambda msg: None)
        self._fsync = fsync
        # Encoded batches waiting for the flusher, each whole NDJSON lines, and how many lines
        # they hold (a batch is kept whole: splitting it into one bytes object per line and
        # joining them again cost ~0.25 us a line on a flood).
        self._pending: list[bytes] = []
        self._npending = 0
        self._lock = threading.Lock()  # guards _pending, _npending and the loss counts
        self._io_lock = threading.Lock()  # guards the segment file
        self._wake = threading.Event()
        self._asleep = False  # the flusher waits for a record (guarded by _lock)
        self._closed = False
        self._index = -1
        self._fd = -1
        self._size = 0
        self._failing = False
        self._reason = ""  # why the last write failed
        self._unreported = 0  # records lost since ``loss`` last took them
        self._unreported_reason = ""
        self.written = 0  # records written to disk
        self.lost = 0  # records dropped because the disk refused them and the buffer was full
        self.errors = 0
        self._reserve = self._make_reserve()
        self._lock_fd = self._hold_writer_lock()
        if not self._open_next():  # no first segment (out of descriptors, a full disk)
            self._release()
            raise SpoolError(f"cannot create a spool segment in {run_dir}: {self._reason}")
        self._thread = threading.Thread(target=self._run, name="logcapture-spool", daemon=True)
        self._thread.start()

    def _hold_writer_lock(self) -> int:
        """The run directory's writer lock (``close_abandoned``), held until ``close``: -1
        where it cannot be taken (the run is then never taken for abandoned)."""
        try:
            fd = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return -1
        if not lock_run(fd):
            os.close(fd)
            return -1
        return fd

    def _make_reserve(self) -> bool:
        """Hold ``RESERVE_BYTES`` of real blocks (not a sparse file) for the run's last records;
        False when the disk has not even that (the run then starts without it)."""
        path = self.run_dir / RESERVE_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o600)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError:
            os.close(fd)
            self._drop_reserve(path)
            return False
        os.close(fd)
        return True

    def _release(self) -> None:
        """Give back the reserve and the writer lock (a writer that could not start)."""
        self._drop_reserve()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _drop_reserve(self, path: Path | None = None) -> None:
        self._reserve = False
        try:
            os.unlink(path or self.run_dir / RESERVE_NAME)
        except OSError:
            pass

    @property
    def loss(self) -> tuple[int, str] | None:
        """Records lost since the last call, and why, once the spool writes again (or the run
        is closing): None when there is nothing to report yet. A cheap read while none was."""
        if not self._unreported or (self._failing and not self._closed):
            return None
        return self.take_loss()

    def take_loss(self) -> tuple[int, str] | None:
        """What ``loss`` gives, whether or not the spool writes again (a run's last word)."""
        with self._lock:
            n, why = self._unreported, self._unreported_reason
            self._unreported = 0
        return (n, why) if n else None

    # --- producer side -------------------------------------------------------------------
    def write(self, records: Iterable[Record]) -> None:
        records = records if isinstance(records, list) else list(records)
        texts = [r.to_json() for r in records]
        if not texts:
            return
        # One encode for the batch: a JSON line holds no raw newline or carriage return, so
        # its newlines count its lines (a ``Lines`` record gives several), and 'surrogatepass'
        # encodes each code point on its own, so these are exactly the bytes of encoding each
        # record alone.
        blob = ("\n".join(texts) + "\n").encode("utf-8", "surrogatepass")
        n = blob.count(b"\n")
        if self._npending + n > self.max_pending and not self._failing:
            # Flow control: the backlog goes to disk in this thread before more is taken.
            self._drain(sync=False)
        with self._lock:
            first = not self._pending
            if self._npending + n > self.max_pending and self._failing:
                blob, n = self._keep_run_records(records, texts, n)
            if n:
                self._pending.append(blob)
                self._npending += n
            big = self._npending >= self.flush_records
            wake = big or (first and self._asleep)
            if wake:
                self._asleep = False
        # The flusher sleeps while the job is quiet: the first record wakes it. While records
        # keep coming it flushes on its own clock, so a write costs no wake-up. Event.set()
        # takes a lock and notifies even when the event is set already: in a flood, most
        # batches find it set.
        if wake and not self._wake.is_set():
            self._wake.set()

    def _keep_run_records(self, records: list[Record], texts: list[str],
                          n: int) -> tuple[bytes, int]:
        """The disk refuses records and the buffer is full: keep the records about the run
        (start, warnings, the end: a handful), count the others as lost (with ``_lock``)."""
        kept = [t for r, t in zip(records, texts, strict=True) if r.stream == "run"]
        blob = ("\n".join(kept) + "\n").encode("utf-8", "surrogatepass") if kept else b""
        k = blob.count(b"\n")
        self._count_lost(n - k)
        return blob, k

    def _count_lost(self, n: int) -> None:
        """``n`` records the disk refused (with ``_lock``): in ``lost``, and for ``loss``."""
        self.lost += n
        self._unreported += n
        self._unreported_reason = self._reason

    def flush(self) -> None:
        """Write everything buffered and sync it, now, in the caller's thread."""
        self._drain(sync=True)

    def settle(self) -> None:
        """Before the run's last records: write what waits; when the disk still refuses it,
        count the buffered output as lost (``loss``), keep the records about the run, and
        give the reserve's room to them and to what comes next (the note, the end)."""
        self._drain(sync=False)
        if not self._failing:
            return
        with self._lock:
            kept = run_lines(b"".join(self._pending))
            self._pending = [b"".join(kept)] if kept else []
            self._count_lost(self._npending - len(kept))
            self._npending = len(kept)
        self._drop_reserve()
        self._drain(sync=False)

    def close(self) -> None:
        """Flush, close and compress the last segment. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join()
        self._drain(sync=True)
        if self._reserve:
            # The reserve's room is for these last records; a run that ends on a full disk
            # writes them into it.
            self._drop_reserve()
            if self._failing:
                self._drain(sync=True)
        with self._io_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
                self._compress(self._index)
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # the run has its end: the lock has done its work
                self._lock_fd = -1

    # --- flusher thread ------------------------------------------------------------------
    def restart_flusher(self) -> None:
        """Hand the flushing to a new thread, which takes the scheduling policy of the thread
        calling this (capture.serve_in_idle_time: SCHED_IDLE while the worker renders in idle
        time, the normal policy once it cannot keep up there). The old thread touches nothing
        more: it ends at its next wake-up, which this gives it. Raises RuntimeError, and
        changes nothing, when no thread can be started."""
        go = threading.Event()

        def flusher() -> None:
            go.wait()
            self._run()

        thread = threading.Thread(target=flusher, name="logcapture-spool", daemon=True)
        thread.start()  # before anything changes: a failure leaves the old flusher in place
        with self._lock:
            if self._closed:
                go.set()  # it finds the spool closed and returns
                return
            old_wake, self._wake = self._wake, threading.Event()
            self._thread = thread
        go.set()
        old_wake.set()

    def _run(self) -> None:
        # Asleep while nothing is pending (a quiet job costs no wake-ups); woken by the first
        # record, it writes every flush_interval (sooner when flush_records wait) for as long
        # as records keep coming, and goes back to sleep after an interval that brought none.
        # A record waits at most flush_interval either way, and one wake-up per interval
        # serves a job that prints all the time (woken by the first record of each interval
        # instead, it would cost two, each taking the GIL from the rendering thread).
        # A flush that flush_records triggered early writes without fdatasync unless the last
        # sync is flush_interval old: a flood syncs twice a second, not once per batch, and
        # what a node crash can lose stays bounded by flush_interval (a crash of the process
        # loses nothing written).
        # A thread that restart_flusher replaced returns at its next wake-up, before it
        # touches anything (its own Event: clearing it cannot swallow the new thread's wake).
        me = threading.current_thread()
        wake = self._wake
        synced = time.monotonic()
        unsynced = False
        sleep = True
        while not self._closed:
            if sleep:
                with self._lock:
                    if self._thread is not me:
                        return
                    self._asleep = sleep = not self._pending
                if sleep:
                    if unsynced:  # going quiet: make what the last flushes wrote durable
                        with self._io_lock:
                            self._sync()
                        unsynced = False
                    wake.wait()
                    wake.clear()
                    if self._closed or self._thread is not me:
                        break
            wake.wait(self.flush_interval)
            wake.clear()
            if self._thread is not me:
                return
            now = time.monotonic()
            sync = now - synced >= self.flush_interval
            wrote = self._drain(sync=sync, flusher=me)
            if sync:
                if unsynced and not wrote:  # an early flush's data, and nothing since
                    with self._io_lock:
                        self._sync()
                synced = now
                unsynced = False
            elif wrote:
                unsynced = True
            sleep = not wrote

    def _drain(self, sync: bool, flusher: threading.Thread | None = None) -> bool:
        """Write what is pending (and fdatasync it when ``sync``); False if nothing was, or
        if ``flusher`` is a flusher thread that restart_flusher has replaced."""
        with self._io_lock:
            if flusher is not None and self._thread is not flusher:
                return False
            with self._lock:
                batch, self._pending = self._pending, []
                self._npending = 0
            if not batch:
                return False
            data = batch[0] if len(batch) == 1 else b"".join(batch)
            done = self._write_batch(data)
            if done < len(data):  # the spool failed: what is left waits for the next flush
                rest = data[done:]
                with self._lock:
                    self._pending.insert(0, rest)
                    self._npending += rest.count(b"\n")
            if sync and done:
                self._sync()
            return True

    def _sync(self) -> None:
        """fdatasync the open segment (with ``_io_lock`` held)."""
        if self._fsync and self._fd >= 0:
            try:
                os.fdatasync(self._fd)
            except OSError as e:
                self._fault(f"cannot sync spool segment: {e.strerror}")

    def _write_batch(self, data: bytes) -> int:
        """Write ``data`` (whole lines) into segments; returns how many bytes were written, at
        a line end. A segment is filled up to its size limit with whole lines, at least one.
        When the disk refuses a write, the complete lines that reached it are kept (the torn
        rest is cut off, so no torn line is left behind a later write), and once per failure
        the open segment is closed and compressed to make room before giving up."""
        pos = 0
        freed = False
        while pos < len(data):
            if self._fd < 0 and not self._open_next():
                return pos
            room = self.segment_bytes - self._size
            if len(data) - pos <= room:
                end = len(data)  # all of it fits
            else:
                # The lines whose running total stays within the segment, at least one.
                end = data.rfind(b"\n", pos, pos + room) + 1
                if end <= pos:
                    end = data.index(b"\n", pos) + 1
            end = self._within_keep_free(data, pos, end)
            chunk = data[pos:end] if pos or end < len(data) else data
            n = 0
            try:
                if not chunk:
                    raise OSError(errno.ENOSPC, self._reason)
                n = os.write(self._fd, chunk)
                while n < len(chunk):
                    n += os.write(self._fd, chunk[n:])
            except OSError as e:
                keep = chunk.rfind(b"\n", 0, n) + 1  # the complete lines that got there
                try:
                    os.ftruncate(self._fd, self._size + keep)
                except OSError:
                    pass
                self._wrote(chunk[:keep])
                pos += keep
                if not freed and self._size and e.errno in (errno.ENOSPC, errno.EDQUOT):
                    freed = True  # gzip gives back ~90 % of an NDJSON segment
                    self._rotate()
                    continue
                if not chunk:
                    self._fault(f"spool_keep_free reached in {self.run_dir} ({self._reason})")
                else:
                    self._reason = e.strerror or str(e)
                    self._fault(f"cannot write spool segment in {self.run_dir}: {self._reason}")
                return pos
            self._wrote(chunk)
            pos = end
            if self._size >= self.segment_bytes:
                self._rotate()
        return pos

    def _within_keep_free(self, data: bytes, pos: int, end: int) -> int:
        """``end``, or the end of the last line that leaves ``keep_free`` bytes free on the
        spool's filesystem (``pos`` when not even one fits; ``_reason`` then says why)."""
        if not self.keep_free:
            return end
        try:
            st = os.fstatvfs(self._fd)
        except OSError:
            return end
        room = st.f_bavail * st.f_frsize - self.keep_free
        if end - pos <= room:
            return end
        free = max(0, room + self.keep_free)
        self._reason = f"{_size(free)} free, {_size(self.keep_free)} kept free"
        return data.rfind(b"\n", pos, pos + max(0, room)) + 1 if room > 0 else pos

    def _wrote(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._size += len(chunk)
        self.written += chunk.count(b"\n")
        if self._failing:
            self._failing = False
            self._warn(f"spool writable again in {self.run_dir}; nothing was lost"
                       if not self.lost else
                       f"spool writable again in {self.run_dir}; {self.lost} records lost")

    def _fault(self, message: str) -> None:
        self.errors += 1
        if not self._failing:
            self._failing = True
            self._warn(message + "; buffering in memory and retrying")

    def _open_next(self) -> bool:
        index = self._index + 1
        path = self.run_dir / segment_name(index, closed=False)
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                               | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            self._reason = e.strerror or str(e)
            if index == 0:
                return False  # the caller raises: a writer without a segment is no writer
            self._fault(f"cannot create spool segment {path}: {e.strerror}")
            return False
        self._index = index
        self._size = 0
        return True

    def _rotate(self) -> None:
        if self._fsync:
            try:
                os.fdatasync(self._fd)
            except OSError:
                pass
        os.close(self._fd)
        self._fd = -1
        self._compress(self._index)
        self._open_next()

    def _compress(self, index: int) -> None:
        """gzip ``seg-N.ndjson`` to ``seg-N.ndjson.gz`` (tmp, fsync, rename, unlink). On a
        full disk, where the copy finds no room, in place (``_compress_in_place``). On
        failure the plain segment stays: readers handle both."""
        plain = self.run_dir / segment_name(index, closed=False)
        gz = self.run_dir / segment_name(index, closed=True)
        tmp = gz.with_name(gz.name + ".tmp")
        packed = b""
        try:
            with open(plain, "rb") as src:
                data = src.read()
            packed = gzip_compress(data)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(packed)
                out.flush()
                if self._fsync:
                    os.fsync(out.fileno())
            os.rename(tmp, gz)
            os.unlink(plain)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if packed and e.errno in (errno.ENOSPC, errno.EDQUOT) and \
                    self._compress_in_place(plain, gz, packed):
                return
            self._warn(f"cannot compress spool segment {plain}: {e.strerror}; kept uncompressed")

    def _compress_in_place(self, plain: Path, gz: Path, packed: bytes) -> bool:
        """A full disk has no room for a compressed copy, but the segment's own blocks hold
        it (NDJSON compresses ~10x): overwrite the segment with its gzip form under a name no
        reader lists, cut it to that size, and rename it ``.gz``. A crash in between loses
        this segment, which the disk would have cost anyway."""
        work = gz.with_name(gz.name + ".inplace")
        try:
            os.rename(plain, work)
        except OSError:
            return False
        try:
            fd = os.open(work, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                os.pwrite(fd, packed, 0)
                os.ftruncate(fd, len(packed))
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(work, gz)
        except OSError:
            try:
                os.rename(work, plain)  # as it was, if the overwrite never began
            except OSError:
                pass
            return False
        return True
