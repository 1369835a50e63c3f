"""Signals the wrapper receives: ``FORWARDED_SIGNALS`` go on to the command's process group
(``Forwarder``); SIGWINCH also re-reads the caller's window size for the ptys.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from .terminal import caller_winsize, set_winsize

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    import subprocess

FORWARDED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGCONT, signal.SIGTSTP, signal.SIGALRM,
)


class Forwarder:
    """The wrapper's handler for ``FORWARDED_SIGNALS`` and SIGWINCH: each goes on to the
    command's process group once the command exists. SIGWINCH first re-reads the caller's size
    and applies it to the ptys; they are no controlling terminal, so the kernel tells nobody of
    the new size, and the signal is forwarded like the others."""

    def __init__(self, masters: Mapping[int, str]):
        self.masters = masters
        self.child: subprocess.Popen[bytes] | None = None

    def __call__(self, signum: int, stack: object) -> None:
        if signum == signal.SIGWINCH:
            try:
                r, c = caller_winsize()
                for fd in self.masters:
                    set_winsize(fd, r, c)
            except OSError:
                pass
        child = self.child
        if child is not None and child.returncode is None:
            try:
                os.killpg(child.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def install(self, wake_w: int) -> tuple[dict[int, object], int]:
        """Put the handlers in (before the child exists, so that a signal arriving during the
        spawn is not lost to the default action, which would kill the wrapper and hang up the
        job's pty) and make every signal wake the reader through ``wake_w``. Returns what
        ``restore`` needs."""
        previous: dict[int, object] = {}
        for sig in (*FORWARDED_SIGNALS, signal.SIGWINCH):
            previous[sig] = signal.signal(sig, self)
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda s, f: None)
        return previous, signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    @staticmethod
    def restore(previous: dict[int, object], old_wakeup: int) -> None:
        signal.set_wakeup_fd(old_wakeup)
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
