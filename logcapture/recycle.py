"""Starting a long-lived process afresh in place: the same program, arguments, environment and
pid, without what a library left behind in it (the embedded engine's threads and descriptors:
``store.engine_worn``).

``start_afresh`` (the callers' one entry) says so on stderr and executes the interpreter again
with the command line the process was started with (``sys.orig_argv``, ``restart_in_place``),
every descriptor but the standard three and a listening socket marked close-on-exec (the
socket is handed over in ``LOGCAPTURE_LISTEN_FD`` and taken back by ``adopt_listener``, so no
client that connects meanwhile is refused). A supervisor (systemd, the dev cluster's script)
sees the same process go on; the new start reads its state from disk as after any restart
(the agent's shipping cursors).

A stop asked for meanwhile is not lost: before it decides to start afresh, the caller gives
TERM and INT back their default action (``stop_ends_at_once``), after any handler they had ran
for a signal already come (signal.signal looks for pending signals first). A TERM that comes
after that, before the new start has installed its handlers, ends the process at once, as a
supervisor expects, with nothing in flight: the next start ships what is pending.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
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


def start_afresh(say: str, stopped: Callable[[], bool] = lambda: False,
                 listener: int | None = None, env: Mapping[str, str] | None = None) -> None:
    """Start this process afresh in place, unless a stop came first: TERM and INT get their
    default action (``stop_ends_at_once``); then, when ``stopped()`` says no stop was asked,
    ``say`` goes to stderr and the command line is executed again with ``env`` added to the
    environment, handing over the listening socket ``listener``. Returns only when stopped."""
    stop_ends_at_once()
    if stopped():
        return
    print(say, file=sys.stderr, flush=True)
    handed = {} if listener is None else {LISTEN_FD: str(listener)}
    restart_in_place(() if listener is None else (listener,),
                     {**os.environ, **handed, **(env or {})})


def adopt_listener(families: Iterable[int], path: Path | None = None) -> socket.socket | None:
    """The listening stream socket of one of ``families`` that a start afresh handed over in
    ``LOGCAPTURE_LISTEN_FD``, when that names one (and ``path``, when given, is still a
    socket); None otherwise. The variable is removed, so nothing started later inherits it."""
    value = os.environ.pop(LISTEN_FD, "")
    if not value.isdigit():
        return None
    try:
        sock = socket.socket(fileno=int(value))
    except OSError:
        return None
    try:
        listening = (sock.family in tuple(families) and sock.type == socket.SOCK_STREAM
                     and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
                     and (path is None or stat.S_ISSOCK(os.lstat(path).st_mode)))
    except OSError:
        listening = False
    if not listening:
        sock.detach()  # not ours to close: whatever it is, it stays as it was
        return None
    sock.set_inheritable(False)
    return sock


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
