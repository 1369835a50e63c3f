"""One task of a job step, captured as a run of its job (``logcapture slurm task``).

The SPANK plugin (``slurm/spank/logcapture_task.c``) starts this in every task of every
``srun`` step of a job whose wrapper exported ``LOGCAPTURE_TASKS`` (the user opted in), just
before the task execs the step's program: detached from the task, with the task's own stdout
and stderr as its stdout and stderr and a unix socket to the plugin as ``--socket``. Here:

1. the capture is prepared as for the batch script (``capture.prepare``: config, opt-in
   mode, the run's spool directory ``<job spool>/<run id>``, the capture worker), with the
   task's node, step, rank (``SLURM_PROCID``) and local rank in the Start record's ``slurm``;
2. the task's pty (or two, when its stdout and stderr go to different places) is opened here
   and the slave end(s) sent to the plugin (SCM_RIGHTS), which puts them on the task's fds 1
   and 2; nothing sent means the task runs uncaptured;
3. an abstract unix socket named after the job, step and rank waits for the plugin's
   ``slurm_spank_task_exit`` (slurmstepd, root) to say the task's wait status, and is
   answered once the run's end record is written: slurmstepd kills what is left of a step
   once its tasks have exited;
4. ``runner.spawn.attach`` copies every byte to the task's original outputs and hands it to the
   worker, as ``runner.spawn.run`` does for a command it spawned.

The task is slurmstepd's child, never this process's: its exit status, its signals and
``scancel`` are Slurm's as without logcapture. Signals that reach this process (a step's
TERM) are ignored: the pty's end decides when capture ends.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: this package imports only os and sys up front
if TYPE_CHECKING:
    import socket
    from pathlib import Path

TASKS_VAR = "LOGCAPTURE_TASKS"  # the job wrapper's word to the plugin: capture the tasks
STATUS_WAIT = 5.0  # seconds the status may come after the pty has closed


def status_address(job: str, step: str, rank: str) -> bytes:
    """The abstract socket name (unix(7)) of one task's capture process; the plugin's
    ``task_address`` makes the same."""
    return f"\0logcapture/task/{job}.{step}.{rank}".encode()


def task_run_id(job_run: str, step: str, rank: str) -> str:
    """The run id of a task: its job's run id (``J``, ``J.N`` after a requeue), its step and
    its rank (``jobref`` reads runs with a ``rank`` as task runs)."""
    return f"{job_run}.{step}.{rank}"


def task_identity(env: dict[str, str], step: str, rank: str, local_rank: str,
                  component: str = "") -> dict[str, str]:
    """The Start record's ``slurm`` of a task: the job's, with this task's step, rank and
    local rank (``global_rank``, the plugin's local rank), ``step_tasks``, how many tasks its
    step has (``SLURM_STEP_NUM_TASKS``, which srun sets for each task: a step's section title
    names it, ``rankview.step_title``), the GPUs it sees (``cuda_visible_devices``, which
    Slurm sets per task when its step has GPUs: ``show JOB`` gives each rank's) and, in a
    heterogeneous job, its component (``het_group``, see ``het_group``)."""
    from ..capture import slurm_identity

    count = env.get("SLURM_STEP_NUM_TASKS", "")
    gpus = env.get("CUDA_VISIBLE_DEVICES", "")
    ident = {**slurm_identity(env), "step": step, "rank": rank, "local_rank": local_rank,
             **({"step_tasks": count} if count.isdigit() else {}),
             **({"cuda_visible_devices": gpus} if gpus else {})}
    group = het_group(env, component)
    if group is not None:
        ident["het_group"] = group
    return ident


def global_rank(env: dict[str, str], task: str) -> str:
    """The task's rank in its step, as the program sees it (``SLURM_PROCID``). The plugin's
    task id (S_TASK_GLOBAL_ID) is the same, except in a step of a heterogeneous job
    (``srun --het-group=0,1``): there it counts from 0 in each component, while
    ``SLURM_PROCID`` adds the component's task offset, so the ranks of the step are distinct.
    ``env`` is the task's environment as slurmstepd made it for the plugin (S_JOB_ENV, after
    Slurm set ``SLURM_PROCID``), not one the job chose."""
    procid = env.get("SLURM_PROCID", "")
    return procid if procid.isdigit() else task


def het_group(env: dict[str, str], component: str) -> str | None:
    """The component (``--het-group`` index) of a heterogeneous job whose job id is
    ``component`` (the plugin's S_JOB_ID: each component is a job of its own, while
    ``SLURM_JOB_ID`` is the first's), from ``SLURM_JOB_ID_HET_GROUP_<N>``; None outside one."""
    if not component or not env.get("SLURM_HET_SIZE"):
        return None
    prefix = "SLURM_JOB_ID_HET_GROUP_"
    for key, value in env.items():
        if key.startswith(prefix) and value == component and key[len(prefix):].isdigit():
            return key[len(prefix):]
    return None


def own_directory(path: str | Path) -> bool:
    """Whether ``path`` is a directory (not a link to one) of this process's user: the rule
    for a job's spool directory, which the prolog makes for the job's user on every node."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def job_spool(env: dict[str, str], component: str = "") -> Path | None:
    """The job's spool directory the wrapper exported, when it is a directory of this user's
    (``own_directory``); else None. A task of a heterogeneous job's later component
    (``component``, the plugin's S_JOB_ID, is not ``SLURM_JOB_ID``) goes into the directory
    the prolog made for that component, beside the first's: each component is a job of its
    own to Slurm, so a node that runs only component 1 has ``<spool_root>/J+1`` and no
    ``<spool_root>/J``. Its runs keep the job's name (``J.S.R``); readers find them by it."""
    from pathlib import Path

    value = env.get(TASKS_VAR, "")
    if not value.startswith("/"):
        return None
    if component.isdigit() and component != env.get("SLURM_JOB_ID") \
            and own_directory(os.path.join(os.path.dirname(value), component)):
        return Path(os.path.dirname(value), component)
    return Path(value) if own_directory(value) else None


class StatusListener:
    """The abstract socket the plugin's ``slurm_spank_task_exit`` connects to: it says the
    task's wait status, which goes to ``task.set_status``; ``done`` answers it."""

    def __init__(self, address: bytes, task: object):
        import socket
        import threading

        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.bind(address)
        self.sock.listen(4)
        self.task = task
        self.conn: socket.socket | None = None
        self.held = -1  # the plugin's connection once answered, open until this process exits
        self.thread = threading.Thread(target=self._serve, name="task-status", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if peer_uid(conn) != 0:  # slurmstepd runs as root; nobody else tells a status
                conn.close()
                continue
            data = b""
            try:
                conn.settimeout(5.0)
                while not data.endswith(b"\n") and len(data) < 32:
                    got = conn.recv(32)
                    if not got:
                        break
                    data += got
            except OSError:
                conn.close()
                continue
            try:
                status = int(data.strip())
            except ValueError:
                conn.close()
                continue
            self.conn = conn
            self.task.set_status(status)  # type: ignore[attr-defined]
            return

    def done(self) -> None:
        """The run is written: let slurmstepd go on (an answer, then end of file when this
        process exits: the connection is left open until then, so that the plugin returns
        only once no process of the capture is left in the step)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.sendall(b"done\n")
            except OSError:
                conn.close()
            else:
                self.held = conn.detach()  # the kernel closes it as the process exits
        self.sock.close()


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (SO_PEERCRED); -1 unknown."""
    import socket
    import struct

    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return -1
    return int(struct.unpack("3i", creds)[1])


def _hand_over_ptys(plugin: socket.socket, winsize: tuple[int, int] | None, merge: bool
                    ) -> dict[int, str]:
    """Open the task's pty(s) and send the slave end(s) to the plugin; {master fd: stream}."""
    import socket

    from ..runner.terminal import caller_winsize, open_terminals

    rows, cols = winsize or caller_winsize()
    out_m, out_s, err_m, err_s = open_terminals(rows, cols, merge)
    try:
        socket.send_fds(plugin, [b"p"], [out_s] if merge else [out_s, err_s])
    except OSError:
        for fd in {out_m, out_s, err_m, err_s}:
            os.close(fd)
        raise
    for fd in {out_s, err_s}:
        os.close(fd)
    plugin.close()
    return {out_m: "stdout"} if merge else {out_m: "stdout", err_m: "stderr"}


def task_main(sock_fd: int, step: str, task_id: str, local_rank: str, task_pid: int,
              command: list[str], job: str = "") -> int:
    """``logcapture slurm task``: capture one task (the module docstring); 0 always, after
    one ``logcapture:`` warning on the task's stderr when it could not. ``task_id`` and
    ``job``: the plugin's S_TASK_GLOBAL_ID and S_JOB_ID, which name the status socket
    (``status_address``; ``job`` defaults to ``SLURM_JOB_ID``, the same outside a
    heterogeneous job); the run is named after the task's rank (``global_rank``)."""
    import signal
    import socket

    from ..capture import prepare, remove_if_empty
    from ..errors import Warner
    from ..runner.descriptors import same_destination
    from ..runner.outcome import Options
    from ..runner.signals import FORWARDED_SIGNALS
    from ..runner.spawn import Attached, attach
    from .jobs import run_id_for

    # From the start, not only in runner.spawn.attach: a step's TERM (scancel) reaching this
    # process after the task got its pty would leave the task writing to a closed one.
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    warn = Warner()
    env = dict(os.environ)
    rank = global_rank(env, task_id)
    plugin = socket.socket(fileno=sock_fd)
    try:
        spool = job_spool(env, job)
        job_run = run_id_for(env)
        if spool is None or job_run is None:
            warn(f"task {rank} of step {step} not captured: no spool directory of the job "
                 f"({TASKS_VAR}); the task runs normally")
            return 0
        task = Attached(task_pid)
        listener = StatusListener(
            status_address(job or env["SLURM_JOB_ID"], step, task_id), task)
        prepared = prepare(command or ["?"], spool_root=spool,
                           run_id=task_run_id(job_run, step, rank), warn=warn, env=env,
                           slurm=task_identity(env, step, rank, local_rank, job), sample=False,
                           gpus=False, merge=same_destination(1, 2))
        if prepared.worker is None:
            return 0  # prepare warned
        try:
            masters = _hand_over_ptys(plugin, prepared.winsize, prepared.merge)
        except Exception:
            prepared.worker.give_up()
            if prepared.run_dir is not None:
                remove_if_empty(prepared.run_dir)
            raise
        listener.start()
        try:
            attach(masters, task, prepared.worker,
                   Options(env=prepared.env, warn=warn, merge=prepared.merge),
                   status_timeout=STATUS_WAIT)
        finally:
            listener.done()
    except Exception as e:  # noqa: BLE001 - a task is never failed by logcapture
        warn(f"task {rank} of step {step}: capture stopped ({type(e).__name__}); the task "
             "runs normally")
    finally:
        try:
            plugin.close()
        except OSError:
            pass
    return 0
