"""The command's pseudo-terminals and their window size: ``open_terminals`` (the ptys, output
post-processing off, the caller's size), ``caller_winsize``, ``set_winsize``, ``NoTerminal``.
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios
from collections.abc import Sequence

DEFAULT_COLUMNS = 80
DEFAULT_LINES = 24


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


def open_terminals_and_wakeup(rows: int, cols: int,
                              merge: bool) -> tuple[int, int, int, int, int, int]:
    """The ptys (one for both streams with ``merge``, as the job's two descriptors then share
    one place) and the wake-up pipe: (out master, out slave, err master, err slave, wake read
    end, wake write end). Nothing has started yet: a failure is the caller's to handle, as
    ``NoTerminal``."""
    opened: list[int] = []
    try:
        out_m, out_s = _open_pty(rows, cols, opened)
        if merge:
            err_m, err_s = out_m, out_s
        else:
            err_m, err_s = _open_pty(rows, cols, opened)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        for fd in opened:
            os.close(fd)
        raise NoTerminal(e.errno, e.strerror) from e
    return out_m, out_s, err_m, err_s, wake_r, wake_w


def open_terminals(rows: int, cols: int, merge: bool) -> tuple[int, int, int, int]:
    """The ptys for a command that another process starts (``attach``): (out master, out
    slave, err master, err slave) as ``run`` opens them; with ``merge`` one pty twice.
    Raises ``NoTerminal``."""
    out_m, out_s, err_m, err_s, wake_r, wake_w = open_terminals_and_wakeup(rows, cols, merge)
    os.close(wake_r)
    os.close(wake_w)
    return out_m, out_s, err_m, err_s
