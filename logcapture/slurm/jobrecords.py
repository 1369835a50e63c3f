"""The spool root's own files, written and read as root: the trusted job records
(``.jobs/<job id>.json``), the public part of the admin config (``.config.json``) and the
descriptors that everything root does below the spool root goes through.

The root is opened once and checked (a directory owned by root that no one else may write);
every file below it is opened relative to that descriptor with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms of CPU
if TYPE_CHECKING:
    from pathlib import Path

    from ..config.admin import AdminConfig

JOBS_DIR = ".jobs"
SAMPLES_DIR = ".samples"  # root, 0700: the node samplers' spool, laid out like a spool root
NOTIFIED_DIR = ".notified"  # root, 0700: one marker per message sent (insights.notify)
SAMPLERS_DIR = ".samplers"  # root, 0755: <job id>.pid of each running node sampler (0644)
PUBLIC_CONFIG = ".config.json"  # config.admin.public_config: what jobs read of the admin config


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


def _spool_root(admin: AdminConfig) -> str:
    """The spool root of the hooks and the node sampler (``spool.layout.default_root``'s rule)."""
    from ..spool.layout import default_root

    return str(default_root(process="slurm", configured=admin.spool_root))


def _open_root(root: str, create: bool) -> int:
    """A descriptor of the spool root, checked to be a directory owned by root and writable by
    no one else (users must not be able to plant entries beside their job directories)."""
    import stat

    from ..errors import SpoolError

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


def _read_root_file(dir_fd: int, name: str, limit: int = 1 << 20,
                    mode: int | None = None) -> bytes | None:
    """The content of ``name``, a regular file of this process's user (root); None when it is
    missing, is something else, or (``mode`` given) has another mode, so that the caller
    writes it anew (a config that jobs must read, left 0600 by hand, would give every job the
    defaults)."""
    import stat

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or (
                mode is not None and stat.S_IMODE(st.st_mode) != mode):
            return None
        return os.read(fd, limit)
    finally:
        os.close(fd)


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


def _run_dirs(names: list[str], job_id: str) -> list[str]:
    import re

    pattern = re.compile(rf"^{job_id}(\.(\d+))?$")
    runs = [n for n in names if pattern.match(n)]
    return sorted(runs, key=lambda n: int(n.partition(".")[2] or 0))


def _task_run_dirs(names: list[str], job_id: str, het_job_id: str = "") -> list[str]:
    """The runs of the job's tasks (``slurm.task.task_run_id``: J.S.R, J.N.S.R) in its
    directory; in a heterogeneous job's later component's (``het_job_id``: the first
    component's id, ``JobInfo.het_job_id``), those of the first's (``slurm.task.job_spool``)."""
    import re

    pattern = re.compile(r"^(\d+)(\.\d+)?\.\d+\.\d+$")
    return sorted(n for n in names if (m := pattern.match(n)) and m[1] in (job_id, het_job_id))


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
