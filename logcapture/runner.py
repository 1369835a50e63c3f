"""Run a command under two pseudo-terminals and pump its bytes; know nothing of content.

Entry point: ``run(argv, sink, options) -> Outcome``.

- stdout and stderr each get their own pty, so both are ttys (``isatty()`` true, colours and
  progress bars as in a shell) and stay separate streams. stdin is passed through untouched
  (the command inherits the caller's stdin, so pipes and interactive terminals both work).
- Output post-processing is switched off on both ptys (no ``\\n`` -> ``\\r\\n``), so what is
  copied to the real stdout/stderr is byte-identical to what the command wrote (SPEC.md §3).
- The window size is the caller's terminal's, else ``LOGCAPTURE_COLUMNS`` x ``LOGCAPTURE_LINES``,
  else 80 x 24 (a pty left at 0 x 0 makes tqdm print nothing: PTY-RENDER.md). SIGWINCH on the
  wrapper re-reads the caller's size and applies it to both ptys.
- The command runs in its own session and process group, without a controlling terminal, as
  a batch job has none: a background process it leaves behind is not sent SIGHUP when it
  exits, and reading an interactive stdin never stops it with SIGTTIN. TERM,
  INT, HUP, QUIT, USR1, USR2, CONT, TSTP, ALRM and WINCH received by the wrapper are forwarded
  to the command's process group: Slurm's proctrack/cgroup signals only the step's first
  process, the wrapper (SLURM-DEV.md). A repeated TERM is forwarded again; the wrapper itself
  exits only after the command, with its status.
- Every chunk read is first copied to the real output, then handed to ``sink.feed``. A sink
  that raises is disabled with one ``logcapture:`` warning; the command and its output go on.
- After the command exits the ptys are drained until every writer has closed them (EIO), or
  they have been quiet for ``drain_idle`` seconds, or ``drain_timeout`` seconds have passed: a
  background grandchild that holds the pty open cannot hang the wrapper.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .records import STDERR, STDOUT

FORWARDED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGCONT, signal.SIGTSTP, signal.SIGALRM,
)
READ_SIZE = 65536
DEFAULT_COLUMNS = 80
DEFAULT_LINES = 24
TICK = 0.2  # seconds between sink.tick() calls while the command is quiet


class Sink(Protocol):
    def feed(self, stream: str, data: bytes, now: float) -> None: ...
    def tick(self, now: float) -> None: ...


@dataclass
class Options:
    env: dict[str, str] | None = None
    stdin_fd: int = 0
    stdout_fd: int = 1
    stderr_fd: int = 2
    winsize: tuple[int, int] | None = None  # (rows, columns); None: from the caller
    drain_idle: float = 0.5
    drain_timeout: float = 5.0
    warn: Callable[[str], None] | None = None
    on_start: Callable[[int], None] | None = None  # called with the child's pid


@dataclass
class Outcome:
    exit_status: int | None  # 0-255 when the command exited
    signal: int | None  # N when the command was killed by signal N
    pid: int
    started: float
    ended: float
    bytes: dict[str, int] = field(default_factory=dict)
    spawn_error: str = ""  # the command could not be started (exit_status 126 or 127)

    @property
    def duration(self) -> float:
        return self.ended - self.started

    @property
    def state(self) -> str:
        if self.signal is not None:
            return "SIGNALED"
        return "COMPLETED" if self.exit_status == 0 else "FAILED"


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


def _open_pty(rows: int, cols: int) -> tuple[int, int]:
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # oflag: no output processing, bytes pass as written
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    set_winsize(slave, rows, cols)
    os.set_inheritable(slave, False)
    os.set_blocking(master, False)
    return master, slave


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]


def run(argv: Sequence[str], sink: Sink | None, options: Options | None = None) -> Outcome:
    opts = options or Options()
    warn = opts.warn or (lambda msg: None)
    rows, cols = opts.winsize or caller_winsize()
    out_m, out_s = _open_pty(rows, cols)
    err_m, err_s = _open_pty(rows, cols)
    masters = {out_m: STDOUT, err_m: STDERR}
    real = {STDOUT: opts.stdout_fd, STDERR: opts.stderr_fd}
    counts = {STDOUT: 0, STDERR: 0}

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    child: subprocess.Popen[bytes] | None = None
    previous: dict[int, object] = {}

    def forward(signum: int, frame: object) -> None:
        if signum == signal.SIGWINCH:
            try:
                r, c = caller_winsize()
                set_winsize(out_m, r, c)
                set_winsize(err_m, r, c)
            except OSError:
                pass
            return
        if child is not None and child.returncode is None:
            try:
                os.killpg(child.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    # Handlers go in before the child exists, so a signal arriving during spawn is not lost
    # to the default action (which would kill the wrapper and hang up the job's pty).
    for sig in (*FORWARDED_SIGNALS, signal.SIGWINCH):
        previous[sig] = signal.signal(sig, forward)
    previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda s, f: None)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    started = time.time()
    try:
        try:
            child = subprocess.Popen(
                list(argv), stdin=opts.stdin_fd, stdout=out_s, stderr=err_s,
                env=opts.env, start_new_session=True, restore_signals=True, close_fds=True)
        except OSError as e:
            for fd in (out_m, out_s, err_m, err_s):
                os.close(fd)
            code = 127 if isinstance(e, (FileNotFoundError, NotADirectoryError)) else 126
            what = "command not found" if code == 127 else (e.strerror or str(e))
            return Outcome(code, None, 0, started, time.time(), counts,
                           spawn_error=f"{argv[0]}: {what}")
        os.close(out_s)
        os.close(err_s)
        if opts.on_start:
            opts.on_start(child.pid)

        def deliver(stream: str, data: bytes, now: float) -> None:
            nonlocal sink
            counts[stream] += len(data)
            if stream not in broken:
                try:
                    _write_all(real[stream], data)
                except OSError as e:
                    # The reader of our own stdout/stderr went away (EPIPE) or the output file
                    # failed: stop copying that stream but keep capturing and keep the job
                    # running.
                    broken.add(stream)
                    warn(f"cannot copy the command's {stream} to its output: {e.strerror}")
            if sink is not None:
                try:
                    sink.feed(stream, data, now)
                except Exception as e:  # noqa: BLE001 - never break the job
                    # Type name only: the message may quote job text a mode has dropped.
                    warn(f"capture stopped after an internal error ({type(e).__name__});"
                         " the command goes on and its output still reaches its files")
                    sink = None

        def tick(now: float) -> None:
            nonlocal sink
            if sink is not None:
                try:
                    sink.tick(now)
                except Exception as e:  # noqa: BLE001
                    warn(f"capture stopped after an internal error ({type(e).__name__})")
                    sink = None

        broken: set[str] = set()
        open_fds = set(masters)
        exited_at: float | None = None
        last_data = time.monotonic()
        last_tick = last_data
        while open_fds:
            now_m = time.monotonic()
            if exited_at is None and child.poll() is not None:
                exited_at = now_m
                last_data = now_m  # the drain's idle clock starts at the exit
            if exited_at is not None:
                if now_m - last_data >= opts.drain_idle or now_m - exited_at >= opts.drain_timeout:
                    break
            try:
                ready, _, _ = select.select([*open_fds, wake_r], [], [], TICK)
            except InterruptedError:
                continue
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            now = time.time()
            got = False
            for fd in ready:
                if fd == wake_r:
                    continue
                try:
                    data = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError as e:
                    if e.errno != errno.EIO:
                        warn(f"reading the command's {masters[fd]} failed: {e.strerror}")
                    data = b""
                if not data:  # EIO: every writer has closed the pty
                    open_fds.discard(fd)
                    continue
                got = True
                deliver(masters[fd], data, now)
            now_m = time.monotonic()
            if got:
                last_data = now_m
            if now_m - last_tick >= TICK:
                last_tick = now_m
                tick(now)
        status = child.wait()
        ended = time.time()
        return Outcome(status if status >= 0 else None, -status if status < 0 else None,
                       child.pid, started, ended, counts)
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        for fd in (wake_r, wake_w, *masters):
            try:
                os.close(fd)
            except OSError:
                pass


def exit_like(outcome: Outcome) -> int:
    """End the calling process the way the command ended: re-raise its signal, or return the
    exit status for ``sys.exit``. Stop/continue signals are not terminal and are not re-raised.
    A core-dumping signal is re-raised with RLIMIT_CORE 0, so the wrapper leaves no core file
    of its own (the command's core, if any, was already written by the command)."""
    if outcome.signal is None:
        return outcome.exit_status if outcome.exit_status is not None else 1
    sig = outcome.signal
    try:
        import resource
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
