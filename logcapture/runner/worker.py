"""The capture process as the reader sees it: ``fork_worker`` forks it, ``Worker`` holds the
frames (``frame.py``) the pipe has not taken yet, pumps them without blocking, and at the end hands
it the outcome and waits for it to finish the spool.
"""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from itertools import islice

from .. import frame
from .descriptors import wait_for
from .outcome import Outcome, own_usage
from .signals import FORWARDED_SIGNALS

# Frames to a capture worker: the format is frame.py's. A frame holds what consecutive rounds
# of the reader read from one stream within COALESCE, each round's reads with the round's
# time and whether the round ended there (pipeline.Pipeline orders the two streams' lines by
# read time).
WORKER_PIPE_BYTES = 1 << 20  # asked of F_SETPIPE_SZ; the kernel may grant less
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
# The reader joins one stream's rounds read within COALESCE seconds of the first into one
# frame, and the worker renders consecutive frames of one stream read within COALESCE as one
# chunk (each round's lines keep its read time): a flood read ~400 bytes at a time would
# otherwise cost the worker a renderer call per read (40 % of its CPU for 1M print() lines)
# and both processes a frame header per read.
COALESCE = 0.005
_IOV_MAX = 512  # pieces per writev (Linux allows 1024)


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
        # The frame still open: its kind, its reads' pieces, and per round its bytes, wall
        # time and whether the round ended with it; its first and last monotonic time. Its
        # header goes into ``pieces`` when it is closed (at another stream's frame, after
        # COALESCE, or at a pump).
        self._kind = -1
        self._parts: list[bytes] = []
        self._lens: list[int] = []
        self._walls: list[float] = []
        self._ends: list[bool] = []
        self._first = self._mono = 0.0

    def send(self, kind: int, parts: list[bytes], wall: float, mono: float) -> None:
        """``parts`` (consecutive reads of one stream) read in one round at ``wall``/``mono``:
        one read of the open frame when that is of this stream and began within COALESCE,
        else of a new frame (one frame a round made a flood of short prints cost the reader
        and the worker a header per read)."""
        if not self.size:
            self.since = mono
        if kind != self._kind or not self._lens or wall - self._walls[0] > COALESCE:
            self._close_frame()
            self._kind = kind
            self._first = mono
            self.size += frame.HEADER.size
        n = sum(map(len, parts))
        self._parts += parts
        self._lens.append(n)
        self._walls.append(wall)
        self._ends.append(False)
        self._mono = mono
        self.size += frame.READ_ENTRY + n

    def send_end(self, payload: bytes) -> None:
        """The end frame, carrying the outcome (``frame.encode_end``)."""
        self._close_frame()
        mono = time.monotonic()
        data = frame.encode_reads(frame.END, [], mono, mono, payload)
        if not self.size:
            self.since = mono
        self.pieces.append(data)
        self.size += len(data)

    def end_round(self) -> None:
        """The round that sent the open frame's last read has ended: mark it so."""
        if self._ends:
            self._ends[-1] = True

    def _close_frame(self) -> None:
        if self._lens:
            self.pieces.append(frame.header(self._kind, sum(self._lens), self._lens,
                                            self._walls, self._ends, self._first, self._mono))
            self.pieces.extend(self._parts)
            self._parts, self._lens, self._walls, self._ends = [], [], [], []

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
        self._close_frame()
        self.pieces.clear()
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
                    wait_for(read=(pidfd,), timeout=timeout)
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
        self.send_end(payload)
        try:
            while self.size:
                if self.blocked:
                    if time.monotonic() - self.last_progress > timeout:
                        warn("the capture process stopped responding; what it had not written "
                             "to the spool is lost (the command's output files are complete)")
                        self.give_up()
                        return
                    wait_for(write=(self.fd,), timeout=0.2)
                self.pump()
        except OSError:
            self.lost(warn)
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

    def leave_unended(self, timeout: float) -> None:
        """Let the worker take what it has not yet, then close its pipe without an end frame:
        it keeps the run unfinished (the command's outcome is unknown here). Given up after
        ``timeout`` seconds."""
        if self.gone:
            return
        deadline = time.monotonic() + timeout
        try:
            while self.size and time.monotonic() < deadline:
                if self.blocked:
                    wait_for(write=(self.fd,), timeout=0.2)
                self.pump()
        except OSError:
            pass
        self._close()
        if self.reap(max(0.0, deadline - time.monotonic())) is None:
            self.give_up()
        self.gone = True

    def lost(self, warn: Callable[[str], None]) -> None:
        """The worker exited on its own (its pipe broke): reap it (kill it if it has not
        exited after all) and say how it ended, once."""
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
