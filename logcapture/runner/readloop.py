"""The read loop: ``ReadLoop`` reads the ptys while the command runs and while they drain, copies
every read to the real outputs first and hands it to the sink (a ``Worker``, or a sink fed in
this process).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time
from collections.abc import Callable

from .. import frame
from ..records import STDERR, STDOUT
from .descriptors import wait_for
from .outcome import Options
from .worker import Worker

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)

READ_SIZE = 65536
FULL_READ = 4095  # what one read of a Linux pty master returns at most (its tty buffer)
TICK = 0.2  # seconds between sink.tick() calls while the command is quiet
TICK_MS = int(TICK * 1000)
QUIET_MS = 5000  # the reader's poll timeout while nothing is due (a worker takes the ticks)


# When output comes after the reader emptied the ptys (the start of a burst, most likely), it
# waits LINGER before reading, so a job printing line by line is read a burst at a time instead
# of one read per line (each round of poll, read, copy and frame costs the reader 50-150 us of
# CPU here), and the round's reads reach the real output in one write: a training job's burst
# costs poll, sleep, two reads and a write (a read before the wait as well would double the
# system calls). Output reaches the real stdout at most LINGER later, below what a person
# notices; a flood, which never empties the pty, is not held back at all. The pty holds
# ~17 KB: a job writing faster than that per LINGER fills it during the wait, and the reads
# after it take LINGER_FULL or more; the job may then have blocked for up to LINGER, so
# lingering stops for LINGER_BACKOFF seconds and a flood is read without any wait (at most
# 0.2 % of its time blocked; a sleep after every short read, without that back-off, slows a
# flood down 5-20 times). None after the command exits.
# While nothing is due (no frames held back, no drain) the reader's poll waits QUIET_MS: a
# quiet job costs it a wake-up every 5 s; SIGCHLD and the other
# signals wake it through wake_r, and the timeout finds the command's exit when SIGCHLD never
# comes (a wrapper started with it blocked).
LINGER = 0.01
LINGER_FULL = 12 * 1024
LINGER_BACKOFF = 5.0
PASSES = 4  # read passes over the ptys in one round, at most (two streams flooding at once)
READS_IN_A_ROW = 16  # full reads of one pty in a pass before the next pty's turn


if TYPE_CHECKING:
    import subprocess

    from .outcome import Sink


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
            wait_for(write=(fd,))
            continue
        view = view[n:]


_POLLIN = select.POLLIN | select.POLLHUP | select.POLLERR


class ReadLoop:
    """The reader while the command runs and while its ptys drain. Each turn of ``run``:
    look for the command's exit, stop once the drain is over, follow the worker (flow control,
    a hung or dead worker), wait in poll(2), then one round: linger, read the signals that woke
    it, read the ptys, copy and hand over what they gave, send the worker its frames.

    poll(2) keeps its registrations across turns: the loop turns once per read, up to ~100k
    times a second, so it does as few system calls as it can. The ptys are registered while
    ``reading`` (not while the worker's buffer is full) and the worker's pipe for POLLOUT while
    ``pumping`` (only while the pipe is full)."""

    def __init__(self, child: subprocess.Popen[bytes], masters: dict[int, str], wake_r: int,
                 sink: Sink | Worker | None, opts: Options, warn: Callable[[str], None],
                 counts: dict[str, int]):
        self.child = child
        self.masters = masters
        self.wake_r = wake_r
        self.worker = sink if isinstance(sink, Worker) else None
        self.plain: Sink | None = None if isinstance(sink, Worker) else sink  # fed in-process
        self.opts = opts
        self.warn = warn
        self.counts = counts
        self.real = {STDOUT: opts.stdout_fd, STDERR: opts.stderr_fd}
        self.broken: set[str] = set()  # streams whose copy to the real output failed
        self.hang_up: set[str] = set()  # streams whose output's reader went away (EPIPE)
        self.poller = select.poll()
        for fd in masters:
            self.poller.register(fd, _POLLIN)
        self.poller.register(wake_r, select.POLLIN)
        self.open_fds = set(masters)
        self.reading = True  # the ptys are registered
        self.pumping = False  # the worker's pipe is registered for POLLOUT
        self.worker_fd = self.worker.fd if self.worker is not None else -1
        self.check_child = True  # a SIGCHLD (or a quiet spell) since the last look
        self.exited_at: float | None = None
        self.last_data = time.monotonic()
        self.last_tick = self.last_data
        self.no_linger_until = 0.0
        self.drained = True  # the last round read every pty it was woken for empty
        self.lead = list(masters)  # the order of the next round's first pass
        self.reads = 0  # pty reads that returned data
        self.lingers = 0  # LINGER waits
        self.beside = opts.beside
        # A writer beside that can say when output must not be stored (runner.relay: echo off)
        self.keeps: Callable[[], bool] | None = getattr(self.beside, "keeps", None)
        if self.beside is not None:
            self.beside.start(self)

    def run(self) -> None:
        while self.open_fds:
            now = time.monotonic()
            self._look_for_exit(now)
            if self._drain_over(now):
                break
            timeout = self._follow_worker(now)
            if timeout is None:
                continue  # the worker was given up: look again without it
            try:
                events = self.poller.poll(self._quiet(timeout))
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            self._round(events)
        if self.beside is not None:
            self.beside.stop()

    # --- before the wait -----------------------------------------------------------------
    def _look_for_exit(self, now: float) -> None:
        if self.check_child and self.exited_at is None:
            self.check_child = False
            if self.child.poll() is not None:
                self.exited_at = now
                self.last_data = now  # the drain's idle clock starts at the exit

    def _drain_over(self, now: float) -> bool:
        """After the exit: have the ptys been quiet for ``drain_idle``, or has the drain taken
        ``drain_timeout``? (A background grandchild that holds a pty open cannot hang the
        wrapper.)"""
        if self.exited_at is None:
            return False
        return (now - self.last_data >= self.opts.drain_idle
                or now - self.exited_at >= self.opts.drain_timeout)

    def _follow_worker(self, now: float) -> int | None:
        """Flow control with the worker; the poll timeout (ms) until its frames are due, or
        None when it was just given up for accepting nothing for ``worker_timeout``."""
        worker = self.worker
        if worker is None:
            return TICK_MS
        if worker.gone:
            self._forget_worker()
            return TICK_MS
        self._watch_ptys(worker.size < self.opts.worker_buffer)  # not while the buffer is full
        timeout = TICK_MS
        if worker.blocked != self.pumping:  # POLLOUT only while the pipe is full
            self._watch_pipe(worker.blocked)
        elif worker.size and not self.pumping:
            timeout = max(0, int((worker.pump_at() - now) * 1000) + 1)
        if self.pumping and now - worker.last_progress > self.opts.worker_timeout:
            self.warn("the capture process stopped responding; capture stopped, the "
                      "command goes on and its output still reaches its files")
            self._watch_pipe(False)
            worker.give_up()
            return None
        if not self.reading:
            self.last_data = now  # not reading is not being quiet
        return timeout

    def _quiet(self, timeout: int) -> int:
        """QUIET_MS when nothing is due before the next output or signal (SIGCHLD wakes the
        poll through the wake-up pipe): a quiet job costs the reader a wake-up every few
        seconds, only to look for the command's exit in case SIGCHLD never comes (a wrapper
        started with it blocked)."""
        if (timeout == TICK_MS and self.worker is not None and self.exited_at is None
                and self.reading and not self.pumping):
            return QUIET_MS
        return timeout

    def _watch_ptys(self, on: bool) -> None:
        if on != self.reading:
            self.reading = on
            for fd in self.open_fds:
                if on:
                    self.poller.register(fd, _POLLIN)
                else:
                    self.poller.unregister(fd)

    def _watch_pipe(self, on: bool) -> None:
        if on != self.pumping:
            self.pumping = on
            if on:
                self.poller.register(self.worker_fd, select.POLLOUT)
            else:
                self.poller.unregister(self.worker_fd)

    def _forget_worker(self) -> None:
        """The worker is gone (given up, or it died): read the ptys again, pump no more."""
        self.worker = None
        if self.pumping:
            self.pumping = False
            try:
                self.poller.unregister(self.worker_fd)
            except KeyError:
                pass
        self._watch_ptys(True)

    # --- one round -----------------------------------------------------------------------
    def _round(self, events: list[tuple[int, int]]) -> None:
        now_m = time.monotonic()
        if not events:
            self.check_child = True  # a quiet spell: look for the exit, SIGCHLD or not
        lingered = self._linger(events, now_m)
        if lingered:
            now_m = time.monotonic()
        now = time.time()
        # The writers beside the command first: what srun wrote before it exited is copied
        # before what the job wrote after (slurm.forward).
        sent = self.beside is not None and self.beside.round(events, now, now_m)
        if self._wake_up(events):
            bursts = self._read_ptys(lingered)
            sent = self._hand_over(bursts, lingered, now, now_m) or sent
        self._pass_on(sent, now, now_m)
        if self.hang_up:
            self._hang_up_broken()

    def _linger(self, events: list[tuple[int, int]], now: float) -> bool:
        """Output after a quiet spell is the start of a burst, most likely: wait LINGER for
        the rest of it, so that one round reads it all (see LINGER)."""
        if (self.drained and self.exited_at is None and now >= self.no_linger_until
                and any(fd in self.open_fds for fd, _ in events)):
            self.lingers += 1
            time.sleep(LINGER)
            return True
        return False

    def _wake_up(self, events: list[tuple[int, int]]) -> bool:
        """Read the signals that woke the poll (a SIGCHLD: look for the exit); does a pty
        have output?"""
        woken = False
        for fd, _ in events:
            if fd == self.wake_r:
                try:
                    while True:
                        got = os.read(fd, 512)
                        if not got:
                            break
                        if signal.SIGCHLD in got:
                            self.check_child = True
                except BlockingIOError:
                    pass
            elif fd in self.open_fds:
                woken = True
        return woken

    def _read_ptys(self, lingered: bool) -> dict[int, list[bytes]]:
        """Read every pty, in passes, until a pass finds output only on the pty it read first
        (at most PASSES): a write the command made before another is then read in the same
        round as that one or an earlier round, whichever streams they went to (the pass that
        ends the round read each pty after the last read that found output). The worker orders
        the two streams' lines by their rounds (pipeline.Pipeline._release): a /LOGCOMMAND is
        never read in a later round than the other stream's text written after it. Each pass
        starts with the pty that last had output. Returns each pty's reads."""
        open_fds = self.open_fds
        order = [fd for fd in self.lead if fd in open_fds]
        bursts: dict[int, list[bytes]] = {}
        emptied = None  # whether every pty read ended short (None: no pty read)
        for _ in range(PASSES):
            later = -1  # a pty after the pass's first that had output
            for i, fd in enumerate(order):
                burst = bursts.setdefault(fd, [])
                had = len(burst)
                empty = self._read_pty(fd, burst, lingered)
                emptied = empty and emptied is not False
                if i and len(burst) > had:
                    later = fd
            if later < 0 or len(order) < 2:
                break
            order.remove(later)
            order.insert(0, later)
            order = [fd for fd in order if fd in open_fds]
        self.lead = order or self.lead
        if emptied is not None:  # (a round that read no pty leaves it as it was)
            self.drained = emptied
        return bursts

    def _read_pty(self, fd: int, burst: list[bytes], lingered: bool) -> bool:
        """Read ``fd`` into ``burst``. A full read (the pty hands out at most FULL_READ bytes)
        means more is waiting: read again at once instead of asking poll(), up to
        READS_IN_A_ROW reads. Returns whether the last read ended short (the pty had no more).
        Outside a lingered round, each read is copied out at once, as written (a flood)."""
        stream = self.masters[fd]
        if stream in self.hang_up:
            return True  # its output's reader went away: read no more (_hang_up_broken)
        worker = self.worker
        read = os.read
        for _ in range(READS_IN_A_ROW):
            try:
                data = read(fd, READ_SIZE)
            except BlockingIOError:
                return True
            except OSError as e:
                if e.errno != errno.EIO:
                    self.warn(f"reading the command's {stream} failed: {e.strerror}")
                data = b""
            if not data:  # EIO: every writer has closed the pty
                self.open_fds.discard(fd)
                if self.reading:
                    self.poller.unregister(fd)
                return True
            self.reads += 1
            burst.append(data)
            if not lingered:
                self._copy(stream, data)
                if stream in self.hang_up:
                    return True  # read no more: the job would have been stopped here
            if worker is not None and \
                    worker.size + len(burst) * READ_SIZE >= self.opts.worker_buffer:
                return False  # flow control: the loop stops reading the ptys
            if len(data) < FULL_READ:
                return True
        return False

    def _hand_over(self, bursts: dict[int, list[bytes]], lingered: bool, now: float,
                   now_m: float) -> bool:
        """Count each pty's reads, copy a lingered round's reads out in one write, and give
        them to the worker as one frame (or to the in-process sink). Returns whether the
        worker was given output.

        A burst read after the wait is copied once for the round's reads. A flood's reads are
        copied one by one as they are read: the writes between them pace the reads, which then
        find more in the pty (reading 16 times before one copy took ~10 % more, smaller, reads
        on 200 MB of bulk output)."""
        sent = False
        # Output read while the beside writer says no (runner.relay: echo off) is copied
        # out and counted, never stored.
        keep = self.keeps is None or not any(bursts.values()) or self.keeps()
        worker = self.worker if keep else None
        for fd, burst in bursts.items():
            if not burst:
                continue
            stream = self.masters[fd]
            taken = sum(map(len, burst))
            self.counts[stream] += taken
            if lingered or worker is None:
                data = burst[0] if len(burst) == 1 else b"".join(burst)
            if lingered:
                self._copy(stream, data)
            self.last_data = now_m
            if lingered and taken >= LINGER_FULL:  # the pty (nearly) filled up while
                self.no_linger_until = now_m + LINGER_BACKOFF  # we waited: stop a while
            if worker is not None:
                worker.send(frame.KIND[stream], burst, now, now_m)
                sent = True
            elif self.plain is not None and keep:
                self._feed_plain(stream, data, now)
        return sent

    def _pass_on(self, sent: bool, now: float, now_m: float) -> None:
        """End the round's frames and pump them to the worker when they are due (a worker
        that has exited is reported and forgotten); an in-process sink gets its ticks."""
        worker = self.worker
        if worker is not None:
            if sent:
                worker.end_round()
            if worker.due(now_m, read=sent):
                try:
                    worker.pump()
                except OSError:
                    self._watch_pipe(False)
                    worker.lost(self.warn)
        elif self.plain is not None and now_m - self.last_tick >= TICK:
            self.last_tick = now_m
            self._tick_plain(now)

    # --- for the writers beside the command (Options.beside) ------------------------------
    def drain_ptys(self, now: float, now_m: float) -> bool:
        """Read and copy out what the ptys hold now; whether the worker was given output."""
        return self._hand_over(self._read_ptys(False), False, now, now_m)

    def pass_through(self, stream: str, data: bytes, kept: bytes, now: float,
                     now_m: float) -> bool:
        """Bytes another writer meant for the command's ``stream`` output: copied there;
        ``kept`` (of them) captured as that stream. Whether the worker was given output."""
        self.last_data = now_m  # output all the same: the drain waits for it
        if data:
            self._copy(stream, data)
        if not kept:
            return False
        if self.worker is not None:
            self.worker.send(frame.KIND[stream], [kept], now, now_m)
            return True
        self._feed_plain(stream, kept, now)
        return False

    # --- the outputs -----------------------------------------------------------------------
    def _copy(self, stream: str, data: bytes) -> None:
        if stream not in self.broken:
            try:
                _write_all(self.real[stream], data)
            except OSError as e:
                self.broken.add(stream)
                if e.errno == errno.EPIPE:  # the pipe's reader went away (``| head``)
                    self.hang_up.add(stream)
                    return
                # The output file failed (a full disk): stop copying that stream but keep
                # capturing and keep the job running.
                self.warn(f"cannot copy the command's {stream} to its output: {e.strerror}")

    def _hang_up_broken(self) -> None:
        """The reader of a stream's output went away: without logcapture the command's next
        write there would have raised SIGPIPE (or failed with EPIPE where SIGPIPE is ignored,
        as Python does). The same here, at the end of the round that found it: SIGPIPE to the
        command's process group, and the stream's pty closed, so that a write to it fails
        (EIO). What was read before is captured; nothing is written there any more."""
        try:
            os.killpg(self.child.pid, signal.SIGPIPE)
        except (ProcessLookupError, PermissionError):
            pass
        for fd in [fd for fd, s in self.masters.items() if s in self.hang_up]:
            if fd in self.open_fds:
                self.open_fds.discard(fd)
                if self.reading:
                    self.poller.unregister(fd)
            del self.masters[fd]  # closed here, not again by ``run``
            os.close(fd)
        self.hang_up.clear()

    def _feed_plain(self, stream: str, data: bytes, now: float) -> None:
        if self.plain is not None:
            try:
                self.plain.feed(stream, data, now)
            except Exception as e:  # noqa: BLE001 - never break the job
                # Type name only: the message may quote job text a mode has dropped.
                self.warn(f"capture stopped after an internal error ({type(e).__name__});"
                          " the command goes on and its output still reaches its files")
                self.plain = None

    def _tick_plain(self, now: float) -> None:
        if self.plain is not None:
            try:
                self.plain.tick(now)
            except Exception as e:  # noqa: BLE001
                self.warn(f"capture stopped after an internal error ({type(e).__name__})")
                self.plain = None
