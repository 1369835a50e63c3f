"""What the Slurm job wrapper, prolog and epilog do (SPEC.md §1, issue 5).

Three entry points, one per moment of a job's life:

``job_main`` (the job wrapper, as the user, at job start on the batch node)
    ``slurm/job_submit.lua`` prepends ``#!<wrapper line>`` to every batch script, so the kernel
    runs ``logcapture-job [--spool-root=DIR] SCRIPT ARGS...``. The script's own ``#!`` line is
    now line 2. Without ``~/.logoptin`` the wrapper execs that interpreter at once, exactly as
    the kernel would have (same argv, same environment, no pty, no file) and before importing
    anything but ``os`` and ``sys``: that is the cost a user who did not opt in pays. With
    ``~/.logoptin`` it runs the script under ``capture_command`` (``logcapture run``) into the
    job's spool directory that the prolog made. The decision is taken once, here: creating or
    deleting ``~/.logoptin`` later changes nothing for this job.

``prolog`` (root, every node of the job, before it starts)
    Creates ``<spool root>/<job id>/`` owned by the job's user, mode 0700, and the job record
    ``<spool root>/.jobs/<job id>.json`` (root, 0600): user, uid, job and array ids, partition,
    nodes, start. That record, not anything in the user's directory, is the trusted identity
    of the job's rows. Also refreshes ``<spool root>/.config.yaml``, the admin config without
    its secrets, so jobs (which cannot read the root-only config) get the same spool settings.
    When the job's user has ``~/.logoptin`` (checked as root, ``optin_for_uid``), starts this
    node's resource sampler, ``logcapture slurm sampler`` (``node_sampler``), detached, with
    its pid file ``.samplers/<job id>.pid``: every node of the job is sampled, and the wrapper
    then does not sample the batch node itself (docs/sampling.md).

``epilog`` (root, every node, after the job)
    Stops this node's sampler (TERM, verified to be ours, last sample, bounded wait). Reads the
    job's exit status from the wrapper's own End record (Slurm's epilog sees 0 for a
    cancelled job), asks Slurm for the job's state, writes both into the job record, ships the
    job's runs when a store is configured (else leaves them to the agent), and removes what is
    no longer needed: a job that captured nothing leaves nothing behind.

Spool layout on a Slurm node::

    <spool root>/                 root, 0755 (admin: ``spool_root``, default /var/spool/logcapture)
      .config.yaml                root, 0644: the admin config minus secrets, for jobs
      .jobs/<job id>.json         root, 0600: the trusted job record
      <job id>/                   the job's user, 0700 (made by the prolog)
        <run id>/seg-*.ndjson*    the wrapper's run (run id = job id; ``<job id>.<n>`` after
                                  the n-th requeue)
      .samplers/<job id>.pid      root, 0644: "<pid> <start time>" of this node's sampler
      .samples/                   root, 0700: the node samplers' spool (a spool root itself)
        .jobs/<job id>.json       copy of the trusted record, for the agent (it tails .samples)
        <job id>/<run id>/seg-*   this node's Sample records (stream ``sample:<node>``)

Root never trusts the user's directory (issue 5 §6): everything root opens below
``<job id>/`` is opened relative to a directory descriptor with ``O_NOFOLLOW``, must be a
regular file (or directory) owned by the job's user, is read with a size bound, and its
content never appears in root's messages (which name only paths and numbers).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms of CPU
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from .config import AdminConfig

# Nothing heavier than os and sys at module level: the wrapper execs the job's interpreter
# before it imports anything else (issue 5 §1: no measurable cost without ~/.logoptin).

DEFAULT_SPOOL_ROOT = "/var/spool/logcapture"
JOBS_DIR = ".jobs"
SAMPLES_DIR = ".samples"  # root, 0700: the node samplers' spool, laid out like a spool root
NOTIFIED_DIR = ".notified"  # root, 0700: one marker per message sent (insights.notify)
SAMPLERS_DIR = ".samplers"  # root, 0755: <job id>.pid of each running node sampler (0644)
PUBLIC_CONFIG = ".config.yaml"
SECRET_KEYS = ("store", "notify_webhook")  # admin keys never copied where jobs read
SHEBANG_MAX = 256  # Linux reads at most this many bytes of a "#!" line (BINPRM_BUF_SIZE)
WRAPPER_OPTIONS = ("--spool-root",)

# Bounds for what root reads from a user's directory.
MAX_SEGMENT_BYTES = 64 * 1024 * 1024  # compressed or plain size of the segment with the End
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
MAX_END_LINE_BYTES = 1024 * 1024
MAX_DIR_ENTRIES = 100_000
OPTIN_CHECK_TIMEOUT = 2.0  # seconds the prolog waits for ~/.logoptin (a hung NFS home)
SAMPLER_STOP_WAIT = 10.0  # seconds the epilog waits for a node sampler to end after TERM
SHIP_DEADLINE = 15.0  # seconds the epilog tries the store before leaving runs to the agent
MAX_END_CANDIDATES = 8  # segments tried, newest first, when looking for the End record


# ============================================================================ the job wrapper


def parse_shebang(line: bytes) -> list[str] | None:
    """The interpreter argv of a ``#!`` line, split as Linux does: the interpreter, then
    everything after the following blanks (trailing blanks stripped) as one argument."""
    if not line.startswith(b"#!"):
        return None
    body = line[2:SHEBANG_MAX].split(b"\n", 1)[0].rstrip(b"\r")
    body = body.strip(b" \t")
    if not body:
        return None
    parts = body.replace(b"\t", b" ").split(b" ", 1)
    argv = [os.fsdecode(parts[0])]
    if len(parts) > 1 and parts[1].strip(b" \t"):
        argv.append(os.fsdecode(parts[1].strip(b" \t")))
    return argv


def script_interpreter(script: str) -> list[str]:
    """The interpreter of a wrapped batch script: its second line is its own ``#!`` line.
    A script without one (not a wrapped script, or unreadable) runs under /bin/sh, as
    execvp would run it."""
    try:
        with open(script, "rb") as f:
            head = f.read(2 * SHEBANG_MAX + 2)
    except OSError:
        return ["/bin/sh"]
    lines = head.split(b"\n")
    if len(lines) >= 2:
        argv = parse_shebang(lines[1])
        if argv:
            return argv
    return ["/bin/sh"]


def _wrapper_args(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split the wrapper's own ``--name=value`` options (from the lua's wrapper line) from
    ``SCRIPT ARGS...``."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("--"):
        name, sep, value = args[i].partition("=")
        if name not in WRAPPER_OPTIONS or not sep:
            break
        opts[name[2:]] = value
        i += 1
    return opts, args[i:]


def optin_exists(env: dict[str, str] | os._Environ[str]) -> bool:
    """Whether the user opted in: ``$LOGCAPTURE_OPTIN``, else ``$HOME/.logoptin`` (the passwd
    home without HOME), exists in any form; what it contains is ``load_optin``'s business
    (a symlink or a FIFO opts in, then falls back to the most private mode). A home that
    cannot be searched counts as not opted in."""
    path = env.get("LOGCAPTURE_OPTIN")
    if not path:
        home = env.get("HOME")
        if not home:
            import pwd
            try:
                home = pwd.getpwuid(os.getuid()).pw_dir
            except KeyError:
                return False
        path = os.path.join(home, ".logoptin")
    try:
        os.lstat(path)
    except OSError:
        return False
    return True


def _exec_job(argv: list[str]) -> int:
    """Replace this process with the job's interpreter; only returns after a failed exec,
    with the status a shell gives for it."""
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        msg = f"logcapture-job: {argv[0]}: cannot run the script's interpreter: {e.strerror}\n"
        try:
            os.write(2, msg.encode("utf-8", "replace"))
        except OSError:
            pass
        return 127 if isinstance(e, FileNotFoundError) else 126
    return 126  # not reached


def job_main(argv: list[str] | None = None) -> int:
    """The job wrapper (console script ``logcapture-job``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    opts, rest = _wrapper_args(args)
    if not rest:
        sys.stderr.write("usage: logcapture-job [--spool-root=DIR] SCRIPT [ARGS...]\n"
                         "(the Slurm job wrapper: job_submit.lua puts it on line 1 of batch "
                         "scripts)\n")
        return 2
    script, script_args = rest[0], rest[1:]
    job = [*script_interpreter(script), script, *script_args]
    if not optin_exists(os.environ):
        return _exec_job(job)
    try:
        return _captured(job, opts)
    except Exception as e:  # noqa: BLE001 - logcapture must never change the job's outcome
        try:
            os.write(2, f"logcapture: capture disabled for this job ({type(e).__name__}); "
                        "the job runs normally\n".encode())
        except OSError:
            pass
        return _exec_job(job)


def job_script() -> None:
    """The console script ``logcapture-job``: ``job_main``, then the end without the
    interpreter's teardown (``runner.leave``): the job has ended by then."""
    code = job_main()
    from .runner import leave

    leave(code)


def run_id_for(env: dict[str, str] | os._Environ[str]) -> str | None:
    """The run id of a Slurm job: its job id; ``<job id>.<n>`` for its n-th requeue."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return None
    restarts = env.get("SLURM_RESTART_COUNT", "")
    if restarts.isdigit() and int(restarts) > 0:
        return f"{job_id}.{int(restarts)}"
    return job_id


def _captured(job: list[str], opts: dict[str, str]) -> int:
    from pathlib import Path

    from .capture import capture_command
    from .errors import Warner
    from .spool import default_root

    env = dict(os.environ)
    warn = Warner()
    root = Path(opts.get("spool-root") or env.get("LOGCAPTURE_SPOOL_ROOT")
                or DEFAULT_SPOOL_ROOT)
    run_id = run_id_for(env)
    # The admin config is root-only (it holds the store's credentials); the prolog leaves its
    # public part beside the spool. A missing file means the defaults.
    env["LOGCAPTURE_CONFIG"] = str(root / PUBLIC_CONFIG)
    spool: Path | None = None
    if run_id is not None:
        job_dir = root / env["SLURM_JOB_ID"]
        try:
            st = os.lstat(job_dir)
            import stat
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                spool = job_dir
        except OSError:
            pass
    if spool is None:
        spool = default_root(env)
        warn(f"the job's spool directory under {root} is missing (did the logcapture prolog "
             f"run?); capturing to {spool} instead, which the agent does not ship")
    # The prolog's node sampler samples this node (and every other node of the job): the
    # wrapper samples only when there is none, so no node is sampled twice. The hardware
    # inventory still goes into the Start record.
    sample = not node_sampler_running(str(root), env.get("SLURM_JOB_ID", ""))
    return capture_command(job, spool_root=spool, run_id=run_id, warn=warn, env=env,
                           sample=sample)


# ============================================================================ the node sampler
# Started by the prolog on every node of a job whose user has ~/.logoptin (root checks it),
# stopped by the epilog. Its spool is root's: <spool root>/.samples/<job id>/<run id>/.


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


def optin_for_uid(uid: int, timeout: float = OPTIN_CHECK_TIMEOUT,
                  home: str | None = None) -> bool:
    """The prolog's opt-in rule (docs/admin.md): the job's user has ``~/.logoptin`` (passwd
    home) in any form, checked as root by ``config.load_optin`` (lstat, no symlink followed,
    a bounded read, owned by that user or refused, which still counts as opted in, like the
    wrapper). Waits at most ``timeout`` seconds (a hung home file system or user database
    counts as not opted in); a home root cannot search (NFS root_squash) too."""
    import threading

    result: list[bool] = []

    def check() -> None:
        import pwd

        from .config import load_optin

        try:
            where = home if home is not None else pwd.getpwuid(uid).pw_dir
        except KeyError:
            return
        result.append(load_optin(os.path.join(where, ".logoptin"), uid=uid).opted_in)

    t = threading.Thread(target=check, name="logcapture-optin", daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])


def _open_root_subdir(root_fd: int, name: str, mode: int) -> int:
    """A directory of the spool root that only root writes (made when missing)."""
    import stat

    try:
        os.mkdir(name, mode, dir_fd=root_fd)
    except FileExistsError:
        pass
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 dir_fd=root_fd)
    st = os.fstat(fd)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != mode:
        os.fchown(fd, 0, 0)
        os.fchmod(fd, mode)
    return fd


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


def _sample_runs(root_fd: int, job_id: str) -> list[str]:
    """The node sampler's run directories of a job (root's own: ``.samples/<job id>/``)."""
    try:
        fd = os.open(f"{SAMPLES_DIR}/{job_id}",
                     os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError:
        return []
    try:
        return _run_dirs(_list_dir(fd), job_id)
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

    from .config import load_admin
    from .errors import ConfigError, UsageError
    from .sampler import (
        GpuCollector,
        Sampler,
        cpus_allocated_from_env,
        job_gpus_from_env,
        sample_interval,
    )
    from .sampling.node import NodeJobCollector
    from .spool import SpoolWriter, create_run_dir

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
    run = run_id_for({"SLURM_JOB_ID": job.job_id, "SLURM_RESTART_COUNT": job.restart_count})
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


# ============================================================================ prolog and epilog
# Everything below runs as root. Imports stay inside functions so that importing this module
# (which the wrapper does) costs nothing.


class JobInfo:
    """A job as Slurm describes it to the prolog and epilog (their environment is set by
    slurmd, not by the user, so it is trusted)."""

    __slots__ = ("job_id", "user", "uid", "gid", "array_job_id", "array_task_id",
                 "partition", "nodes", "node", "cluster", "restart_count")

    def __init__(self, env: dict[str, str] | os._Environ[str]):
        from .errors import UsageError

        self.job_id = env.get("SLURM_JOB_ID", "")
        if not self.job_id.isdigit():
            raise UsageError("SLURM_JOB_ID is missing or not a number: run this from Slurm's "
                             "Prolog/Epilog")
        try:
            self.uid = int(env.get("SLURM_JOB_UID", ""))
        except ValueError:
            raise UsageError("SLURM_JOB_UID is missing or not a number") from None
        try:
            self.gid = int(env.get("SLURM_JOB_GID", ""))
        except ValueError:
            import pwd
            try:
                self.gid = pwd.getpwuid(self.uid).pw_gid
            except KeyError:
                self.gid = self.uid
        self.user = env.get("SLURM_JOB_USER", "") or str(self.uid)
        self.array_job_id = env.get("SLURM_ARRAY_JOB_ID", "")
        self.array_task_id = env.get("SLURM_ARRAY_TASK_ID", "")
        self.partition = env.get("SLURM_JOB_PARTITION", "")
        self.nodes = env.get("SLURM_JOB_NODELIST", "") or env.get("SLURM_NODELIST", "")
        self.node = env.get("SLURMD_NODENAME", "")
        self.cluster = env.get("SLURM_CLUSTER_NAME", "")
        self.restart_count = (env.get("SLURM_JOB_RESTART_COUNT", "")
                              or env.get("SLURM_RESTART_COUNT", ""))

    def record(self) -> dict[str, object]:
        return {"cluster": self.cluster, "job_id": self.job_id, "user": self.user,
                "uid": self.uid, "gid": self.gid, "array_job_id": self.array_job_id,
                "array_task_id": self.array_task_id, "partition": self.partition,
                "nodes": self.nodes, "node": self.node}


def _spool_root(admin: object) -> str:
    return getattr(admin, "spool_root", None) or DEFAULT_SPOOL_ROOT


def _open_root(root: str, create: bool) -> int:
    """A descriptor of the spool root, checked to be a directory owned by root and writable by
    no one else (users must not be able to plant entries beside their job directories)."""
    import stat

    from .errors import SpoolError

    if create:
        os.makedirs(root, mode=0o755, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise SpoolError(f"spool root {root} must be owned by root and writable by root only")
    return fd


def _write_root_file(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Atomically replace ``name`` in a root-owned directory."""
    tmp = f".{name}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _read_root_file(dir_fd: int, name: str, limit: int = 1 << 20) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def public_config(admin: AdminConfig) -> bytes:
    """The admin config without its secrets (the store DSN, the webhook URL, which often
    holds a token), as YAML for jobs."""
    import yaml

    values = admin._asdict()
    for secret in SECRET_KEYS:
        values.pop(secret, None)
    values = {k: v for k, v in values.items() if v not in (None, "")}
    header = b"# Written by the logcapture prolog from the admin config, without secrets.\n"
    return header + yaml.safe_dump(values, sort_keys=True).encode()


def _open_jobs_dir(root_fd: int) -> int:
    return _open_root_subdir(root_fd, JOBS_DIR, 0o700)


def _write_job_record(root_fd: int, job_id: str, record: dict[str, object]) -> None:
    """Atomically replace the trusted record ``.jobs/<job id>.json`` below ``root_fd`` (the
    spool root, or its samples directory), making ``.jobs`` when missing."""
    import json

    jobs_fd = _open_jobs_dir(root_fd)
    try:
        _write_root_file(jobs_fd, f"{job_id}.json",
                         json.dumps(record, sort_keys=True).encode() + b"\n", 0o600)
    finally:
        os.close(jobs_fd)


def read_job_record(root: str, job_id: str) -> dict[str, object] | None:
    """The trusted record of a job that the prolog wrote (and the epilog completed), or None.
    The store's rows of job ``job_id`` take user, uid and array ids from here, never from the
    spool, which its user can write."""
    import json

    if not job_id.isdigit():
        return None
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        jobs_fd = os.open(JOBS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=root_fd)
    except OSError:
        os.close(root_fd)
        return None
    try:
        # Only root's records count: a user can make a directory of this shape in a spool of
        # their own, but not one owned by root and writable by root alone.
        st = os.fstat(jobs_fd)
        data = (_read_root_file(jobs_fd, f"{job_id}.json")
                if st.st_uid == 0 and not st.st_mode & 0o022 else None)
    finally:
        os.close(jobs_fd)
        os.close(root_fd)
    if data is None:
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def samples_job_ended(run_dir: Path) -> bool:
    """For the agent: whether the job of a node sampler's run (``<root>/.samples/<job id>/<run
    id>``) has ended, by its trusted record: the epilog writes ``end`` into ``<root>/.jobs/``
    (the copy in ``.samples/.jobs/`` is the prolog's)."""
    job_id = run_dir.parent.name
    samples = run_dir.parent.parent
    for root in (samples, samples.parent):
        rec = read_job_record(str(root), job_id)
        if rec and rec.get("end"):
            return True
    return False


def prolog(env: dict[str, str] | os._Environ[str], *, now: float | None = None,
           optin: Callable[[int], bool] | None = None) -> list[str]:
    """Prepare this node for the job: its spool directory (owned by the user, 0700) and its
    trusted record. Returns messages for the log (paths and numbers only)."""
    import stat
    import time

    from .config import load_admin

    job = JobInfo(env)
    admin = load_admin(env=env)
    root = _spool_root(admin)
    messages: list[str] = []
    root_fd = _open_root(root, create=True)
    try:
        public = public_config(admin)
        if _read_root_file(root_fd, PUBLIC_CONFIG) != public:
            _write_root_file(root_fd, PUBLIC_CONFIG, public, 0o644)
        # The job's directory. The root is root's, so what is there was made by a prolog: an
        # earlier run of this job id (requeue) keeps its content; anything but a directory
        # is replaced.
        name = job.job_id
        try:
            os.mkdir(name, 0o700, dir_fd=root_fd)
        except FileExistsError:
            st = os.lstat(name, dir_fd=root_fd)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=root_fd)
                os.mkdir(name, 0o700, dir_fd=root_fd)
            else:
                messages.append(f"job directory {root}/{name} already existed (requeue?): kept")
        dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=root_fd)
        try:
            os.fchown(dfd, job.uid, job.gid)
            os.fchmod(dfd, 0o700)
        finally:
            os.close(dfd)
        record = job.record()
        record["start"] = time.time() if now is None else now
        record["restart_count"] = job.restart_count
        _write_job_record(root_fd, job.job_id, record)
        # The resource sampler of this node (every node of the job: the wrapper's opt-in
        # decision is taken on the batch node only, later), for users with ~/.logoptin now.
        if (optin or optin_for_uid)(job.uid):
            try:
                messages.append(start_node_sampler(root_fd, job, env, record))
            except Exception as e:  # noqa: BLE001 - the job's capture does not depend on it
                why = e.strerror if isinstance(e, OSError) else type(e).__name__
                messages.append(f"node sampler not started ({why}): the wrapper samples "
                                "the batch node itself")
    finally:
        os.close(root_fd)
    return messages


_SEGMENT_NAME = r"^seg-(\d{6,})\.ndjson(\.gz)?$"
# The states an End record may carry (``END_STATES`` below, and SIGNALED: a run outside Slurm
# killed by a signal).
_END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
               "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REQUEUED", "SIGNALED")


def _open_user_dir(name: str, dir_fd: int, uid: int) -> int | None:
    """A directory in a user's tree, not followed if it is a symlink, owned by ``uid``."""
    import stat

    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        os.close(fd)
        return None
    return fd


def _is_user_dir(name: str, dir_fd: int, uid: int) -> bool:
    fd = _open_user_dir(name, dir_fd, uid)
    if fd is None:
        return False
    os.close(fd)
    return True


def _list_dir(fd: int) -> list[str]:
    """At most MAX_DIR_ENTRIES names of a directory (a user may fill it with millions)."""
    names: list[str] = []
    with os.scandir(fd) as it:
        for entry in it:
            names.append(entry.name)
            if len(names) >= MAX_DIR_ENTRIES:
                break
    return names


def _open_user_file(name: str, dir_fd: int, uid: int, limit: int) -> tuple[int, int] | None:
    """(fd, size) of a regular file owned by ``uid`` of at most ``limit`` bytes; never follows
    a symlink and never blocks on a FIFO."""
    import stat

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > limit:
        os.close(fd)
        return None
    return fd, st.st_size


def _tail(fd: int, size: int, compressed: bool) -> bytes:
    """The last MAX_END_LINE_BYTES bytes of a segment's content, reading at most
    MAX_SEGMENT_BYTES and decompressing at most MAX_DECOMPRESSED_BYTES."""
    import zlib

    if not compressed:
        start = max(0, size - MAX_END_LINE_BYTES)
        return os.pread(fd, MAX_END_LINE_BYTES, start)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    tail = b""
    total = 0
    read = 0
    while read < size and total <= MAX_DECOMPRESSED_BYTES:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        read += len(chunk)
        data = chunk
        while data and total <= MAX_DECOMPRESSED_BYTES:
            try:
                out = d.decompress(data, 1 << 20)
            except zlib.error:
                return tail
            total += len(out)
            tail = (tail + out)[-MAX_END_LINE_BYTES:]
            data = d.unconsumed_tail
            if d.eof:
                return tail
    return tail


def _valid_end(obj: object, run_id: str) -> dict[str, object] | None:
    """The fields of a well-formed End record of ``run_id``, else None (the file is the
    user's: nothing of it is trusted beyond these typed, bounded values)."""
    if not isinstance(obj, dict) or obj.get("kind") != "end" or obj.get("run") != run_id:
        return None
    status, sig, state = obj.get("exit_status"), obj.get("signal"), obj.get("state")
    if status is not None and (type(status) is not int or not 0 <= status <= 255):
        return None
    if sig is not None and (type(sig) is not int or not 1 <= sig <= 128):
        return None
    duration = obj.get("duration")
    return {"exit_status": status, "signal": sig,
            "state": state if state in _END_STATES else "",
            "duration": float(duration) if isinstance(duration, (int, float))
            and type(duration) is not bool else None}


def read_end(job_fd: int, run_id: str, uid: int) -> dict[str, object] | None:
    """The End record of run ``run_id`` in a job directory, read as root would read anything
    of a user's: no symlinks, regular files of the user only, bounded."""
    import re

    run_fd = _open_user_dir(run_id, job_fd, uid)
    if run_fd is None:
        return None
    try:
        found: list[tuple[int, bool, str]] = []
        for name in _list_dir(run_fd):
            m = re.match(_SEGMENT_NAME, name)
            if m:
                found.append((int(m.group(1)), bool(m.group(2)), name))
        # The End is in the last segment the wrapper wrote; names planted after it (symlinks,
        # FIFOs, huge files) are refused one by one, a few at most.
        for _, compressed, name in sorted(found, reverse=True)[:MAX_END_CANDIDATES]:
            opened = _open_user_file(name, run_fd, uid, MAX_SEGMENT_BYTES)
            if opened is None:
                continue
            fd, size = opened
            try:
                tail = _tail(fd, size, compressed=compressed)
            finally:
                os.close(fd)
            end = _end_in(tail, run_id)
            if end is not None:
                return end
    finally:
        os.close(run_fd)
    return None


def _end_in(tail: bytes, run_id: str) -> dict[str, object] | None:
    import json

    complete = tail.split(b"\n")[:-1]  # the last element is an incomplete line (or b"")
    for line in reversed(complete[1:] if len(tail) >= MAX_END_LINE_BYTES else complete):
        if b'"end"' not in line:
            continue
        try:
            end = _valid_end(json.loads(line), run_id)
        except ValueError:
            continue
        if end is not None:
            return end
    return None


def slurm_job(job_id: str, timeout: float = 10.0) -> dict[str, str]:
    """The job's fields as slurmctld reports them (``scontrol show job -o``; the first record
    when there are several), or {} when Slurm cannot be asked."""
    import subprocess

    for scontrol in ("/usr/bin/scontrol", "/usr/local/bin/scontrol", "scontrol"):
        try:
            out = subprocess.run([scontrol, "show", "job", "-o", job_id], capture_output=True,
                                 timeout=timeout, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        first = out.decode("utf-8", "replace").split("\n", 1)[0]
        fields: dict[str, str] = {}
        for token in first.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields
    return {}


# Slurm's states of a job that has not ended yet (squeue's, https://slurm.schedmd.com/squeue.html)
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                           "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                           "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
# The states sacct reports for a job that has ended (Slurm's job_state_string of the job's base
# state, https://slurm.schedmd.com/sacct.html#SECTION_JOB-STATE-CODES), and the ones only
# Slurm can know: a job that was cancelled, timed out, preempted or requeued, or whose node
# failed, ended by a signal or an exit status that says none of it.
END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
              "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REQUEUED")
_DECIDED_BY_SLURM = frozenset(END_STATES) - {"COMPLETED", "FAILED"}
# Slurm's Reason for a job that is still COMPLETING (its final state comes only after the
# epilogs, ``_record_final_state_later``) or PENDING again after a requeue, as the final
# state it announces.
_REASON_STATES = {"TimeLimit": "TIMEOUT", "Deadline": "DEADLINE", "OutOfMemory": "OUT_OF_MEMORY",
                  "NodeDown": "NODE_FAIL", "Preempted": "PREEMPTED", "Prolog": "FAILED",
                  "JobHeldUser": "REQUEUED", "JobHeldAdmin": "REQUEUED",
                  "BeginTime": "REQUEUED"}


def end_state(exit_status: int | None, signal: int | None, job: dict[str, str],
              restarts: int = 0) -> str:
    """The state sacct gives a job that ended with ``exit_status`` or ``signal``, from what
    slurmctld said of it at that moment, while the job's wrapper still ran (``scontrol show
    job -o`` fields; {} when it could not be asked): a state only Slurm decides (CANCELLED,
    TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, a requeue) as Slurm says it, else COMPLETED
    for exit status 0 and FAILED for any other exit or a signal (sacct's FAILED: "terminated
    with non-zero exit code or other failure condition").

    A job slurmctld is ending shows as COMPLETING until its last process and epilog are gone
    (``scontrol`` prints the COMPLETING flag instead of the state under it, and the wrapper is
    one of those processes), so the state is read from ``Reason``: TimeLimit, NodeDown,
    Preempted... as the state they announce. With no Reason the job was ended on request:
    ``scancel`` (sacct's CANCELLED). A job that is still RUNNING ended by itself. A requeued
    job is PENDING again (reason BeginTime) or counts more ``Restarts`` than ``restarts``, the
    count this run started with."""
    state = job.get("JobState", "")
    counted = job.get("Restarts", "")
    if counted.isdigit() and int(counted) > restarts:
        return "REQUEUED"
    if state in _DECIDED_BY_SLURM:
        return state
    if state in ("REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT"):
        return "REQUEUED"
    reason = job.get("Reason", "")
    if state in ("COMPLETING", "PENDING") and reason in _REASON_STATES:
        return _REASON_STATES[reason]
    if state == "COMPLETING" and reason in ("", "None"):
        return "CANCELLED"
    if signal is None and exit_status == 0:
        return "COMPLETED"
    return "FAILED"


def job_end_state(exit_status: int | None, signal: int | None,
                  env: dict[str, str] | os._Environ[str], timeout: float = 3.0) -> str:
    """``end_state`` of the job in ``env`` (SLURM_JOB_ID), asking slurmctld now: the job
    wrapper calls it when the job's script has ended, before its End record is written."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return end_state(exit_status, signal, {})
    restarts = env.get("SLURM_RESTART_COUNT", "")
    return end_state(exit_status, signal, slurm_job(job_id, timeout),
                     int(restarts) if restarts.isdigit() else 0)


def slurm_state(job_id: str, timeout: float = 10.0) -> str:
    """The job's state as slurmctld reports it, or "". During the epilog it is COMPLETING."""
    return slurm_job(job_id, timeout).get("JobState", "")


def _update_record(root: str, job_id: str, fields: dict[str, object]) -> bool:
    """Merge ``fields`` into an existing job record; False when there is none any more."""
    record = read_job_record(root, job_id)
    if record is None:
        return False
    record.update(fields)
    root_fd = _open_root(root, create=False)
    try:
        _write_job_record(root_fd, job_id, record)
    finally:
        os.close(root_fd)
    return True


def _record_final_state_later(root: str, job_id: str, timeout: float = 120.0,
                              record: dict[str, object] | None = None) -> None:
    """Slurm reports a job as COMPLETING until its epilogs have ended, so its final state
    (COMPLETED, FAILED, CANCELLED, TIMEOUT...) can only be read after the epilog: a detached
    process (its own session, no inherited descriptors, so neither slurmd nor the epilog
    script waits for it) polls for it and writes it into the job record."""
    import time

    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 1 << 16)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.5)
            state = slurm_state(job_id)
            if state and state != "COMPLETING":
                _update_record(root, job_id, {"slurm_state": state})
                # the record as the epilog wrote it: a job it shipped has none any more
                _rediagnose({**(record or {}), "slurm_state": state}, job_id)
                break
    except BaseException:  # noqa: BLE001 - a detached helper never reports anywhere
        pass
    os._exit(0)


def _rediagnose(record: dict[str, object], job_id: str) -> None:
    """Once Slurm's final state is known (after the epilog), diagnose the job's run in the
    store again with it (TIMEOUT, CANCELLED... where the epilog saw only COMPLETING), and send
    the message its user asked for (insights.notify: once per job and event). ``record``: the
    job's trusted record as the epilog completed it, with the final ``slurm_state`` (the
    epilog removes the record of a job it shipped)."""
    from pathlib import Path

    from .config import load_admin
    from .insights.notify import Notifier
    from .ship import UploadResult, diagnose_run
    from .store import Identity, open_store

    admin = load_admin()
    root = _spool_root(admin)
    run_id = record.get("run_id") if record else None
    if not admin.store or not record or not isinstance(run_id, str):
        return
    uid, user = record.get("uid"), record.get("user")
    if not isinstance(uid, int) or not isinstance(user, str):
        return
    identity = Identity(run=run_id, user=user, uid=uid,
                        cluster=str(record.get("cluster", "")), job_id=job_id)
    notifier = Notifier(Path(root) / NOTIFIED_DIR, mail_prog=admin.mail_prog,
                        webhook=admin.notify_webhook)
    with open_store(admin.store, wait=60.0, must_exist=True) as store:
        if store.has_run(identity.run, user):
            diagnose_run(store, identity, job_insight_info(record), UploadResult(), notifier)


def _run_dirs(names: list[str], job_id: str) -> list[str]:
    import re

    pattern = re.compile(rf"^{job_id}(\.(\d+))?$")
    runs = [n for n in names if pattern.match(n)]
    return sorted(runs, key=lambda n: int(n.partition(".")[2] or 0))


def _remove_job(root_fd: int, job_id: str) -> None:
    """Remove a job's directory and record. shutil.rmtree works through directory descriptors
    and never follows symlinks (rmtree.avoids_symlink_attacks is true on Linux)."""
    import errno
    import shutil
    import time

    for attempt in range(3):
        try:
            shutil.rmtree(job_id, dir_fd=root_fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            # The agent may create its cursor lock in a run directory while it is being
            # emptied (it listed the run before the shipping here finished): go again.
            if e.errno != errno.ENOTEMPTY or attempt == 2:
                raise
            time.sleep(0.1)
            continue
        break
    try:
        os.unlink(f"{JOBS_DIR}/{job_id}.json", dir_fd=root_fd)
    except FileNotFoundError:
        pass


def _ship(root: str, job_id: str, runs: list[str], admin: object, record: dict[str, object],
          deadline: float = SHIP_DEADLINE, samples: list[str] | None = None
          ) -> tuple[bool, str]:
    """Ship the job's runs now when a store is configured, with the trusted identity of the
    job record, and say how it went. False leaves them to the agent: no store configured,
    the store unreachable or busy past ``deadline`` (an embedded chDB store is held by the
    agent while it runs), or anything not accepted."""
    store = getattr(admin, "store", None)
    if not store:
        return False, "no store configured"
    try:
        from pathlib import Path

        from .ship import trusted_identity, upload
        from .store import Identity
    except Exception as e:  # noqa: BLE001 - shipping is optional here
        return False, f"shipping unavailable ({type(e).__name__})"
    uid, user = record.get("uid"), record.get("user")
    if not isinstance(uid, int) or not isinstance(user, str):
        return False, "job record without user"

    def identify(run_dir: Path) -> Identity:
        return trusted_identity(run_dir, record)

    ok = True
    why = ""
    # The wrapper's runs, then the node sampler's (root's spool; same run ids, so the samples
    # join the job's run in the store under the same trusted identity).
    # The samples first: when the wrapper's run is complete in the store, the shipper
    # diagnoses it, and its efficiency notes need every sample.
    todo = [(Path(root) / SAMPLES_DIR / job_id, run) for run in samples or []]
    todo += [(Path(root) / job_id, run) for run in runs]
    info = job_insight_info(record)
    from .insights.notify import Notifier

    # While Slurm says only COMPLETING, the "failed" message waits for the final state
    # (_rediagnose): a cancelled job's End says SIGTERM, its state says who and why.
    notifier = Notifier(Path(root) / NOTIFIED_DIR, mail_prog=getattr(admin, "mail_prog", None),
                        webhook=getattr(admin, "notify_webhook", None)) \
        if info.get("slurm_state") else None
    for spool_dir, run in todo:
        try:
            # shipped_ok: the agent may have shipped the run already (it tails the spool
            # root); then the job's spool is done all the same and is removed below
            result = upload(spool_dir, run=run, dsn=store, deadline=deadline,
                            retention_days=0, identify=identify, shipped_ok=True,
                            job_info=lambda _run_dir: info, notifier=notifier)
        except Exception as e:  # noqa: BLE001
            ok, why = False, f"upload failed ({type(e).__name__})"
            continue
        if result.exit_code != 0:
            ok, why = False, f"upload exit {result.exit_code}"
    return ok, why


def job_insight_info(record: dict[str, object] | None) -> dict[str, object]:
    """What the diagnosis of a job's run needs from its trusted record: Slurm's state (final,
    or announced by its Reason) and the job's request (``insights.efficiency``)."""
    if not record:
        return {}
    state = str(record.get("slurm_state") or "")
    if state in ("", "COMPLETING"):
        state = _REASON_STATES.get(str(record.get("slurm_reason") or ""), "")
    request = record.get("request")
    return {"slurm_state": state, "request": request if isinstance(request, dict) else None}


def _request(info: dict[str, str]) -> dict[str, float]:
    """What the job asked Slurm for, from ``scontrol show job`` (TRES as ``cpu=2,mem=4000M,
    node=1,gres/gpu=2``; TimeLimit as ``[days-]hh:mm:ss``)."""
    from .insights.efficiency import parse_time_limit

    out: dict[str, float] = {}
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    for item in info.get("ReqTRES", info.get("TRES", "")).split(","):
        key, _, value = item.partition("=")
        try:
            if key == "cpu":
                out["cpus"] = float(value)
            elif key == "mem" and value:
                out["memory_bytes"] = float(value[:-1]) * units.get(value[-1], 1) \
                    if value[-1] in units else float(value) * 2**20
            elif key in ("gres/gpu", "gpu"):
                out["gpus"] = float(value)
        except ValueError:
            continue
    limit = parse_time_limit(info.get("TimeLimit", ""))
    if limit:
        out["time_limit_seconds"] = limit
    return out


def epilog(env: dict[str, str] | os._Environ[str], *, now: float | None = None,
           state_of: object = None, sampler_wait: float = SAMPLER_STOP_WAIT) -> list[str]:
    """Record the job's end, ship or leave to the agent, clean up. Returns log messages."""
    import time

    from .config import load_admin

    job = JobInfo(env)
    admin = load_admin(env=env)
    root = _spool_root(admin)
    messages: list[str] = []
    try:
        root_fd = _open_root(root, create=False)
    except FileNotFoundError:
        return [f"spool root {root} does not exist: nothing to do"]
    try:
        # First the node sampler: its last sample must be in its spool before shipping.
        messages += stop_node_sampler(root_fd, job.job_id, wait=sampler_wait)
        samples = _sample_runs(root_fd, job.job_id)
        job_fd = _open_user_dir(job.job_id, root_fd, job.uid)
        runs: list[str] = []
        if job_fd is not None:
            try:
                runs = [run for run in _run_dirs(_list_dir(job_fd), job.job_id)
                        if _is_user_dir(run, job_fd, job.uid)]
                ends = {run: read_end(job_fd, run, job.uid) for run in runs}
            finally:
                os.close(job_fd)
        if not runs and not samples:
            # Not opted in (or capture never started): leave nothing behind.
            _remove_job(root_fd, job.job_id)
            _remove_samples(root_fd, job.job_id)
            return messages
        record = read_job_record(root, job.job_id) or job.record()
        if not runs:
            # A node without the wrapper's run (not the batch node, or the wrapper decided
            # against capture): only this node's samples, under the prolog's record.
            shipped, why = _ship(root, job.job_id, [], admin, record, samples=samples)
            _remove_job(root_fd, job.job_id)
            if shipped:
                _remove_samples(root_fd, job.job_id)
                messages.append(f"shipped this node's samples ({', '.join(samples)})")
            else:
                messages.append(f"samples left in {root}/{SAMPLES_DIR}/{job.job_id} for the "
                                f"agent ({why})")
            return messages
        current = run_id_for({"SLURM_JOB_ID": job.job_id,
                              "SLURM_RESTART_COUNT": job.restart_count})
        run = current if current in runs else runs[-1]
        end = ends.get(run)
        info = state_of(job.job_id) if callable(state_of) else slurm_job(job.job_id)
        # The prolog's environment has no array ids; slurmctld knows them.
        if not record.get("array_job_id") and info.get("ArrayJobId", "").isdigit():
            record["array_job_id"] = info["ArrayJobId"]
            record["array_task_id"] = info.get("ArrayTaskId", "")
        record.update({
            "end": time.time() if now is None else now,
            "run_id": run,
            "runs": runs,
            "exit_status": end["exit_status"] if end else None,
            "signal": end["signal"] if end else None,
            "wrapper_state": end["state"] if end else "",
            "duration": end["duration"] if end else None,
            "slurm_state": info.get("JobState", ""),
            "slurm_reason": info.get("Reason", ""),
            "request": _request(info),
            "slurm_exit_code": env.get("SLURM_JOB_EXIT_CODE2", ""),
        })
        if end is None:
            messages.append(f"run {run}: no readable End record (the wrapper was killed, or "
                            "its spool is not as the wrapper left it)")
        _write_job_record(root_fd, job.job_id, record)
        if info and record["slurm_state"] in ("", "COMPLETING") and not callable(state_of):
            _record_final_state_later(root, job.job_id, record=dict(record))
        shipped, why = _ship(root, job.job_id, runs, admin, record, samples=samples)
        if shipped:
            _remove_job(root_fd, job.job_id)
            _remove_samples(root_fd, job.job_id)
            messages.append(f"shipped run(s) {', '.join(runs)}"
                            + (" with this node's samples" if samples else "")
                            + " and removed the job's spool")
        else:
            messages.append(f"run(s) {', '.join(runs)} left in {root}/{job.job_id} for the "
                            f"agent ({why})")
    finally:
        os.close(root_fd)
    return messages


def _hook_main(which: str, env: dict[str, str] | os._Environ[str] | None = None) -> int:
    """``logcapture slurm prolog|epilog``: messages on stderr (the thin scripts send them to
    syslog with the job id); 0 when all went well, 1 otherwise. Never raises."""
    from .errors import LogcaptureError

    env = os.environ if env is None else env
    try:
        messages = prolog(env) if which == "prolog" else epilog(env)
        code = 0
    except LogcaptureError as e:
        messages, code = [f"error: {e.message}"], 1
    except OSError as e:
        messages, code = [f"error: {e.strerror or e} ({type(e).__name__})"], 1
    except Exception as e:  # noqa: BLE001 - the job must go on whatever happens here
        messages, code = [f"internal error: {type(e).__name__}"], 1
    for m in messages:
        sys.stderr.write(f"logcapture slurm {which}: {m}\n")
    return code


def prolog_main() -> int:
    return _hook_main("prolog")


def epilog_main() -> int:
    return _hook_main("epilog")


if __name__ == "__main__":  # python -m logcapture.slurm prolog|epilog
    if len(sys.argv) == 2 and sys.argv[1] in ("prolog", "epilog"):
        sys.exit(_hook_main(sys.argv[1]))
    sys.stderr.write("usage: python -m logcapture.slurm prolog|epilog\n")
    sys.exit(2)
