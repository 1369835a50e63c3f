"""A Slurm job's figures on one node, seen from outside the job (the per-node sampler daemon
that the prolog starts, ``logcapture slurm sampler``; docs/sampling.md).

Inside the job the wrapper knows its own process tree. From outside, the job is found by its
id: the ``job_<id>`` cgroup that slurmd made for it on this node, in any of Slurm 22.05's
layouts (``find_job_cgroup_by_id``), else, with no cgroup at all (proctrack/linuxproc), the
processes of the job's user whose environment holds ``SLURM_JOB_ID=<id>``
(``job_pids_from_environ``). The cgroup may appear only after the prolog has started the
sampler, so it is looked for again at every sample until found.

CPU time: a cgroup with a CPU counter (v2 ``cpu.stat``, v1 ``cpuacct.usage``) misses nothing;
it is also read every ``poll_cpu()`` (a fraction of a second, cheap: one small file) so that the
job's last second is not lost when slurmd removes the cgroup between two samples. Without a
counter (Slurm's v1 plugin makes cpuacct groups only with jobacct_gather/cgroup; freezer is
enough for proctrack/cgroup), the per-process sums of ``JobCollector`` are used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .job import JobCollector, read_cgroup_cpu_seconds, read_cgroup_pids

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

# v1 hierarchies, best first: cpuacct has the CPU counter; the others only list the processes.
_V1_ORDER = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu", "freezer", "cpuset", "memory", "pids",
             "devices", "blkio")
MAX_ENVIRON_BYTES = 256 * 1024


def _v2_root(root: Path) -> Path | None:
    for base in (root, root / "unified"):
        if (base / "cgroup.controllers").exists():
            return base
    return None


def find_job_cgroup_by_id(job_id: str, uid: int | None = None,
                          cgroup_root: str | Path = "/sys/fs/cgroup") -> Path | None:
    """The ``job_<job_id>`` cgroup of this node, or None (not made yet, or no cgroups).

    Slurm 22.05 layouts: cgroup v2 ``<slurmd's cgroup>/slurmstepd.scope/job_<id>`` (usually
    ``system.slice/slurmstepd.scope``), cgroup v1 ``<hierarchy>/slurm[_<node>]/uid_<uid>/
    job_<id>``. On v1 the cpuacct hierarchy is preferred (it counts CPU time), then any
    hierarchy that lists the job's processes."""
    if not job_id.isdigit():
        return None
    root = Path(cgroup_root)
    name = f"job_{job_id}"
    user = f"uid_{uid}" if uid is not None else "uid_*"
    found: list[Path] = []
    v2 = _v2_root(root)
    if v2 is not None:
        for pattern in (f"slurmstepd.scope/{name}", f"*/slurmstepd.scope/{name}",
                        f"*/*/slurmstepd.scope/{name}"):
            found.extend(sorted(v2.glob(pattern)))
    try:
        hierarchies = sorted(e.name for e in os.scandir(root) if e.is_dir())
    except OSError:
        hierarchies = []
    hierarchies.sort(key=lambda h: _V1_ORDER.index(h) if h in _V1_ORDER else len(_V1_ORDER))
    for hier in hierarchies:
        if hier == "unified" or (root / hier) == v2:
            continue
        found.extend(sorted((root / hier).glob(f"slurm*/{user}/{name}")))
    for path in found:
        if (path / "cgroup.procs").exists():
            return path
    return None


def job_pids_from_environ(job_id: str, uid: int, proc_root: str | Path = "/proc") -> list[int]:
    """Processes of ``uid`` whose environment has ``SLURM_JOB_ID=<job_id>`` (the fallback
    without a job cgroup). Reads at most MAX_ENVIRON_BYTES of each environment, and only of
    the job user's processes."""
    proc = Path(proc_root)
    needle = f"SLURM_JOB_ID={job_id}\0".encode()
    pids: list[int] = []
    try:
        entries = [e for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            fd = os.open(os.path.join(entry.path, "environ"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            data = os.read(fd, MAX_ENVIRON_BYTES)
        except OSError:
            continue
        finally:
            os.close(fd)
        if data.startswith(needle) or b"\0" + needle in data:
            pids.append(int(entry.name))
    return sorted(pids)


class NodeJobCollector(JobCollector):
    """``JobCollector`` for a job identified by id and uid rather than by a process of ours.
    ``poll_cpu()`` keeps the cgroup's CPU counter fresh between samples; ``ended`` says the
    job's cgroup was seen and is gone (the job is over on this node)."""

    def __init__(self, job_id: str, uid: int, *, cgroup_root: str | Path = "/sys/fs/cgroup",
                 proc_root: str | Path = "/proc", cpus_allocated: int | None = None,
                 psutil: Any = None, clock: Callable[[], float] | None = None,
                 exclude_pids: set[int] | None = None):
        kw: dict[str, Any] = {}
        if psutil is not None:
            kw["psutil"] = psutil
        if clock is not None:
            kw["clock"] = clock
        super().__init__(root_pid=None, cgroup_path=None, proc_root=proc_root,
                         cpus_allocated=cpus_allocated, exclude_pids=exclude_pids or set(),
                         **kw)
        self.job_id = job_id
        self.uid = uid
        self.cgroup_root = Path(cgroup_root)
        self.cpu_last: float | None = None  # the cgroup counter's last reading
        self.ended = False

    def locate(self) -> Path | None:
        if self.cgroup_path is None and not self.ended:
            self.cgroup_path = find_job_cgroup_by_id(self.job_id, self.uid, self.cgroup_root)
        return self.cgroup_path

    def poll_cpu(self) -> None:
        """Read the cgroup's CPU counter (and notice when the cgroup is gone). Never raises."""
        try:
            cg = self.locate()
            if cg is None:
                return
            value = read_cgroup_cpu_seconds(cg)
            if value is not None:
                self.cpu_last = max(value, self.cpu_last or 0.0)
            elif not (cg / "cgroup.procs").exists():
                self.ended = True
        except Exception:  # noqa: BLE001 - a sampler never fails on a vanished cgroup
            pass

    def _find_pids(self) -> list[int]:
        cg = self.locate()
        if cg is not None:
            if not (cg / "cgroup.procs").exists():
                self.ended = True
                return []
            pids = read_cgroup_pids(cg)
        else:
            pids = job_pids_from_environ(self.job_id, self.uid, self.proc_root)
        return [p for p in pids if p not in self.exclude_pids]

    def _collect(self) -> dict[str, Any]:
        self.poll_cpu()
        if self.cpu_last is not None:  # the counter as of the last poll, if the cgroup is gone
            self._peak["cpu"] = max(self._peak["cpu"], self.cpu_last)
        return super()._collect()
