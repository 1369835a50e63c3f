"""What ``run`` is given and what it returns: ``Options`` (how to run a command) and
``Outcome`` (how it ended, with the resource use of the command and of the reader).
"""

from __future__ import annotations

import resource  # up front: a job that used every descriptor leaves none to load it
from collections import namedtuple
from collections.abc import Callable, Mapping
from types import MappingProxyType

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)

NO_BYTES: Mapping[str, int] = MappingProxyType({})

WORKER_BUFFER = 16 << 20  # bytes the reader holds for a worker before it stops reading
WORKER_TIMEOUT = 20.0  # seconds a worker may accept nothing before it is given up


if TYPE_CHECKING:
    from typing import Any, Protocol

    class Sink(Protocol):
        def feed(self, stream: str, data: bytes, now: float) -> None: ...
        def tick(self, now: float) -> None: ...

    class Beside(Protocol):
        """Writers beside the command that the reader serves in its rounds (Options.beside).
        ``start`` is given the reader, a ``readloop.ReadLoop`` (its ``poller``, ``drain_ptys``
        and ``pass_through``; not named here, as the read loop is built on this module)."""
        def open(self, slaves: Mapping[int, str]) -> None: ...
        def start(self, loop: Any) -> None: ...
        def round(self, events: list[tuple[int, int]], now: float, now_m: float) -> bool: ...
        def stop(self) -> None: ...


# Named tuples, as the records are (records.py says why).


class Options(namedtuple("Options", (
        "env", "stdin_fd", "stdout_fd", "stderr_fd", "winsize", "drain_idle", "drain_timeout",
        "warn", "on_start", "worker_buffer", "worker_timeout", "merge", "closed", "beside"),
        defaults=(None, 0, 1, 2, None, 0.5, 5.0, None, None, WORKER_BUFFER, WORKER_TIMEOUT,
                  False, frozenset(), None))):
    """How ``run`` runs a command. ``winsize``: (rows, columns), None for the caller's;
    ``on_start``: called with the child's pid; ``merge``: one pty for stdout and stderr,
    copied to ``stdout_fd`` and fed as stream ``stdout`` (``same_destination`` says when);
    ``closed``: which of 0, 1, 2 the caller had closed (``reserve_std_fds``), closed again in
    the command; ``beside``: another writer to the command's outputs that the reader serves
    too (a ``Beside``: ``slurm.forward.Forwarder``, srun's output in a batch job)."""

    __slots__ = ()
    if TYPE_CHECKING:
        env: dict[str, str] | None
        stdin_fd: int
        stdout_fd: int
        stderr_fd: int
        winsize: tuple[int, int] | None
        drain_idle: float
        drain_timeout: float
        warn: Callable[[str], None] | None
        on_start: Callable[[int], None] | None
        worker_buffer: int
        worker_timeout: float
        merge: bool
        closed: frozenset[int]
        beside: Beside | None


class Outcome(namedtuple("Outcome", (
        "exit_status", "signal", "pid", "started", "ended", "bytes", "spawn_error", "reads",
        "lingers", "usage"), defaults=(NO_BYTES, "", 0, 0, NO_BYTES))):
    """How the command ended. ``exit_status``: 0-255 when it exited; ``signal``: N when it was
    killed by signal N; ``bytes``: read per stream; ``spawn_error``: why the command could not
    be started (exit_status 126 or 127); ``reads``: pty reads that returned data and
    ``lingers``: LINGER waits between reads (bench/ and the end record); ``usage``: the
    command's own resource use, ``children_usage``."""

    __slots__ = ()
    if TYPE_CHECKING:
        exit_status: int | None
        signal: int | None
        pid: int
        started: float
        ended: float
        bytes: Mapping[str, int]
        spawn_error: str
        reads: int
        lingers: int
        usage: Mapping[str, int]

    @property
    def duration(self) -> float:
        return self.ended - self.started

    @property
    def state(self) -> str:
        if self.signal is not None:
            return "SIGNALED"
        return "COMPLETED" if self.exit_status == 0 else "FAILED"


def children_usage(floor_kib: int) -> dict[str, int]:
    """The command's resource use once it has been waited for (``getrusage`` of this
    process's children: the command and every descendant that was waited for): CPU time (ms)
    and, when it says something of the command, the peak resident memory of its largest
    process (KiB). The command was spawned from this process's memory (vfork shares it until
    exec), so its ``ru_maxrss`` is at least this process's resident size then, ``floor_kib``:
    a peak not above that is not the command's and is left out."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {"cpu_ms": int(1000 * (usage.ru_utime + usage.ru_stime))}
    if int(usage.ru_maxrss) > floor_kib:
        out["max_rss_kib"] = int(usage.ru_maxrss)
    return out


def resident_kib() -> int:
    """This process's resident size now (``VmRSS``), or its peak where /proc has none."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def own_usage() -> dict[str, int]:
    """This process's CPU time (ms) and peak resident memory (KiB) for the end record. The
    peak is the kernel's high-water mark of this process image (``VmHWM``): getrusage's
    ``ru_maxrss`` survives exec on Linux, so a wrapper started by a large process (a 400 MB
    Python that execs ``logcapture run``: 420 MB) would report that process's peak."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak = int(usage.ru_maxrss)
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    peak = int(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        pass  # not Linux: ru_maxrss
    return {"cpu_ms": int(1000 * (usage.ru_utime + usage.ru_stime)), "max_rss_kib": peak}


# Signals the worker ignores: the wrapper forwards them to the command, and a terminal's
