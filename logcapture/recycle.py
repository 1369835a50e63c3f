"""Starting a long-lived process afresh in place: the same program, arguments, environment and
pid, without what a library left behind in it (the embedded engine's threads and descriptors:
``store.engine_worn``).

``restart_in_place`` closes every descriptor but the standard three and those it is told to
keep (a listening socket, so no client that connects meanwhile is refused), then executes the
interpreter again with the command line the process was started with (``sys.orig_argv``). A
supervisor (systemd, the dev cluster's script) sees the same process go on; the new start reads
its state from disk as after any restart (the agent's shipping cursors, the read service's
socket passed in ``LOGCAPTURE_LISTEN_FD``).

A stop asked for meanwhile is not lost: the caller holds TERM and INT (``hold_stop_signals``)
before it decides to start afresh; a signal that comes then stays pending through exec(3)
(signal(7): the mask and pending signals are kept), and the new start lets it in
(``let_stop_signals_in``) once its handlers are installed.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable
from typing import NoReturn

LISTEN_FD = "LOGCAPTURE_LISTEN_FD"  # a listening socket handed to the new start
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def hold_stop_signals() -> None:
    """Keep TERM and INT pending from now on (a stop is looked at after this, then kept)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def let_stop_signals_in() -> None:
    """Deliver TERM and INT again, a pending one now (to the handlers just installed)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def restart_in_place(keep: Iterable[int] = (), env: dict[str, str] | None = None) -> NoReturn:
    """Execute this process's command line again in this process (exec(3)), keeping the
    descriptors ``keep`` open across it, with ``env`` (the current environment by default)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    kept = sorted({fd for fd in keep if fd > 2})
    low = 3
    for fd in kept:
        os.closerange(low, fd)
        os.set_inheritable(fd, True)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    argv = list(sys.orig_argv) or [sys.executable]
    os.execve(sys.executable, argv, dict(os.environ) if env is None else env)
