"""Closing runs whose writer went away (``close_abandoned``): the end record of a run whose
writer was killed, or whose node crashed or rebooted, written by whoever reads the run first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import SpoolError
from ..records import LOST, End, Note, Record, Start
from ..userfiles import UserDir
from .layout import RESERVE_NAME, gzip_compress, lock_run, mtime, segment_name, segments
from .reading import iter_run, read_segment

# A SpoolWriter holds an exclusive flock(2) on its run directory for as long as it writes
# (a lock dies with its process, whatever killed it: SIGKILL, the OOM killer, a reboot), so
# a run without an end record whose lock is free lost its writer. Runs of a Slurm job wait
# ABANDONED_SLURM_GRACE after their last write: the epilog, which knows how the job ended,
# closes them first when it runs (it has 120 s; a node that failed runs none).
ABANDONED_SLURM_GRACE = 600.0


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
        return lock_run(fd)
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
        if not lock_run(d.fd):
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
