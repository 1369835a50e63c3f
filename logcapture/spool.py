"""The spool: an append-only write-ahead log of NDJSON segments on local disk.

The spool is the source of truth; the store is fed from it. Layout::

    <root>/<run id>/seg-000000.ndjson.gz   closed segments (gzip), never written again
    <root>/<run id>/seg-000001.ndjson      the open segment, append-only

Writing (``SpoolWriter``): records are encoded by the caller's thread into an in-memory
buffer; a flusher thread writes the buffer on a time trigger (``flush_interval``), a size
trigger (``flush_records``), on demand (``flush()``) and at ``close()``, and fdatasyncs at most
every ``flush_interval`` (and when the job goes quiet), so the job never waits on disk sync
(fsync per line would throttle the job: the pty fills while the disk syncs) and a flood does
not sync per batch. A segment that reaches ``segment_bytes`` is closed and gzip-compressed.

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

Reading (``read_segment``, ``iter_run``): a torn last line (no newline after a crash) is skipped
and counted; a line that is not a valid record is skipped, counted and reported by line number.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import json
import os
import re
import threading
import time
import zlib
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .errors import RecordError, SpoolError
from .records import LOST, End, Note, Record, Start, from_dict
from .userfiles import UserDir

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)

SEGMENT_BYTES = 8 * 1024 * 1024
FLUSH_INTERVAL = 1.0
FLUSH_RECORDS = 1000
MAX_PENDING = 200_000
# Room kept on disk for a run's last records (its end record, the note of a loss): a file
# of this size made when the run starts and removed at close, before the last write, as
# journald keeps SystemKeepFree= (journald.conf(5)). An end record with every count is ~2 KiB.
RESERVE_BYTES = 64 * 1024
RESERVE_NAME = ".reserve"
# How a record about the run as a whole begins (to_json: run, stream, seq, ...; a run id has
# no quote, and a quote inside a string value is escaped, so no text can imitate it).
_RUN_STREAM = b'","stream":"run","'
_RUN_STREAM_WITHIN = 160

_SEGMENT_RE = re.compile(r"^seg-(\d{6,})\.ndjson(\.gz)?$")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")

# gzip level of closed segments. The spool is transient (shipped, then deleted per the
# retention setting): level 1 compresses a training log's NDJSON 2.8x faster than level 6
# for 16 % more bytes (11x instead of 13x smaller), CPU the capture worker spends beside the
# job (docs/performance.md).
COMPRESS_LEVEL = 1


def gzip_compress(data: bytes) -> bytes:
    """``data`` as one gzip member at ``COMPRESS_LEVEL``. With ISA-L (the ``isal`` package,
    a dependency where it has wheels) ~7x faster than zlib at the same level and size on the
    spool's NDJSON (~3 GB/s against ~0.4; bench/bench_spool_gzip.py): a 1M-line flood's
    segments cost the capture worker ~0.07 s instead of ~0.5. zlib where isal is missing."""
    try:
        from isal import isal_zlib  # the bare binding: isal.igzip imports ~8 ms of modules
    except ImportError:  # pragma: no cover - a platform without isal's wheels
        return gzip.compress(data, compresslevel=COMPRESS_LEVEL, mtime=0)
    return isal_zlib.compress(data, COMPRESS_LEVEL, wbits=31)  # 16 + 15: a gzip member


def run_lines(data: bytes) -> list[bytes]:
    """The NDJSON lines of ``data`` (each ending in a newline) that are records about the run
    as a whole (start, notes, end): what is kept when the output cannot be."""
    return [ln for ln in data.splitlines(True) if _RUN_STREAM in ln[:_RUN_STREAM_WITHIN]]


def _size(n: int) -> str:
    return f"{n / 1048576:.1f} MiB" if n >= 1048576 else f"{n} bytes"


# The spool root of a cluster's nodes when the admin config names none (docs/admin.md).
SYSTEM_ROOT = "/var/spool/logcapture"


def default_root(env: dict[str, str] | os._Environ[str] = os.environ, *, process: str = "user",
                 configured: str | None = None, euid: int | None = None) -> Path:
    """The spool root a process uses when its command line names none: the one rule that the
    job wrapper, the prolog and epilog, the node sampler, the agent and the commands share.

    The system spool root, where a node's Slurm jobs write: ``configured`` (the admin
    config's ``spool_root``, or the wrapper's ``--spool-root``), else
    ``$LOGCAPTURE_SPOOL_ROOT``, else ``SYSTEM_ROOT``. The per-user spool: ``$LOGCAPTURE_SPOOL``,
    else ``$XDG_STATE_HOME/logcapture/spool``, else ``~/.local/state/logcapture/spool``.

    ``process``: ``"slurm"`` (the job wrapper, the hooks and the node sampler) uses the system
    spool root; ``"agent"`` run by root (``euid``, default the process's) ships it too unless
    the admin config names none and ``$LOGCAPTURE_SPOOL`` names a spool, and run by anyone
    else ships the per-user spool; ``"user"`` (every other command) uses the per-user spool."""
    if process == "agent":
        root = os.geteuid() == 0 if euid is None else euid == 0
        process = "slurm" if root and (configured or not env.get("LOGCAPTURE_SPOOL")) else "user"
    if process == "slurm":
        return Path(configured or env.get("LOGCAPTURE_SPOOL_ROOT") or SYSTEM_ROOT)
    if env.get("LOGCAPTURE_SPOOL"):
        return Path(env["LOGCAPTURE_SPOOL"])
    state = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(state) / "logcapture" / "spool"


def check_run_id(run_id: str) -> str:
    if not _RUN_ID_RE.match(run_id):
        raise SpoolError(
            f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 128, "
            "not starting with '.' or '-')")
    return run_id


def create_run_dir(root: Path, run_id: str) -> Path:
    """Create ``root/run_id`` (mode 0700; ``root`` too when missing). A run id already in use
    is refused, so two runs never interleave their sequence numbers."""
    check_run_id(run_id)
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise SpoolError(f"cannot create spool directory {root}: {e.strerror}") from None
    path = root / run_id
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise SpoolError(f"run {run_id!r} already exists in {root}") from None
    except OSError as e:
        raise SpoolError(f"cannot create run directory {path}: {e.strerror}") from None
    return path


def segment_index(name: str) -> int | None:
    """The index of a segment file's name (``seg-000003.ndjson.gz``: 3); None for another."""
    m = _SEGMENT_RE.match(name)
    return int(m.group(1)) if m else None


def segment_name(index: int, closed: bool) -> str:
    return f"seg-{index:06d}.ndjson" + (".gz" if closed else "")


class Segment(namedtuple("Segment", ("index", "path", "closed"))):
    """One segment file of a run: ``seg-<index>.ndjson``, or ``.ndjson.gz`` when closed."""

    __slots__ = ()
    if TYPE_CHECKING:
        index: int
        path: Path
        closed: bool


def segments(run_dir: Path) -> list[Segment]:
    """The run's segments in order. When a crash left both ``seg-N.ndjson`` and its ``.gz``
    (between rename and unlink), the complete ``.gz`` wins."""
    found: dict[int, Segment] = {}
    try:
        names = os.listdir(run_dir)
    except OSError as e:
        raise SpoolError(f"cannot list {run_dir}: {e.strerror}") from None
    for name in names:
        m = _SEGMENT_RE.match(name)
        if not m:
            continue
        idx, closed = int(m.group(1)), bool(m.group(2))
        if idx in found and found[idx].closed:
            continue
        found[idx] = Segment(idx, run_dir / name, closed)
    return [found[i] for i in sorted(found)]


def list_runs(root: Path) -> list[Path]:
    """The directories under ``root`` named like a run, in no order (``find_run_dirs`` sorts
    the runs it finds once)."""
    try:
        entries = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)
                   and _RUN_ID_RE.match(e.name)]
    except FileNotFoundError:
        return []
    except OSError as e:
        raise SpoolError(f"cannot list spool {root}: {e.strerror}") from None
    return [Path(e.path) for e in entries]


def began(path: Path) -> float:
    """When a run began, as far as a stat tells: the mtime of its first segment, or of the
    directory when it has none (a job's directory in the Slurm layout, or a run whose
    segments were shipped and deleted). Not the run directory's own mtime: every cursor save
    of the shipper changes that, which made an old run the "latest" one."""
    try:
        first = min((n for n in os.listdir(path) if _SEGMENT_RE.match(n)), default=None)
    except OSError:
        return mtime(path)
    return mtime(path / first) if first else mtime(path)


# The shipper's cursor (logcapture/ship/cursor.py) lives in the run directory; a run whose segments
# were all shipped and deleted is still a run while its cursor is there.
CURSOR_NAME = ".logcapture-cursor.json"


def _is_run_dir(path: Path) -> bool:
    try:
        return any(n.startswith("seg-") or n == CURSOR_NAME for n in os.listdir(path))
    except OSError:
        return False


def find_run_dirs(root: Path) -> list[Path]:
    """Run directories under ``root``, oldest first (``began``; a directory removed meanwhile,
    as the epilog removes a shipped job's, sorts first rather than failing): ``root/RUN`` (a
    user's spool) and ``root/JOB/RUN`` (the Slurm layout under the admin's spool root, one
    directory per job)."""
    out: list[Path] = []
    for entry in list_runs(root):
        if _is_run_dir(entry):
            out.append(entry)
            continue
        try:
            out.extend(sub for sub in list_runs(entry) if _is_run_dir(sub))
        except SpoolError:
            continue
    out.sort(key=lambda p: (began(p), p.name))
    return out


def mtime(path: Path) -> float:
    """A path's modification time without following symlinks; 0 when it cannot be read."""
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


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
    the ``"kind":"..."}`` that ends such a record's line (``to_json`` writes ``kind`` last; a
    quote inside a string is escaped, so the text of a line cannot end one) without splitting
    the segment into lines: the graphs' metadata and samples of a 2M-line run take the
    segments' decompression and little more."""
    data, _ = segment_data(seg)
    return records_of_kinds(data, kinds)


def records_of_kinds(data: bytes, kinds: Iterable[str]) -> dict[str, list[bytes]]:
    """``lines_of_kinds`` of a segment's data already read."""
    found: dict[str, list[bytes]] = {}
    for kind in kinds:
        tail = b'"kind":"' + kind.encode() + b'"}\n'
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
        if not _lock_run(fd):
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


# --- runs whose writer went away ---------------------------------------------------------
# A SpoolWriter holds an exclusive flock(2) on its run directory for as long as it writes
# (a lock dies with its process, whatever killed it: SIGKILL, the OOM killer, a reboot), so
# a run without an end record whose lock is free lost its writer. Runs of a Slurm job wait
# ABANDONED_SLURM_GRACE after their last write: the epilog, which knows how the job ended,
# closes them first when it runs (it has 120 s; a node that failed runs none).
ABANDONED_SLURM_GRACE = 600.0


def _lock_run(fd: int) -> bool:
    """Take the run directory's writer lock without waiting; False when a writer holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return False  # a filesystem without flock: nothing can be told, so nothing is done
    return True


def _pid_runs_since(pid: int, since: float) -> bool:
    """Whether process ``pid`` runs and began before ``since`` (epoch seconds): the writer
    itself, not a later process given its number, nor a zombie (proc(5): /proc/PID/stat's
    state and starttime, in clock ticks after boot; /proc/stat's btime, the boot in epoch
    seconds)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # EPERM: it exists, someone else's
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        if fields[0] in (b"Z", b"X"):
            return False  # exited, not yet waited for by its parent
        with open("/proc/stat", "rb") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith(b"btime "))
        began = btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return True  # cannot tell: alive, so nothing is closed under a live writer
    return began <= since + 1.0  # btime is whole seconds


def writer_gone(run_dir: Path) -> bool:
    """Whether the run's writer lock is free (no writer holds it: ended, or gone). A
    cheap first look before ``close_abandoned`` or a question to Slurm."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _lock_run(fd)
    finally:
        os.close(fd)


def close_abandoned(run_dir: Path, host: str | None = None,
                    now: Callable[[], float] = time.time,
                    state: str | None = None) -> Record | None:
    """End a run whose writer is gone: no end record, its writer lock free, begun on this
    host (``host``, default this machine's name) by a wrapper whose pid is gone, and, for a
    Slurm job, nothing written for ``ABANDONED_SLURM_GRACE`` unless Slurm said how the job
    ended (``state``: ``NODE_FAIL``, say). Its end record (``state``, else ``LOST``, at its
    last record, after a note saying why) goes into a new closed segment,
    owned as the run's other files (``UserDir``). Returns that end record, or None when the
    run was left as it is. Whoever reads the run first does this: ``logs``, ``ls``, the
    agent."""
    host = host or os.uname().nodename
    try:
        d = UserDir(run_dir)
    except (OSError, SpoolError):
        return None
    with d:
        if not _lock_run(d.fd):
            return None
        segs = segments(run_dir)
        try:
            first = next(read_segment(segs[0], final=False), None) if segs else None
        except SpoolError:
            return None
        if not isinstance(first, Start) or first.host != host:
            return None  # another node's run: its own agent and epilog see to it
        if _pid_runs_since(first.pid, first.ts):
            return None  # a writer of a version without the lock, still running
        last, run_seq = first.ts, first.seq
        lines = {"stdout": 0, "stderr": 0}
        for rec in iter_run(run_dir):
            if rec.kind == "end":
                return None
            last = max(last, rec.ts)
            if rec.stream == "run":
                run_seq = max(run_seq, rec.seq)
            elif rec.kind == "line" and rec.stream in lines:
                lines[rec.stream] += 1
        if first.slurm and state is None and \
                now() - max(mtime(s.path) for s in segs) < ABANDONED_SLURM_GRACE:
            return None
        state = state or LOST
        note = Note(run=first.run, stream="run", seq=run_seq + 1, ts=last, text=(
            f"the run's writer (pid {first.pid} on {host}) is gone and left no end record "
            "(killed, or the node crashed or rebooted); the run is closed as "
            f"{state} at its last output"))
        end = End(run=first.run, stream="run", seq=run_seq + 2, ts=last, exit_status=None,
                  signal=None, state=state, duration=max(0.0, last - first.ts),
                  counts={stream: {"lines": n} for stream, n in lines.items()})
        data = gzip_compress((note.to_json() + "\n" + end.to_json() + "\n").encode())
        name = segment_name(segs[-1].index + 1, closed=True)
        tmp = name + ".tmp"
        fd = d.create(tmp)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        d.replace(tmp, name)
        d.unlink(RESERVE_NAME)
        return end
