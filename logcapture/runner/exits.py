"""How the wrapper hands over or ends: ``exec_command`` (the fallback when capture cannot run),
``exit_like`` (end as the command ended), ``leave`` (end without the interpreter's teardown).
"""

from __future__ import annotations

import os
import resource  # up front: a job that used every descriptor leaves none to load it
import signal
import sys
import time
from collections.abc import Callable, Sequence

from .outcome import Outcome


def exec_command(argv: Sequence[str], env: dict[str, str],
                 warn: Callable[[str], None], closed: frozenset[int] = frozenset()) -> int:
    """Replace this process with the command (the fallback when capture cannot run); only
    returns after a failed exec, with the status a shell gives for it. ``closed``: the
    standard descriptors the caller had closed (``reserve_std_fds``), closed again first."""
    for fd in closed:
        os.close(fd)
    try:
        os.execvpe(argv[0], list(argv), env)
    except OSError as e:
        from ..errors import EXIT_NOT_FOUND, exec_failed_status

        code = exec_failed_status(e)
        warn(f"{argv[0]}: {'command not found' if code == EXIT_NOT_FOUND else e.strerror}")
        return code


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
