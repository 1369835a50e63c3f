"""The spool's layout on disk: which root a process uses (``default_root``), a run's directory
(``create_run_dir``, ``find_run_dirs``), its segments' names and order (``segments``), the gzip
form of a closed segment (``gzip_compress``), and the writer's lock on its run directory
(``lock_run``). Layout::

    <root>/<run id>/seg-000000.ndjson.gz   closed segments (gzip), never written again
    <root>/<run id>/seg-000001.ndjson      the open segment, append-only
    <root>/<job id>/<run id>/...           the Slurm layout under the admin's spool root
"""

from __future__ import annotations

import fcntl
import os
import re
from collections import namedtuple
from pathlib import Path

from ..errors import SpoolError

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)

_SEGMENT_RE = re.compile(r"^seg-(\d{6,})\.ndjson(\.gz)?$")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


RESERVE_NAME = ".reserve"


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
        import gzip  # only here: ~0.7 ms that every capture paid at its start

        return gzip.compress(data, compresslevel=COMPRESS_LEVEL, mtime=0)
    return isal_zlib.compress(data, COMPRESS_LEVEL, wbits=31)  # 16 + 15: a gzip member


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


def lock_run(fd: int) -> bool:
    """Take the run directory's writer lock without waiting; False when a writer holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return False  # a filesystem without flock: nothing can be told, so nothing is done
    return True
