"""Running a command: ``run`` opens the ptys, installs the signal handlers, spawns the command and
reads it (``readloop.ReadLoop``) until it has ended and its ptys drained; ``attach`` does the same
for a command another process started on ptys opened here (``Attached``, a Slurm task).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Iterable, Mapping, Sequence

from ..records import STDERR, STDOUT
from .descriptors import closer, wait_for
from .outcome import NO_BYTES, Options, Outcome, children_usage, resident_kib
from .readloop import ReadLoop
from .signals import FORWARDED_SIGNALS, Forwarder
from .terminal import NoTerminal, caller_winsize, open_terminals_and_wakeup
from .worker import Worker

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)

if TYPE_CHECKING:
    from .outcome import Sink


# Spawn errors that say the wrapper ran out of something, not that the command is wrong.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


def _spawn_failed(argv: Sequence[str], e: OSError, started: float,
                  counts: Mapping[str, int]) -> Outcome:
    """The outcome of a command that could not be started: 127 when it was not found, 126
    when it could not be executed, as a shell says."""
    from ..errors import EXIT_NOT_FOUND, exec_failed_status

    code = exec_failed_status(e)
    what = "command not found" if code == EXIT_NOT_FOUND else (e.strerror or str(e))
    return Outcome(code, None, 0, started, time.time(), counts, spawn_error=f"{argv[0]}: {what}")


def run(argv: Sequence[str], sink: Sink | Worker | None,
        options: Options | None = None) -> Outcome:
    """Run ``argv`` under ptys, copy its output to the real outputs and hand it to ``sink``
    (a ``Worker``, or a sink fed in this process); return how it ended. Raises
    ``NoTerminal`` when nothing could be started."""
    import subprocess  # here, not at import: a task's capture (``attach``) spawns nothing

    opts = options or Options()
    warn = opts.warn or (lambda msg: None)
    worker = sink if isinstance(sink, Worker) else None
    rows, cols = opts.winsize or caller_winsize()
    out_m, out_s, err_m, err_s, wake_r, wake_w = open_terminals_and_wakeup(rows, cols, opts.merge)
    masters = {out_m: STDOUT} if opts.merge else {out_m: STDOUT, err_m: STDERR}
    counts = {STDOUT: 0, STDERR: 0}
    forward = Forwarder(masters)
    previous, old_wakeup = forward.install(wake_w)
    started = time.time()
    began = time.monotonic()  # the end's clock (_outcome)
    floor_kib = resident_kib()
    if opts.beside is not None:  # before the command starts: it may start an srun at once
        opts.beside.open({out_s: STDOUT} if opts.merge else {out_s: STDOUT, err_s: STDERR})
    try:
        try:
            # (preexec_fn only where the caller had a standard descriptor closed: the
            # wrapper has no threads, which is what makes it safe)
            child = subprocess.Popen(
                list(argv), stdin=opts.stdin_fd, stdout=out_s, stderr=err_s,
                env=opts.env, start_new_session=True, restore_signals=True, close_fds=True,
                preexec_fn=closer(opts.closed) if opts.closed else None)
        except OSError as e:
            for fd in {out_m, out_s, err_m, err_s}:
                os.close(fd)
            if e.errno in _RESOURCE_ERRNOS:
                raise NoTerminal(e.errno, e.strerror) from e
            outcome = _spawn_failed(argv, e, started, counts)
            if worker is not None:
                worker.finish(outcome, opts.worker_timeout, warn)
            return outcome
        forward.child = child
        for fd in {out_s, err_s}:
            os.close(fd)
        if opts.on_start:
            opts.on_start(child.pid)
        loop = ReadLoop(child, masters, wake_r, sink, opts, warn, counts)
        loop.run()
        status = child.wait()
        outcome = _outcome(status, child.pid, started, began, counts, loop,
                           children_usage(max(floor_kib, resident_kib())))
        if loop.worker is not None:
            loop.worker.finish(outcome, opts.worker_timeout, warn)
        return outcome
    finally:
        forward.restore(previous, old_wakeup)
        _close_all((wake_r, wake_w, *masters))


def _outcome(status: int, pid: int, started: float, began: float, counts: dict[str, int],
             loop: ReadLoop, usage: Mapping[str, int] = NO_BYTES) -> Outcome:
    """The command's ``Outcome`` from its wait status (``Popen.returncode``: -N for signal
    N). Its end is its start plus the monotonic time since ``began`` (clock_gettime(2)): a
    wall clock stepped meanwhile changes neither the duration nor its sign."""
    return Outcome(status if status >= 0 else None, -status if status < 0 else None, pid,
                   started, started + (time.monotonic() - began), counts, reads=loop.reads,
                   lingers=loop.lingers, usage=usage)


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Attached:
    """A command started by another process on ptys opened here (a Slurm task, whose slaves
    the SPANK plugin put on its fds 1 and 2), as ``ReadLoop`` sees a child: its pid, and its
    wait status once someone tells it (``set_status``; the plugin does, from
    ``slurm_spank_task_exit``). It is not this process's child: nothing here waits for it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None  # as subprocess's: -N when killed by signal N

    def poll(self) -> int | None:
        return self.returncode

    def set_status(self, wait_status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(wait_status)
        os.kill(os.getpid(), signal.SIGCHLD)  # wakes the reader's poll (set_wakeup_fd)


def attach(masters: Mapping[int, str], task: Attached, sink: Worker | None,
           options: Options | None = None, status_timeout: float = 5.0) -> Outcome | None:
    """``run`` for a command that runs already on the ptys whose ``masters`` are given
    ({fd: stream}): read, copy to the real outputs and hand to ``sink`` until the command has
    ended (``task.set_status``) and its ptys drained, or every writer closed them; then wait up
    to ``status_timeout`` seconds for its status. Returns the outcome, which the worker has
    been given, or None when the status never came (the worker is then left to end without
    it). Signals meant for the task's step (scancel) are ignored here: the task decides."""
    opts = options or Options()
    warn = opts.warn or (lambda msg: None)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous: dict[int, object] = {}
    for sig in (*FORWARDED_SIGNALS, signal.SIGPIPE):
        previous[sig] = signal.signal(sig, signal.SIG_IGN)
    previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda s, f: None)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    started = time.time()
    began = time.monotonic()
    counts = {STDOUT: 0, STDERR: 0}
    try:
        loop = ReadLoop(task, dict(masters), wake_r, sink, opts, warn,  # type: ignore[arg-type]
                         counts)
        loop.run()
        deadline = time.monotonic() + status_timeout
        while task.returncode is None and time.monotonic() < deadline:
            wait_for(read=(wake_r,), timeout=max(0.0, deadline - time.monotonic()))
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        status = task.returncode
        if status is None:
            if loop.worker is not None:
                loop.worker.leave_unended(opts.worker_timeout)
            return None
        outcome = _outcome(status, task.pid, started, began, counts, loop)
        if loop.worker is not None:
            loop.worker.finish(outcome, opts.worker_timeout, warn)
        return outcome
    finally:
        Forwarder.restore(previous, old_wakeup)
        _close_all((wake_r, wake_w, *masters))
