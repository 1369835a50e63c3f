"""Run a command under pseudo-terminals and pump its bytes; know nothing of content.

Entry point: ``run(argv, sink, options) -> Outcome``.

- stdout and stderr each get their own pty, so both are ttys (``isatty()`` true, colours and
  progress bars as in a shell) and stay separate streams. stdin is passed through untouched
  (the command inherits the caller's stdin, so pipes and interactive terminals both work).
- With ``Options.merge`` (the caller's stdout and stderr go to the same place:
  ``same_destination``) both are one pty, as in a terminal or under ``script``: the order in
  which the command wrote to the two reaches that place as it wrote it, which two ptys read
  by one reader cannot keep (a write to stderr right after one to stdout may be read first).
  That one stream is ``stdout``: it is copied to the caller's stdout and fed as ``stdout``.
- Output post-processing is switched off on both ptys (no ``\\n`` -> ``\\r\\n``), so what is
  copied to the real stdout/stderr is byte-identical to what the command wrote (SPEC.md §3).
- The window size is the caller's terminal's, else ``LOGCAPTURE_COLUMNS`` x ``LOGCAPTURE_LINES``,
  else 80 x 24 (a pty left at 0 x 0 makes tqdm print nothing: PTY-RENDER.md). SIGWINCH on the
  wrapper re-reads the caller's size, applies it to both ptys and is forwarded to the command.
- The command runs in its own session and process group, without a controlling terminal, as
  a batch job has none: a background process it leaves behind is not sent SIGHUP when it
  exits, and reading an interactive stdin never stops it with SIGTTIN. TERM,
  INT, HUP, QUIT, USR1, USR2, CONT, TSTP, ALRM and WINCH received by the wrapper are forwarded
  to the command's process group: Slurm's proctrack/cgroup signals only the step's first
  process, the wrapper (SLURM-DEV.md). A repeated TERM is forwarded again; the wrapper itself
  exits only after the command, with its status.
- Every chunk read is first copied to the real output, then handed to ``sink.feed``. A sink
  that raises is disabled with one ``logcapture:`` warning; the command and its output go on.
- The sink may be a ``Worker``: a capture process forked by ``fork_worker`` before the command
  is spawned and before any thread starts, so that rendering runs on another core and never
  holds the GIL of this reader. Chunks then go to it as frames ``(stream, wall time,
  monotonic time, data)`` over a pipe written without blocking; what the pipe cannot take at
  once waits in a buffer of at most ``Options.worker_buffer`` bytes. When that buffer is
  full the reader stops reading the ptys until the worker catches up: the job is then slowed
  by the terminal's own flow control, and nothing is lost. The reader never sleeps and never
  waits on the worker while the command runs, except in that case. A worker that exits or
  accepts nothing for ``worker_timeout`` seconds is given up with one ``logcapture:`` warning;
  the command and its output go on. At the end the reader sends the ``Outcome`` (an ``end``
  frame) and waits up to ``worker_timeout`` seconds for the worker to finish the spool.
- After the command exits the ptys are drained until every writer has closed them (EIO), or
  they have been quiet for ``drain_idle`` seconds, or ``drain_timeout`` seconds have passed: a
  background grandchild that holds the pty open cannot hang the wrapper.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import resource  # up front: a job that used every descriptor leaves none to load it
import select
import signal
import stat
import struct
import subprocess
import sys
import termios
import time
from collections import deque, namedtuple
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from types import MappingProxyType

from . import frame
from .records import STDERR, STDOUT

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
_NO_BYTES: Mapping[str, int] = MappingProxyType({})

FORWARDED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGCONT, signal.SIGTSTP, signal.SIGALRM,
)
READ_SIZE = 65536
FULL_READ = 4095  # what one read of a pty returns at most (PTY-RENDER.md: ~4 KB)
DEFAULT_COLUMNS = 80
DEFAULT_LINES = 24
TICK = 0.2  # seconds between sink.tick() calls while the command is quiet
TICK_MS = int(TICK * 1000)
QUIET_MS = 5000  # the reader's poll timeout while nothing is due (a worker takes the ticks)

# Frames to a capture worker: the format is frame.py's. A frame holds what one round of the
# reader read from one stream (its reads share the round's times); the last frame of a round
# has ROUND_END in its kind (pipeline.Pipeline orders the two streams' lines by read time).
WORKER_PIPE_BYTES = 1 << 20  # asked of F_SETPIPE_SZ; the kernel may grant less
WORKER_BUFFER = 16 << 20  # bytes the reader holds for a worker before it stops reading
WORKER_TIMEOUT = 20.0  # seconds a worker may accept nothing before it is given up
# Frames go to the worker in batches: when PUMP_BYTES wait, when the job has written nothing
# for PUMP_QUIET seconds, or when the oldest has waited PUMP_MAX. Each write wakes the
# worker, and a wake-up costs it ~0.4 ms of CPU here whatever it brings (cold caches): a job
# printing a burst ten times a second (a training loop with a 10 Hz bar) wakes it twice a
# second instead of ten times. The worker renders and commits by the frames' read times, so
# holding them back delays nothing it decides: a quiet line is committed IDLE_COMMIT (0.3 s)
# after it was read and PUMP_QUIET is shorter (docs/performance.md: the 1 s budget). Only
# capture waits: the copy to the real output never does.
PUMP_BYTES = 64 * 1024
PUMP_QUIET = 0.15
PUMP_MAX = 0.5
# A round that read output also sends frames that have waited PUMP_ROUND: a job printing in
# regular bursts (a training loop, ten a second) then never wakes the reader just to pump at
# PUMP_MAX (five system calls a pump here).
PUMP_ROUND = 0.35
# The worker renders consecutive frames of one stream read within COALESCE seconds of the
# first as one chunk (keeping each frame's read time for its lines): a flood read ~400 bytes at
# a time would otherwise cost it a renderer call per read (40 % of its CPU for 1M print()
# lines).
COALESCE = 0.005
# When output comes after the reader emptied the ptys (the start of a burst, most likely), it
# waits LINGER before reading, so a job printing line by line is read a burst at a time instead
# of one read per line (each round of poll, read, copy and frame costs the reader 50-150 us of
# CPU here), and the round's reads reach the real output in one write: a training job's burst
# costs poll, sleep, two reads and a write (session 4 read once before the wait: twice the
# system calls). Output reaches the real stdout at most LINGER later, below what a person
# notices; a flood, which never empties the pty, is not held back at all. The pty holds
# ~17 KB: a job writing faster than that per LINGER fills it during the wait, and the reads
# after it take LINGER_FULL or more; the job may then have blocked for up to LINGER, so
# lingering stops for LINGER_BACKOFF seconds and a flood is read without any wait (at most
# 0.2 % of its time blocked; PTY-RENDER.md: a sleep after every short read, without that
# back-off, slows a flood down 5-20 times). None after the command exits.
# While nothing is due (no frames held back, no drain) the reader's poll waits QUIET_MS: a
# quiet job costs it a wake-up every 5 s (every 0.2 s until session 4); SIGCHLD and the other
# signals wake it through wake_r, and the timeout finds the command's exit when SIGCHLD never
# comes (a wrapper started with it blocked).
LINGER = 0.01
LINGER_FULL = 12 * 1024
LINGER_BACKOFF = 5.0
PASSES = 4  # read passes over the ptys in one round, at most (two streams flooding at once)
_IOV_MAX = 512  # pieces per writev (Linux allows 1024)


if TYPE_CHECKING:
    from typing import Protocol

    class Sink(Protocol):
        def feed(self, stream: str, data: bytes, now: float) -> None: ...
        def tick(self, now: float) -> None: ...


# Named tuples, as the records are (records.py says why).


class Options(namedtuple("Options", (
        "env", "stdin_fd", "stdout_fd", "stderr_fd", "winsize", "drain_idle", "drain_timeout",
        "warn", "on_start", "worker_buffer", "worker_timeout", "merge"),
        defaults=(None, 0, 1, 2, None, 0.5, 5.0, None, None, WORKER_BUFFER, WORKER_TIMEOUT,
                  False))):
    """How ``run`` runs a command. ``winsize``: (rows, columns), None for the caller's;
    ``on_start``: called with the child's pid; ``merge``: one pty for stdout and stderr,
    copied to ``stdout_fd`` and fed as stream ``stdout`` (``same_destination`` says when)."""

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


class Outcome(namedtuple("Outcome", (
        "exit_status", "signal", "pid", "started", "ended", "bytes", "spawn_error", "reads",
        "lingers", "usage"), defaults=(_NO_BYTES, "", 0, 0, _NO_BYTES))):
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


class Worker:
    """A capture process, as the reader sees it: its pid, the write end of its pipe, and the
    frames the pipe has not taken yet. Made by ``fork_worker``; passed to ``run`` as the sink."""

    def __init__(self, pid: int, fd: int):
        self.pid = pid
        self.fd = fd
        # Unsent frames as the pieces they were read in (headers and pty reads, never
        # copied): a bytearray that is appended to at one end and written from the other
        # would be copied whole each time it grows past its allocation.
        self.pieces: deque[bytes | memoryview] = deque()
        self.size = 0  # bytes in pieces
        self.gone = False  # given up: exited, hung, or finished
        self.blocked = False  # the pipe was full at the last write
        self.since = 0.0  # monotonic time the oldest unsent frame was read
        self.last_progress = time.monotonic()
        # The frame still open: its kind, reads, bytes and times. Its header goes into
        # ``pieces`` when it is closed (at the next frame, the round's end or a pump).
        self._kind = -1
        self._parts: list[bytes] = []
        self._len = 0
        self._wall = self._mono = 0.0

    def send(self, kind: int, parts: list[bytes], wall: float, mono: float) -> None:
        """``parts`` (consecutive reads of one stream) read in one round at ``wall``/``mono``:
        one frame."""
        if not self.size:
            self.since = mono
        self._close_frame()
        self._kind = kind
        n = sum(map(len, parts))
        self._parts = parts
        self._len = n
        self._wall, self._mono = wall, mono
        self.size += frame.HEADER.size + n

    def end_round(self) -> None:
        """The round that sent the open frame has ended: mark it so."""
        self._close_frame(frame.ROUND_END)

    def _close_frame(self, flag: int = 0) -> None:
        if self._parts:
            self.pieces.append(frame.header(self._kind | flag, self._len, self._wall,
                                            self._mono))
            self.pieces.extend(self._parts)
            self._parts = []
            self._len = 0

    def due(self, now: float, read: bool = False) -> bool:
        """Are the unsent frames to go now? ``read``: this round read output."""
        return self.size > 0 and (self.blocked or self.size >= PUMP_BYTES
                                  or now >= self.pump_at()
                                  or (read and now >= self.since + PUMP_ROUND))

    def pump_at(self) -> float:
        """The monotonic time the unsent frames go to the worker, unless more bytes come."""
        return min(self.since + PUMP_MAX, self._mono + PUMP_QUIET)

    def pump(self) -> None:
        """Write what the pipe takes now, without blocking. Raises OSError (EPIPE) when the
        worker has exited."""
        self._close_frame()
        pieces = self.pieces
        try:
            n = os.writev(self.fd, list(islice(pieces, _IOV_MAX)))
        except BlockingIOError:
            if not self.blocked:
                self.blocked = True
                self.last_progress = time.monotonic()  # the no-progress clock starts now
            return
        self.size -= n
        while n:
            first = pieces[0]
            if len(first) <= n:
                n -= len(first)
                pieces.popleft()
            else:
                pieces[0] = memoryview(first)[n:]
                n = 0
        self.last_progress = time.monotonic()
        self.blocked = self.size > 0

    def drop(self) -> None:
        self.pieces.clear()
        self._parts = []
        self._len = 0
        self.size = 0

    def give_up(self) -> None:
        """Stop talking to the worker: drop what it did not take, close the pipe, kill it
        (it may be hung), reap it."""
        if self.gone:
            return
        self.gone = True
        self.drop()
        self._close()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.reap(None)

    def _close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def reap(self, timeout: float | None) -> int | None:
        """Wait for the worker to exit (``timeout`` None: as long as it takes); its wait status,
        or None if it is still running after ``timeout`` seconds or was reaped already."""
        if timeout is not None:
            try:
                pidfd = os.pidfd_open(self.pid)  # readable once the process has exited
            except (AttributeError, OSError):
                pass
            else:
                try:
                    select.select([pidfd], [], [], timeout)
                finally:
                    os.close(pidfd)
                timeout = 0.0
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                pid, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            except ChildProcessError:
                return None
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            if pid:
                return status
            if deadline is None or time.monotonic() >= deadline:
                return None
            time.sleep(pause)  # the command has ended: nothing waits on this reader now
            pause = min(pause * 2, 0.05)

    def finish(self, outcome: Outcome, timeout: float, warn: Callable[[str], None]) -> None:
        """Send the outcome, let the worker take everything, and wait for it to finish the
        spool. A worker that accepts nothing, or does not exit, for ``timeout`` seconds is
        killed with one warning."""
        if self.gone:
            return
        payload = frame.encode_end({
            "exit_status": outcome.exit_status, "signal": outcome.signal, "pid": outcome.pid,
            "started": outcome.started, "ended": outcome.ended, "bytes": dict(outcome.bytes),
            "spawn_error": outcome.spawn_error, "usage": dict(outcome.usage),
            "reader": {**own_usage(), "reads": outcome.reads,
                       "lingers": outcome.lingers}})
        self.send(frame.END, [payload], time.time(), time.monotonic())
        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        try:
            while self.size:
                if self.blocked:
                    if time.monotonic() - self.last_progress > timeout:
                        warn("the capture process stopped responding; what it had not written "
                             "to the spool is lost (the command's output files are complete)")
                        self.give_up()
                        return
                    poller.poll(200)
                self.pump()
        except OSError:
            self._died(warn)
            return
        self._close()  # end of file for the worker, whatever it makes of the end frame
        status = self.reap(timeout)
        if status is None:
            warn("the capture process did not finish the spool in time and was stopped "
                 "(the command's output files are complete)")
            self.give_up()
            return
        self.gone = True
        if status != 0:
            self._report(status, warn)

    def _died(self, warn: Callable[[str], None]) -> None:
        self.drop()
        self._close()
        status = self.reap(1.0)
        if status is None:
            self.give_up()
        self.gone = True
        self._report(status, warn)

    @staticmethod
    def _report(status: int | None, warn: Callable[[str], None]) -> None:
        how = ""
        if status is not None and os.WIFSIGNALED(status):
            how = f" (killed by signal {os.WTERMSIG(status)})"
        elif status is not None and os.WIFEXITED(status):
            how = f" (exit status {os.WEXITSTATUS(status)})"
        warn(f"capture stopped: the capture process ended unexpectedly{how}; the command "
             "goes on and its output still reaches its files")


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


def _resident_kib() -> int:
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
# job-control signals must not stop or kill the capture behind the wrapper's back.
_WORKER_IGNORES = (*FORWARDED_SIGNALS, signal.SIGWINCH, signal.SIGTTIN, signal.SIGTTOU)


def fork_worker(target: Callable[[int], int]) -> Worker:
    """Fork the capture process: ``target(read_fd)`` runs in the child, which exits with its
    return value (70 if it raised). Call it before any thread starts (a fork copies only the
    calling thread, and the locks other threads held) and before the command is spawned.
    The child gets its own process group and ignores the forwarded signals, so neither the
    wrapper's forwarding nor a terminal's ^C or ^Z reaches it; it reads frames until the end
    frame or end of file."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        # Fewer wake-ups and more slack; unprivileged users may get up to pipe-max-size.
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, WORKER_PIPE_BYTES)
    except (OSError, AttributeError):
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # or the child would write the parent's buffered text again
        except (OSError, ValueError, AttributeError):
            pass
    # Everything made so far is shared with the child copy-on-write: out of the collector's
    # sight in both, so that no collection writes to those objects and copies their pages.
    gc.freeze()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, measured by the tests through it
        code = 70
        try:
            os.close(w)
            try:
                os.setpgid(0, 0)
            except OSError:
                pass
            for sig in _WORKER_IGNORES:
                signal.signal(sig, signal.SIG_IGN)
            code = target(r)
        except BaseException:  # noqa: BLE001 - the child must never return into the caller
            code = 70
        finally:
            os._exit(code)
    os.close(r)
    os.set_blocking(w, False)
    return Worker(pid, w)


def same_destination(fd1: int = 1, fd2: int = 2) -> bool:
    """Do ``fd1`` and ``fd2`` write to the same place, so that the order of writes across them
    is part of what ends up there? True for one open file description (``2>&1``, Slurm's
    ``slurm-N.out`` without ``-e``), for the same pipe, FIFO, socket or terminal however it
    was opened (writes to it are kept in order), and for the same regular file when both
    append (``>>f 2>>f``: each write lands at the end). Not for /dev/null (nobody sees an
    order there: the streams keep their names), not for two descriptors that each write at
    their own offset of one file (``>f 2>f``: each overwrites the other at its own offset, so
    the bytes a stream writes land where they would without a terminal only if it keeps its
    own descriptor), and not when either is closed."""
    try:
        a, b = os.fstat(fd1), os.fstat(fd2)
    except OSError:
        return False
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        return False
    if stat.S_ISCHR(a.st_mode) and a.st_rdev == os.makedev(1, 3):  # /dev/null
        return False
    if not stat.S_ISREG(a.st_mode):
        return True  # one pipe, socket or terminal: one queue of writes
    try:
        fl1, fl2 = fcntl.fcntl(fd1, fcntl.F_GETFL), fcntl.fcntl(fd2, fcntl.F_GETFL)
        if fl1 & fl2 & os.O_APPEND:
            return True
        return _same_description(fd1, fd2)
    except OSError:
        return False


def _same_description(fd1: int, fd2: int) -> bool:
    """Are ``fd1`` and ``fd2`` one open file description (one offset)? kcmp(2) says exactly;
    where it is missing (a kernel without CONFIG_KCMP, another architecture), two descriptors
    at one offset are taken as one: a file opened twice at the same offset would have its
    streams overwrite each other, so no order of theirs survives there anyway."""
    number = _KCMP_SYSCALL.get(os.uname().machine)
    if number is not None:
        import ctypes  # only for a regular file shared by both streams

        libc = ctypes.CDLL(None, use_errno=True)
        pid = os.getpid()
        got = libc.syscall(number, pid, pid, 0, fd1, fd2)  # 0: KCMP_FILE
        if got >= 0:
            return got == 0
    return os.lseek(fd1, 0, os.SEEK_CUR) == os.lseek(fd2, 0, os.SEEK_CUR)


_KCMP_SYSCALL = {"x86_64": 312, "aarch64": 272, "ppc64le": 354}


def caller_winsize(fds: Sequence[int] = (0, 1, 2),
                   env: dict[str, str] | os._Environ[str] = os.environ) -> tuple[int, int]:
    """(rows, columns) of the first fd that is a terminal with a size, else the
    LOGCAPTURE_LINES/LOGCAPTURE_COLUMNS variables, else 24 x 80."""
    for fd in fds:
        try:
            rows, cols, _, _ = struct.unpack(
                "HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
        except OSError:
            continue
        if rows and cols:
            return rows, cols
    return (_positive(env.get("LOGCAPTURE_LINES"), DEFAULT_LINES),
            _positive(env.get("LOGCAPTURE_COLUMNS"), DEFAULT_COLUMNS))


def _positive(value: str | None, default: int) -> int:
    try:
        n = int(value) if value else default
    except ValueError:
        return default
    return n if 0 < n < 65536 else default


def set_winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class NoTerminal(OSError):
    """``run`` could not open the pseudo-terminals or its wake-up pipe, or could not spawn
    the command for want of a resource of its own (file descriptors, memory, processes): the
    wrapper's failure, not the command's. Nothing was started; the caller runs the command
    without capture."""


# Spawn errors that say the wrapper ran out of something, not that the command is wrong.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


def _open_pty(rows: int, cols: int, opened: list[int]) -> tuple[int, int]:
    master, slave = os.openpty()
    opened += (master, slave)
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # oflag: no output processing, bytes pass as written
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    set_winsize(slave, rows, cols)
    os.set_inheritable(slave, False)
    os.set_blocking(master, False)
    return master, slave


def _write_all(fd: int, data: bytes) -> None:
    try:
        n = os.write(fd, data)
    except BlockingIOError:
        n = 0
    if n == len(data):  # the usual case: one write, no view made
        return
    view = memoryview(data)[n:]
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]


def run(argv: Sequence[str], sink: Sink | Worker | None,
        options: Options | None = None) -> Outcome:
    opts = options or Options()
    warn = opts.warn or (lambda msg: None)
    worker = sink if isinstance(sink, Worker) else None
    plain: Sink | None = None if isinstance(sink, Worker) else sink  # fed in-process (tests)
    rows, cols = opts.winsize or caller_winsize()
    opened: list[int] = []
    try:  # nothing has started yet: a failure here is the caller's to handle (NoTerminal)
        out_m, out_s = _open_pty(rows, cols, opened)
        if opts.merge:  # one terminal for both, as the job's two descriptors share one place
            err_m, err_s = out_m, out_s
        else:
            err_m, err_s = _open_pty(rows, cols, opened)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        for fd in opened:
            os.close(fd)
        raise NoTerminal(e.errno, e.strerror) from e
    masters = {out_m: STDOUT} if opts.merge else {out_m: STDOUT, err_m: STDERR}
    real = {STDOUT: opts.stdout_fd, STDERR: opts.stderr_fd}
    counts = {STDOUT: 0, STDERR: 0}

    child: subprocess.Popen[bytes] | None = None
    previous: dict[int, object] = {}

    def forward(signum: int, stack: object) -> None:
        if signum == signal.SIGWINCH:
            try:
                r, c = caller_winsize()
                for fd in masters:
                    set_winsize(fd, r, c)
            except OSError:
                pass
            # The ptys are no controlling terminal, so the kernel tells nobody of the new
            # size: forward the signal like the others.
        if child is not None and child.returncode is None:
            try:
                os.killpg(child.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    # Handlers go in before the child exists, so a signal arriving during spawn is not lost
    # to the default action (which would kill the wrapper and hang up the job's pty).
    for sig in (*FORWARDED_SIGNALS, signal.SIGWINCH):
        previous[sig] = signal.signal(sig, forward)
    previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda s, f: None)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    started = time.time()
    floor_kib = _resident_kib()
    try:
        try:
            child = subprocess.Popen(
                list(argv), stdin=opts.stdin_fd, stdout=out_s, stderr=err_s,
                env=opts.env, start_new_session=True, restore_signals=True, close_fds=True)
        except OSError as e:
            for fd in {out_m, out_s, err_m, err_s}:
                os.close(fd)
            if e.errno in _RESOURCE_ERRNOS:
                raise NoTerminal(e.errno, e.strerror) from e
            code = 127 if isinstance(e, (FileNotFoundError, NotADirectoryError)) else 126
            what = "command not found" if code == 127 else (e.strerror or str(e))
            outcome = Outcome(code, None, 0, started, time.time(), counts,
                              spawn_error=f"{argv[0]}: {what}")
            if worker is not None:
                worker.finish(outcome, opts.worker_timeout, warn)
            return outcome
        for fd in {out_s, err_s}:
            os.close(fd)
        if opts.on_start:
            opts.on_start(child.pid)

        broken: set[str] = set()

        def copy(stream: str, data: bytes) -> None:
            if stream not in broken:
                try:
                    _write_all(real[stream], data)
                except OSError as e:
                    # The reader of our own stdout/stderr went away (EPIPE) or the output file
                    # failed: stop copying that stream but keep capturing and keep the job
                    # running.
                    broken.add(stream)
                    warn(f"cannot copy the command's {stream} to its output: {e.strerror}")

        def deliver(stream: str, data: bytes, now: float) -> None:
            nonlocal plain
            if plain is not None:
                try:
                    plain.feed(stream, data, now)
                except Exception as e:  # noqa: BLE001 - never break the job
                    # Type name only: the message may quote job text a mode has dropped.
                    warn(f"capture stopped after an internal error ({type(e).__name__});"
                         " the command goes on and its output still reaches its files")
                    plain = None

        def tick(now: float) -> None:
            nonlocal plain
            if plain is not None:
                try:
                    plain.tick(now)
                except Exception as e:  # noqa: BLE001
                    warn(f"capture stopped after an internal error ({type(e).__name__})")
                    plain = None

        # poll(2) with a registration kept across iterations: the loop runs once per read,
        # up to ~100k times a second, so it does as few system calls as it can.
        POLLIN = select.POLLIN | select.POLLHUP | select.POLLERR
        poller = select.poll()
        for fd in masters:
            poller.register(fd, POLLIN)
        poller.register(wake_r, select.POLLIN)
        open_fds = set(masters)
        reading = True  # the ptys are registered (False: the worker's buffer is full)
        pumping = False  # the worker's pipe is registered for POLLOUT
        worker_fd = worker.fd if worker is not None else -1
        check_child = True  # a SIGCHLD (or a quiet spell) since the last look
        exited_at: float | None = None
        last_data = time.monotonic()
        last_tick = last_data
        no_linger_until = 0.0
        drained = True  # the last round read every pty it was woken for empty
        lead = list(masters)  # the order of the next round's first pass
        reads = lingers = 0
        read = os.read
        while open_fds:
            now_m = time.monotonic()
            if check_child and exited_at is None:
                check_child = False
                if child.poll() is not None:
                    exited_at = now_m
                    last_data = now_m  # the drain's idle clock starts at the exit
            if exited_at is not None:
                if now_m - last_data >= opts.drain_idle or now_m - exited_at >= opts.drain_timeout:
                    break
            timeout = TICK_MS
            if worker is not None:
                if worker.gone:
                    gone_fd, worker = worker_fd, None
                    if pumping:
                        pumping = False
                        try:
                            poller.unregister(gone_fd)
                        except KeyError:
                            pass
                    if not reading:
                        reading = True
                        for fd in open_fds:
                            poller.register(fd, POLLIN)
                else:
                    full = worker.size >= opts.worker_buffer
                    if full == reading:  # stop reading the ptys while the buffer is full
                        reading = not full
                        for fd in open_fds:
                            if reading:
                                poller.register(fd, POLLIN)
                            else:
                                poller.unregister(fd)
                    if worker.blocked != pumping:  # POLLOUT only while the pipe is full
                        pumping = not pumping
                        if pumping:
                            poller.register(worker.fd, select.POLLOUT)
                        else:
                            poller.unregister(worker.fd)
                    elif worker.size and not pumping:
                        timeout = max(0, int((worker.pump_at() - now_m) * 1000) + 1)
                    if pumping and now_m - worker.last_progress > opts.worker_timeout:
                        warn("the capture process stopped responding; capture stopped, the "
                             "command goes on and its output still reaches its files")
                        poller.unregister(worker.fd)
                        pumping = False
                        worker.give_up()
                        continue
                    if not reading:
                        last_data = now_m  # not reading is not being quiet
            if (timeout == TICK_MS and worker is not None and exited_at is None and reading
                    and not pumping):
                # Nothing is due before the next output or signal (SIGCHLD wakes the poll
                # through wake_r): a quiet job costs the reader a wake-up every few seconds,
                # only to look for the command's exit in case SIGCHLD never comes (a wrapper
                # started with it blocked).
                timeout = QUIET_MS
            try:
                events = poller.poll(timeout)
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            now_m = time.monotonic()
            if not events:
                check_child = True
            lingered = False
            if (drained and exited_at is None and now_m >= no_linger_until
                    and any(fd in open_fds for fd, _ in events)):
                # Output after a quiet spell: the start of a burst, most likely. Wait LINGER
                # for the rest of it, then read it all in one round.
                lingered = True
                lingers += 1
                time.sleep(LINGER)
                now_m = time.monotonic()
            now = time.time()
            emptied = None  # whether this round's pty reads all ended short (None: no pty read)
            sent = False  # this round gave the worker output
            woken = False  # a pty has output
            for fd, _ in events:
                if fd == wake_r:
                    try:
                        while True:
                            got = read(wake_r, 512)
                            if not got:
                                break
                            if signal.SIGCHLD in got:
                                check_child = True
                    except BlockingIOError:
                        pass
                elif fd in open_fds:
                    woken = True
            if woken:
                # Every pty is read, in passes, until a pass finds output only on the pty it
                # read first (at most PASSES): a write the command made before another is then
                # read in the same round as that one or an earlier round, whichever streams
                # they went to (the pass that ends the round read each pty after the last
                # read that found output). The worker orders the two streams' lines by
                # their rounds (pipeline.Pipeline._release): a /LOGCOMMAND is never read in
                # a later round than the other stream's text written after it. Each pass
                # starts with the pty that last had output.
                order = [fd for fd in lead if fd in open_fds]
                bursts: dict[int, list[bytes]] = {}
                for _ in range(PASSES):
                    later = -1  # a pty after the pass's first that had output
                    for i, fd in enumerate(order):
                        stream = masters[fd]
                        burst = bursts.setdefault(fd, [])
                        had = len(burst)
                        empty = False  # a short read: the pty had no more
                        # A full read (the pty hands out at most 4095 bytes) means more is
                        # waiting: read again at once instead of asking poll(), up to 64 KiB
                        # in a row.
                        for _ in range(16):
                            try:
                                data = read(fd, READ_SIZE)
                            except BlockingIOError:
                                empty = True
                                break
                            except OSError as e:
                                if e.errno != errno.EIO:
                                    warn(f"reading the command's {stream} failed: {e.strerror}")
                                data = b""
                            if not data:  # EIO: every writer has closed the pty
                                open_fds.discard(fd)
                                if reading:
                                    poller.unregister(fd)
                                empty = True
                                break
                            reads += 1
                            burst.append(data)
                            if not lingered:  # a flood: each read out at once, as written
                                copy(stream, data)
                            if worker is not None and \
                                    worker.size + len(burst) * READ_SIZE >= opts.worker_buffer:
                                break  # flow control: the loop above stops reading
                            if len(data) < FULL_READ:
                                empty = True
                                break
                        emptied = empty and emptied is not False
                        if i and len(burst) > had:
                            later = fd
                    if later < 0 or len(order) < 2:
                        break
                    order.remove(later)
                    order.insert(0, later)
                    order = [fd for fd in order if fd in open_fds]
                lead = order or lead
                for fd, burst in bursts.items():
                    if not burst:
                        continue
                    stream = masters[fd]
                    taken = sum(map(len, burst))
                    counts[stream] += taken
                    if lingered or worker is None:
                        data = burst[0] if len(burst) == 1 else b"".join(burst)
                    if lingered:
                        # A burst read after the wait: one copy for the round's reads. (A
                        # flood's reads are copied one by one above: the writes between them
                        # pace the reads, which then find more in the pty; reading 16 times
                        # before one copy took ~10 % more, smaller, reads on 200 MB of bulk
                        # output.)
                        copy(stream, data)
                    last_data = now_m
                    if lingered and taken >= LINGER_FULL:  # the pty (nearly) filled up while
                        no_linger_until = now_m + LINGER_BACKOFF  # we waited: stop a while
                    if worker is not None:
                        worker.send(frame.KIND[stream], burst, now, now_m)
                        sent = True
                    elif plain is not None:
                        deliver(stream, data, now)
            if emptied is not None:  # (a round that read no pty leaves it as it was)
                drained = emptied
            if worker is not None:
                if sent:
                    worker.end_round()
                if worker.due(now_m, read=sent):
                    try:
                        worker.pump()
                    except OSError:
                        if pumping:
                            poller.unregister(worker.fd)
                            pumping = False
                        worker._died(warn)
            elif plain is not None and now_m - last_tick >= TICK:
                last_tick = now_m
                tick(now)
        status = child.wait()
        ended = time.time()
        outcome = Outcome(status if status >= 0 else None, -status if status < 0 else None,
                          child.pid, started, ended, counts, reads=reads, lingers=lingers,
                          usage=children_usage(max(floor_kib, _resident_kib())))
        if worker is not None:
            worker.finish(outcome, opts.worker_timeout, warn)
        return outcome
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        for fd in (wake_r, wake_w, *masters):
            try:
                os.close(fd)
            except OSError:
                pass


def exec_command(argv: Sequence[str], env: dict[str, str],
                 warn: Callable[[str], None]) -> int:
    """Replace this process with the command (the fallback when capture cannot run); only
    returns after a failed exec, with the status a shell gives for it."""
    try:
        os.execvpe(argv[0], list(argv), env)
    except OSError as e:
        code = 127 if isinstance(e, (FileNotFoundError, NotADirectoryError)) else 126
        warn(f"{argv[0]}: {'command not found' if code == 127 else e.strerror}")
        return code
    return 126  # pragma: no cover - not reached


def exit_like(outcome: Outcome) -> int:
    """End the calling process the way the command ended: re-raise its signal, or return the
    exit status for ``sys.exit``. Stop/continue signals are not terminal and are not re-raised.
    A core-dumping signal is re-raised with RLIMIT_CORE 0, so the wrapper leaves no core file
    of its own (the command's core, if any, was already written by the command)."""
    if outcome.signal is None:
        return outcome.exit_status if outcome.exit_status is not None else 1
    sig = outcome.signal
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL and SIGSTOP cannot be caught, so they are at their default already
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    time.sleep(1)  # the signal is delivered before this returns; never reached in practice
    return 128 + sig


def leave(code: int) -> None:
    """End the wrapper with ``code`` once the command has ended and the worker has written
    the end record, without the interpreter's teardown: a last full garbage collection and
    every module's clean-up, ~15 ms of CPU that no job needs (measured with perf on the
    training benchmark; docs/performance.md). The wrapper has no threads and buffers nothing
    of the job's (copies go out with ``os.write``); Python's own streams are flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)
