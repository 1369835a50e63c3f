"""A terminal relayed through a pty of logcapture's, as ``script(1)`` and tmux do it: the
program runs on an inner pty whose master logcapture reads, and the terminal it was given (the
outer one) is held here in raw mode. ``open_inner`` makes the inner pty as a copy of the outer
(termios and window size); ``Relay`` (a ``runner.outcome.Beside`` for the read loop) copies
what is typed on the outer terminal to the inner master as it comes, follows the outer's
window size, and says when the inner pty reads a line with echo off (``keeps``: a password
prompt), so that nothing read then is stored. The read loop copies the inner master's output
to the outer terminal unchanged.

Used for an interactive Slurm step (``slurm.interactive``); it knows nothing of Slurm.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import termios
import threading
from collections.abc import Mapping

from .descriptors import wait_for

TYPE_CHECKING = False  # not typing's (records.py says why)
if TYPE_CHECKING:
    from typing import Any

READ_SIZE = 65536
WINSIZE_POLL = 0.25  # seconds between window-size looks when no SIGWINCH can come
_IN = select.POLLIN | select.POLLHUP | select.POLLERR


def get_winsize(fd: int) -> bytes:
    """The raw ``struct winsize`` of a terminal (rows, columns and pixels)."""
    return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)


def open_inner(outer: int) -> tuple[int, int]:
    """A new pty whose slave starts as the ``outer`` terminal is now: same termios (the
    line discipline the program would have had), same window size. (master, slave); the
    master is non-blocking, neither is inherited."""
    attrs = termios.tcgetattr(outer)
    size = get_winsize(outer)
    master, slave = os.openpty()
    try:
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
        os.set_blocking(master, False)
        os.set_inheritable(master, False)
        os.set_inheritable(slave, False)
    except OSError:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


def read_ready(fd: int) -> bytes | None:
    """What a non-blocking read of ``fd`` gives: None when nothing is there yet, b"" when the
    other side is gone (end of file, or EIO once a pty's other end has closed)."""
    try:
        return os.read(fd, READ_SIZE)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def raw_attrs(attrs: list[Any]) -> list[Any]:
    """``attrs`` made raw as cfmakeraw(3) does: every byte passes unchanged, one at a time,
    no echo, no signals, no output processing (the inner pty's line discipline does all that,
    once)."""
    raw = list(attrs)
    raw[0] &= ~(termios.IGNBRK | termios.BRKINT | termios.PARMRK | termios.ISTRIP
                | termios.INLCR | termios.IGNCR | termios.ICRNL | termios.IXON)
    raw[1] &= ~termios.OPOST
    raw[2] = (raw[2] & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
    raw[3] &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG
                | termios.IEXTEN)
    cc = list(raw[6])
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    raw[6] = cc
    return raw


class Relay:
    """The outer terminal and the inner pty's master, served in the read loop's rounds
    (``runner.outcome.Beside``; ``runner.readloop.ReadLoop`` asks ``keeps`` before it stores a
    round's output).

    Input: each round reads what the outer terminal has and writes it to the inner master at
    once; what the inner pty cannot take yet (its input queue is full while the program reads
    nothing) waits in order, and the loop polls the master for room: nothing typed is dropped
    or reordered, and nothing of it is stored. Window size: when the outer's differs from the
    last one seen (each round; a SIGWINCH wakes the loop when this process has the outer as
    its controlling terminal, else ``watch_winsize`` looks every WINSIZE_POLL seconds), it is
    set on the inner pty, whose kernel then signals the program's foreground process group.
    Hang-up: when the outer terminal goes away, the inner pty's foreground process group and
    the program get SIGHUP, as they would have from the outer."""

    def __init__(self, outer: int, inner: int, program_pid: int):
        self.outer = outer
        self.inner = inner
        self.program_pid = program_pid
        self.out_fd = os.dup(inner)  # the master polled for room (the loop polls it for input)
        os.set_inheritable(self.out_fd, False)
        self.pending = bytearray()
        self.loop: Any = None
        self.watching_out = False
        self.reading = False
        self.size = b""
        self.stop_event = threading.Event()
        self.watcher: threading.Thread | None = None

    # --- runner.outcome.Beside -------------------------------------------------------------
    def open(self, slaves: Mapping[int, str]) -> None:
        pass

    def start(self, loop: Any) -> None:
        self.loop = loop
        self.size = self._outer_size()
        loop.poller.register(self.outer, _IN)
        self.reading = True

    def round(self, events: list[tuple[int, int]], now: float, now_m: float) -> bool:
        for fd, _ in events:
            if fd == self.outer and self.reading:
                self._read_outer()
        if self.pending:
            self._write_inner()
        self._follow_size()
        return False  # nothing here is output to store

    def stop(self) -> None:
        self.stop_event.set()
        if self.loop is not None:
            if self.reading:
                self.loop.poller.unregister(self.outer)
                self.reading = False
            if self.watching_out:
                self.loop.poller.unregister(self.out_fd)
                self.watching_out = False
        if self.out_fd >= 0:  # once: the loop stops it, and so may its caller
            os.close(self.out_fd)
            self.out_fd = -1

    def keeps(self) -> bool:
        """Whether output read now may be stored: not while the inner pty reads lines without
        echo (a password prompt: getpass(3), ``read -s``, sudo and ssh turn ECHO off and
        leave ICANON on); not when that cannot be told. A program that reads keys one by one
        (ICANON off: readline at every shell prompt, vim, less) turns ECHO off too, and shows
        what it chooses itself: that output is stored."""
        try:
            lflag = termios.tcgetattr(self.inner)[3]
        except (OSError, termios.error):
            return False
        return bool(lflag & termios.ECHO or not lflag & termios.ICANON)

    # --- input -----------------------------------------------------------------------------
    def _read_outer(self) -> None:
        data = read_ready(self.outer)
        if data is None:
            return
        if data:
            self.pending += data
        else:  # EIO (or end of file): the outer pty's master is closed
            self._hang_up()

    def _write_inner(self) -> None:
        while self.pending:
            try:
                n = os.write(self.inner, self.pending)
            except BlockingIOError:
                break
            except OSError as e:  # the program's pty is gone: what is typed now goes nowhere
                if e.errno in (errno.EIO, errno.EBADF):
                    self.pending.clear()
                    break
                raise
            del self.pending[:n]
        want = bool(self.pending)
        if want != self.watching_out:
            if want:
                self.loop.poller.register(self.out_fd, select.POLLOUT)
            else:
                self.loop.poller.unregister(self.out_fd)
            self.watching_out = want

    def _hang_up(self) -> None:
        """The outer terminal hung up (its master closed): stop reading it, and hang up the
        program as the kernel would have hung it up on the outer terminal."""
        import signal

        if self.reading:
            self.loop.poller.unregister(self.outer)
            self.reading = False
        try:
            group = os.tcgetpgrp(self.inner)
        except OSError:
            group = -1
        for target in ({group, self.program_pid} - {-1, 0}):
            try:
                if target == group:
                    os.killpg(target, signal.SIGHUP)
                else:
                    os.kill(target, signal.SIGHUP)
            except OSError:
                pass

    # --- window size -----------------------------------------------------------------------
    def _outer_size(self) -> bytes:
        try:
            return get_winsize(self.outer)
        except OSError:
            return self.size

    def _follow_size(self) -> None:
        size = self._outer_size()
        if size != self.size:
            self.size = size
            try:
                fcntl.ioctl(self.inner, termios.TIOCSWINSZ, size)
            except OSError:
                pass

    def watch_winsize(self) -> None:
        """When no SIGWINCH reaches this process (the outer terminal is not its controlling
        terminal): a thread that looks at the outer's size every WINSIZE_POLL seconds and
        wakes the loop with a SIGWINCH of its own when it changed."""
        import signal

        def look() -> None:
            last = self._outer_size()
            while not self.stop_event.wait(WINSIZE_POLL):
                size = self._outer_size()
                if size != last:
                    last = size
                    os.kill(os.getpid(), signal.SIGWINCH)

        self.watcher = threading.Thread(target=look, name="logcapture-winsize", daemon=True)
        self.watcher.start()


def set_controlling(fd: int) -> bool:
    """Make the terminal ``fd`` this process's controlling terminal (it must lead a session
    without one, and the terminal must be no other session's): its window-size changes then
    reach this process as SIGWINCH. Whether it worked."""
    try:
        fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
    except OSError:
        return False
    return True



def relay_plain(outer: int, inner: int, typed: bytes = b"", poll: float = WINSIZE_POLL
                ) -> None:
    """The last resort once the program runs on the inner pty and its capture failed: copy
    both ways (``typed`` first: what the relay had not written yet) and follow the window
    size, nothing stored, until every writer has closed the inner pty or the outer hung up.
    Without it the program would lose its terminal."""
    from .readloop import _write_all

    try:
        _write_all(inner, typed)
    except OSError:
        return
    size = b""
    while True:
        try:
            now = get_winsize(outer)
            if now != size:
                size = now
                fcntl.ioctl(inner, termios.TIOCSWINSZ, size)
        except OSError:
            pass
        ready = wait_for(read=(outer, inner), timeout=poll)
        for fd, to in ((inner, outer), (outer, inner)):
            if fd not in ready:
                continue
            data = read_ready(fd)
            if data is None:
                continue
            if not data:
                return  # the program's pty closed, or the terminal hung up (the caller's end)
            try:
                _write_all(to, data)
            except OSError:
                if to == outer:
                    return
