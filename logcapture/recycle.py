"""Starting a long-lived process afresh in place: the same program, arguments, environment and
pid, without what a library left behind in it (the embedded engine's threads and descriptors:
``store.engine_worn``).

``restart_in_place`` closes every descriptor but the standard three and those it is told to
keep (a listening socket, so no client that connects meanwhile is refused), then executes the
interpreter again with the command line the process was started with (``sys.orig_argv``). A
supervisor (systemd, the dev cluster's script) sees the same process go on; the new start reads
its state from disk as after any restart (the agent's shipping cursors, the read service's
socket passed in ``LOGCAPTURE_LISTEN_FD``).

A stop asked for meanwhile is not lost: before it decides to start afresh, the caller gives
TERM and INT back their default action (``stop_ends_at_once``), after any handler they had ran
for a signal already come (signal.signal looks for pending signals first). A TERM that comes
after that, before the new start has installed its handlers, ends the process at once, as a
supervisor expects, with nothing in flight: the next start ships what is pending.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable
from typing import NoReturn

LISTEN_FD = "LOGCAPTURE_LISTEN_FD"  # a listening socket handed to the new start
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_ends_at_once() -> None:
    """TERM and INT end the process at once from now on (their default action), and no
    alarm is armed. A handler of theirs runs first for a signal already come, so the caller
    looks at its stop flag after this."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def restart_in_place(keep: Iterable[int] = (), env: dict[str, str] | None = None) -> NoReturn:
    """Execute this process's command line again in this process (exec(3)), keeping the
    descriptors ``keep`` open across it, with ``env`` (the current environment by default)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    kept = {fd for fd in keep if fd > 2}
    # Marked close-on-exec rather than closed: the engine's leftover threads still use theirs
    # until exec(3) ends them, and a number closed under them could be reused meanwhile.
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: close them (no thread may use a number reused)
        open_fds = []
        low = 3
        for fd in sorted(kept):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    for fd in open_fds:
        if fd > 2 and fd not in kept:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # closed since it was listed (the listing's own descriptor)
    for fd in kept:
        os.set_inheritable(fd, True)
    argv = list(sys.orig_argv) or [sys.executable]
    os.execve(sys.executable, argv, dict(os.environ) if env is None else env)
