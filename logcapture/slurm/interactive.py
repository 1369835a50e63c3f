"""An interactive step (``srun --pty``, and the interactive step of ``salloc``) captured as a
run of its job, for a user whose ``.logoptin`` says ``interactive: true``.

slurmstepd gives the task of an ``srun --pty`` step a pty of its own (the outer terminal:
its master is copied to srun over ``SLURM_PTY_PORT``) as stdin, stdout, stderr and
controlling terminal. The SPANK plugin (``slurm/spank/logcapture_task.c``,
``interactive_task``) starts ``logcapture slurm task`` as for any task, after a cheap look
that ``.logoptin`` exists, and sends it the plugstack.conf ``spool_root=`` first
(``S<path>\\n``). Here (``interactive_task``):

1. ``interactive: true`` or nothing: a user who did not ask is told ``n`` and the task runs
   on slurmstepd's pty as without logcapture;
2. the run is prepared in the job's spool directory (the prolog made it) as a task run:
   ``<job run>.<step>.<rank>``;
3. the inner pty (``runner.relay.open_inner``: the outer's termios and window size) is made
   and its slave sent to the plugin (``i`` + SCM_RIGHTS), which gives up the outer terminal
   (TIOCNOTTY), makes the slave the task's controlling terminal (TIOCSCTTY) and its fds 0, 1
   and 2, and answers ``Y`` (or ``N``: then nothing changed for the task);
4. this process takes the outer terminal as its own controlling terminal (window-size changes
   come as SIGWINCH; polled when that fails), puts it in raw mode and relays
   (``runner.relay.Relay``) until the task has ended, then restores the outer's termios.

The task's exit status comes from the plugin's ``slurm_spank_task_exit``, as for other tasks.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: this package imports only os and sys up front
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

HELLO_WAIT = 10.0  # seconds for the plugin's first message (it sends it at once)
ANSWER_WAIT = 10.0  # seconds for the plugin's answer once the slave was sent
PTY_VAR = "SLURM_PTY_PORT"  # srun --pty: slurmstepd relays the task's pty to srun


def is_interactive(env: dict[str, str] | os._Environ[str], fd: int = 1) -> bool:
    """A task of an ``srun --pty`` step: ``SLURM_PTY_PORT`` and a terminal on stdout, the
    plugin's own test (a terminal without it is slurmstepd's for ``srun -u``)."""
    return bool(env.get(PTY_VAR)) and os.isatty(fd)


def task_capture(env: dict[str, str] | os._Environ[str], fd: int = 1) -> Callable[..., int]:
    """The capture of this task, for both ways ``logcapture slurm task`` starts (the fast
    path in ``entry.main`` and click's ``cli.slurm_commands.slurm_task``):
    ``interactive_main`` in a task of an ``srun --pty`` step, else ``slurm.task.task_main``."""
    if is_interactive(env, fd):
        return interactive_main
    from .task import task_main

    return task_main


def _receive(plugin: socket.socket, timeout: float, limit: int = 4096) -> bytes:
    """One message of the plugin's, up to its newline (or one byte when it is an answer)."""
    plugin.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        got = plugin.recv(limit - len(data))
        if not got:
            break
        data += got
        if data[:1] in (b"Y", b"N"):
            break
    return data


def asked(env: dict[str, str]) -> bool:
    """Whether the user's ``.logoptin`` asks for interactive steps (``interactive: true``); a
    broken file does not (its problems are the batch jobs' to report)."""
    from ..config.optin import load_optin, optin_path

    result = load_optin(optin_path(env))
    return result.ok and bool(result.config.interactive)


def job_spool(env: dict[str, str], spool_root: str) -> Path | None:
    """The job's spool directory under the system spool root (the plugin's ``spool_root=``,
    else ``$LOGCAPTURE_SPOOL_ROOT``, else the default), when it is a directory of this
    user's (``slurm.task.own_directory``), as the prolog makes it; else None."""
    from ..spool.layout import default_root
    from .task import own_directory

    root = default_root(env, process="slurm", configured=spool_root or None)
    job_dir = root / env.get("SLURM_JOB_ID", "-")
    return job_dir if own_directory(job_dir) else None


def outer_terminal() -> int:
    """A descriptor of the task's terminal that can be read and written: this process's
    stdout or stderr (the task's, a pty slave slurmstepd opened read-write)."""
    import fcntl

    for fd in (1, 2):
        try:
            if os.isatty(fd) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR:
                return os.dup(fd)
        except OSError:
            continue
    return os.open(os.ttyname(1), os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)


def interactive_main(sock_fd: int, step: str, task_id: str, local_rank: str, task_pid: int,
                     command: list[str], job: str = "") -> int:
    """``logcapture slurm task`` in a task of an interactive step (``is_interactive``): 0
    always, after one ``logcapture:`` warning on the terminal when it could not capture.
    ``task_id`` and ``job``: the plugin's, as ``slurm.task.task_main`` takes them."""
    import signal
    import socket

    from ..errors import Warner
    from ..runner.signals import FORWARDED_SIGNALS

    for sig in FORWARDED_SIGNALS:  # as slurm.task.task_main: the task decides, not a signal
        signal.signal(sig, signal.SIG_IGN)
    warn = Warner()
    plugin = socket.socket(fileno=sock_fd)
    try:
        interactive_task(plugin, step, task_id, local_rank, task_pid, command,
                         dict(os.environ), warn, job)
    except Exception as e:  # noqa: BLE001 - a task is never failed by logcapture
        warn(f"interactive step {step}: capture stopped ({type(e).__name__}); the shell "
             "runs normally")
    finally:
        plugin.close()
    return 0


def interactive_task(plugin: socket.socket, step: str, task_id: str, local_rank: str,
                     task_pid: int, command: list[str], env: dict[str, str],
                     warn: Callable[[str], None], job: str = "") -> None:
    """Capture the task of an interactive step (the module docstring). Until the plugin
    answers ``Y`` any failure leaves the task on its own terminal (the caller warns once)."""
    import socket
    import termios

    from ..capture import prepare
    from ..runner.outcome import Options
    from ..runner.relay import Relay, open_inner, raw_attrs, relay_plain, set_controlling
    from ..runner.spawn import Attached, attach
    from .jobrecords import PUBLIC_CONFIG
    from .jobs import run_id_for
    from .task import (
        STATUS_WAIT,
        StatusListener,
        global_rank,
        status_address,
        task_identity,
        task_run_id,
    )

    rank = global_rank(env, task_id)  # SLURM_PROCID, as for any task
    hello = _receive(plugin, HELLO_WAIT)
    if not hello.startswith(b"S") or not hello.endswith(b"\n"):
        return  # not the plugin's: leave the task alone
    if not asked(env):
        plugin.sendall(b"n")
        return
    spool = job_spool(env, os.fsdecode(hello[1:-1]))
    job_run = run_id_for(env)
    if spool is None or job_run is None:
        warn(f"interactive step {step} not captured: no spool directory of the job (did the "
             "logcapture prolog run?); the shell runs normally")
        plugin.sendall(b"n")
        return
    # The admin config is root-only; the prolog leaves its public part beside the spool.
    env = {**env, "LOGCAPTURE_CONFIG": str(spool.parent / PUBLIC_CONFIG)}
    outer = outer_terminal()
    saved = termios.tcgetattr(outer)
    prepared = prepare(command or ["?"], spool_root=spool,
                       run_id=task_run_id(job_run, step, rank), warn=warn, env=env,
                       slurm={**task_identity(env, step, rank, local_rank, job),
                              "interactive": "1"},
                       sample=False, gpus=False, merge=True)
    if prepared.worker is None:
        plugin.sendall(b"n")  # prepare warned
        return
    task = Attached(task_pid)
    listener: StatusListener | None = None
    master = slave = -1
    try:
        listener = StatusListener(
            status_address(job or env["SLURM_JOB_ID"], step, task_id), task)
        master, slave = open_inner(outer)
        socket.send_fds(plugin, [b"i"], [slave])
        os.close(slave)
        answer = _receive(plugin, ANSWER_WAIT)
    except Exception:
        answer = b""
        if slave >= 0:
            try:
                os.close(slave)
            except OSError:
                pass
        _give_up(prepared, master, listener)
        raise
    if answer[:1] != b"Y":  # the plugin could not switch terminals: nothing changed
        _give_up(prepared, master, listener)
        warn(f"interactive step {step} not captured: the task's terminal could not be "
             "switched; the shell runs normally")
        return
    assert listener is not None
    plugin.close()
    relay = Relay(outer, master, task_pid)
    # The program's terminal stays open whatever happens to the capture (attach closes its
    # masters at its end): a failure below falls back to copying without capture.
    kept = os.dup(master)
    try:
        # Raw first: from here on a ^C typed is a byte for the program's terminal, never a
        # signal for this process's group.
        termios.tcsetattr(outer, termios.TCSANOW, raw_attrs(saved))
        if not set_controlling(outer):
            relay.watch_winsize()
        listener.start()
        try:
            # (the terminal is raw meanwhile: a warning ends its line with "\r\n" itself)
            attach({master: "stdout"}, task, prepared.worker,
                   Options(env=prepared.env, warn=lambda m: warn(m + "\r"), merge=True,
                           stdout_fd=outer, stderr_fd=outer, beside=relay),
                   status_timeout=STATUS_WAIT)
        except Exception as e:  # noqa: BLE001 - the shell keeps its terminal
            warn(f"interactive step {step}: capture stopped ({type(e).__name__}); the shell "
                 "goes on uncaptured\r")
            relay.stop()
            relay_plain(outer, kept, bytes(relay.pending))
        finally:
            listener.done()
    finally:
        relay.stop()
        os.close(kept)
        try:
            termios.tcsetattr(outer, termios.TCSANOW, saved)
        except (OSError, termios.error):
            pass


def _give_up(prepared: Any, master: int, listener: Any) -> None:
    """Undo a preparation the task never used: no run left behind."""
    from ..capture import remove_if_empty

    if master >= 0:
        os.close(master)
    if listener is not None:
        listener.sock.close()
    prepared.worker.give_up()
    if prepared.run_dir is not None:
        remove_if_empty(prepared.run_dir)
