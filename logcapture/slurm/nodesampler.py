"""The node sampler: runs as root on every node of a job whose user has ``~/.logoptin``
(root checks it), started by the prolog (``start_node_sampler``: ``logcapture slurm sampler``,
detached, with its pid file ``.samplers/<job id>.pid``) and stopped by the epilog
(``stop_node_sampler``: TERM, verified to be ours, last sample, bounded wait). Its spool is
root's: ``<spool root>/.samples/<job id>/<run id>/``. While it runs, the wrapper does not
sample the batch node itself (docs/sampling.md).
"""

from __future__ import annotations

import os
import sys

from .jobrecords import (
    SAMPLERS_DIR,
    SAMPLES_DIR,
    _open_root,
    _open_root_subdir,
    _read_root_file,
    _remove_job,
    _run_dirs,
    _spool_root,
    _write_job_record,
    _write_root_file,
)
from .jobs import JobInfo, run_id_for
from .rootsafe import _list_dir

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms of CPU
if TYPE_CHECKING:
    from collections.abc import Callable

SAMPLER_STOP_WAIT = 10.0  # seconds the epilog waits for a node sampler to end after TERM


def _proc_start_time(pid: int, proc_root: str = "/proc") -> tuple[int, str] | None:
    """(start time in clock ticks since boot, state letter) of a process, or None."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return int(fields[19]), fields[0].decode()
    except (IndexError, ValueError):
        return None


def _parse_pidfile(data: bytes | None) -> tuple[int, int] | None:
    if not data:
        return None
    parts = data.split()
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def _sampler_alive(pid: int, start: int, job_id: str, proc_root: str = "/proc") -> bool:
    """Whether ``pid`` is still the node sampler of ``job_id`` that the prolog started: same
    start time (a recycled pid has another), not a zombie, root's, and its command line says
    ``slurm sampler --job <job id>``."""
    info = _proc_start_time(pid, proc_root)
    if info is None or info[0] != start or info[1] in ("Z", "X"):
        return False
    try:
        if os.stat(f"{proc_root}/{pid}").st_uid != 0:
            return False
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            argv = f.read(4096).split(b"\0")
    except OSError:
        return False
    return b"sampler" in argv and job_id.encode() in argv


def node_sampler_running(root: str, job_id: str, proc_root: str = "/proc") -> bool:
    """Whether the prolog started a node sampler for ``job_id`` on this node and it runs
    (read by the job wrapper, as the user: the pid file is public, 0644)."""
    import stat

    if not job_id.isdigit():
        return False
    path = os.path.join(root, SAMPLERS_DIR, f"{job_id}.pid")
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_size > 256:
            return False
        with open(path, "rb") as f:
            parsed = _parse_pidfile(f.read(256))
    except OSError:
        return False
    return parsed is not None and _sampler_alive(*parsed, job_id, proc_root)


def start_node_sampler(root_fd: int, job: JobInfo, env: dict[str, str] | os._Environ[str],
                       record: dict[str, object], argv0: list[str] | None = None) -> str:
    """Start ``logcapture slurm sampler --job <id>`` detached (its own session, no inherited
    descriptors: neither slurmd nor the prolog script waits for it) and write its pid file
    ``.samplers/<job id>.pid`` ("pid start-time"). Also leaves a copy of the trusted job
    record in ``.samples/.jobs/`` for the agent, which ships ``.samples``. Returns a message."""
    import subprocess

    sfd = _open_root_subdir(root_fd, SAMPLES_DIR, 0o700)
    try:
        _write_job_record(sfd, job.job_id, record)
    finally:
        os.close(sfd)
    pfd = _open_root_subdir(root_fd, SAMPLERS_DIR, 0o755)
    try:
        old = _parse_pidfile(_read_root_file(pfd, f"{job.job_id}.pid", 256))
        if old is not None and _sampler_alive(*old, job.job_id):
            return f"node sampler already running (pid {old[0]})"
        cmd = (argv0 or [sys.executable, "-I", "-m", "logcapture"]) + [
            "slurm", "sampler", "--job", job.job_id]
        proc = subprocess.Popen(cmd, env=dict(env), cwd="/", stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                close_fds=True, start_new_session=True)
        info = _proc_start_time(proc.pid)
        proc.returncode = 0  # not ours to wait for: init reaps it once the prolog is gone
        if info is None:
            return "node sampler exited at once"
        _write_root_file(pfd, f"{job.job_id}.pid", f"{proc.pid} {info[0]}\n".encode(), 0o644)
    finally:
        os.close(pfd)
    return f"node sampler started (pid {proc.pid})"


def stop_node_sampler(root_fd: int, job_id: str, wait: float = SAMPLER_STOP_WAIT,
                      proc_root: str = "/proc") -> list[str]:
    """TERM the node sampler of ``job_id`` named by its pid file, if it is still ours, and wait
    (at most ``wait`` seconds, then KILL) while it takes its last sample and closes its spool.
    Removes the pid file. Returns messages."""
    import signal
    import time

    try:
        pfd = os.open(SAMPLERS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=root_fd)
    except OSError:
        return []
    messages: list[str] = []
    try:
        parsed = _parse_pidfile(_read_root_file(pfd, f"{job_id}.pid", 256))
        if parsed is not None and _sampler_alive(*parsed, job_id, proc_root):
            pid, start = parsed
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
            deadline = time.monotonic() + wait
            while _sampler_alive(pid, start, job_id, proc_root):
                if time.monotonic() > deadline:
                    messages.append(f"node sampler (pid {pid}) did not stop within "
                                    f"{wait:.0f}s: killed")
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                    break
                time.sleep(0.02)
        try:
            os.unlink(f"{job_id}.pid", dir_fd=pfd)
        except FileNotFoundError:
            pass
    finally:
        os.close(pfd)
    return messages


def _sample_runs(root_fd: int, job_id: str, het_job_id: str = "") -> list[str]:
    """The node sampler's run directories of a job (root's own: ``.samples/<job id>/``),
    named after the job's run, or, in a heterogeneous job's later component, the first
    component's (``het_job_id``)."""
    try:
        fd = os.open(f"{SAMPLES_DIR}/{job_id}",
                     os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError:
        return []
    try:
        return _run_dirs(_list_dir(fd), het_job_id or job_id)
    finally:
        os.close(fd)


def _remove_samples(root_fd: int, job_id: str) -> None:
    """Remove the job's samples and their record copy: ``.samples`` has the spool root's
    layout, so this is ``_remove_job`` one level down."""
    try:
        sfd = os.open(SAMPLES_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=root_fd)
    except OSError:
        return
    try:
        _remove_job(sfd, job_id)
    finally:
        os.close(sfd)


def node_sampler(env: dict[str, str] | os._Environ[str], job_arg: str, *,
                 stop: object = None, cgroup_root: str = "/sys/fs/cgroup",
                 proc_root: str = "/proc", nvml: object = None,
                 idle_limit: float = 600.0) -> int:
    """The node sampler daemon (``logcapture slurm sampler --job ID``, root): samples the
    job's cgroup (or, without one, its processes) and GPUs on this node every
    ``sample_interval`` seconds into ``.samples/<job id>/<run id>/`` until TERM (the epilog),
    the job's cgroup disappears, or, without a cgroup, no process of the job has been seen for
    ``idle_limit`` seconds. A last sample is taken on the way out."""
    import signal
    import socket
    import threading
    import time
    from pathlib import Path

    from ..config.admin import load_admin
    from ..errors import ConfigError, UsageError
    from ..sampling.gpu import GpuCollector, job_gpus_from_env
    from ..sampling.job import cpus_allocated_from_env
    from ..sampling.node import NodeJobCollector
    from ..sampling.sampler import Sampler, sample_interval
    from ..spool.layout import create_run_dir
    from ..spool.writer import SpoolWriter

    event = stop if isinstance(stop, threading.Event) else threading.Event()
    if threading.current_thread() is threading.main_thread():
        # At once: an epilog may come right after the prolog (a job that fails at start).
        signal.signal(signal.SIGTERM, lambda *_: event.set())
        signal.signal(signal.SIGINT, lambda *_: event.set())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    job = JobInfo(env)
    if job_arg != job.job_id:
        raise UsageError(f"--job {job_arg} is not SLURM_JOB_ID ({job.job_id})")
    admin = load_admin(env=env)
    try:
        interval = sample_interval(env, admin.sample_interval)
    except ConfigError:
        interval = admin.sample_interval
    root = _spool_root(admin)
    root_fd = _open_root(root, create=False)
    try:
        os.close(_open_root_subdir(root_fd, SAMPLES_DIR, 0o700))
    finally:
        os.close(root_fd)
    # the job's run; a heterogeneous job's later component's samples join the first's
    run = run_id_for({"SLURM_JOB_ID": job.het_job_id or job.job_id,
                      "SLURM_RESTART_COUNT": job.restart_count})
    assert run is not None
    run_dir = create_run_dir(Path(root) / SAMPLES_DIR / job.job_id, run)
    log = _syslog_warner(job.job_id)
    spool = SpoolWriter(run_dir, warn=log)
    collector = NodeJobCollector(job.job_id, job.uid, cgroup_root=cgroup_root,
                                 proc_root=proc_root,
                                 cpus_allocated=cpus_allocated_from_env(env),
                                 exclude_pids={os.getpid()})
    gpu = GpuCollector(nvml=nvml, job_gpus=job_gpus_from_env(env), pids_fn=collector.pids)
    node = (job.node or socket.gethostname()).split(".")[0]
    sampler = Sampler(run, node=node, gpu=gpu, job=collector, interval=interval,
                      emit=lambda rec: spool.write([rec]), warn=log)
    poll = min(0.5, interval)
    seen = time.monotonic()
    try:
        sampler.start()
        while not event.wait(poll):
            collector.poll_cpu()
            if collector.ended:
                break
            if collector.cgroup_path is None:
                if collector.pids():
                    seen = time.monotonic()
                elif time.monotonic() - seen > idle_limit:
                    log(f"no process of job {job.job_id} for {idle_limit:.0f}s: stopping")
                    break
    finally:
        sampler.stop()
        spool.close()
    return 0


def _syslog_warner(job_id: str) -> Callable[[str], None]:
    def warn(message: str) -> None:
        try:
            import syslog

            syslog.openlog("logcapture-sampler", 0, syslog.LOG_DAEMON)
            syslog.syslog(syslog.LOG_WARNING, f"job {job_id}: {message}")
        except Exception:  # noqa: BLE001 - nowhere else to report
            pass
    return warn


def sampler_main(job_arg: str) -> int:
    """``logcapture slurm sampler --job ID``: 0 after a clean stop, 1 after a problem (which
    goes to syslog: the daemon has no terminal)."""
    try:
        return node_sampler(os.environ, job_arg)
    except Exception as e:  # noqa: BLE001
        why = getattr(e, "message", "") or type(e).__name__
        _syslog_warner(job_arg)(f"node sampler failed: {why}")
        return 1
