"""The job's own CPU, memory, I/O and threads, through psutil and the job's cgroup.

Which processes are the job's: every pid listed in ``cgroup.procs`` anywhere under the job's
cgroup when there is one (cgroup v2, or v1 with the cpuacct hierarchy), else the process tree
under ``root_pid`` (found through ``<proc_root>/<pid>/task/<tid>/children``). The outside
world is passed in: the cgroup directory, ``proc_root``, the root pid, the clock and the
``psutil`` module, which reads the per-process figures (from ``psutil.PROCFS_PATH``).

Counters stay monotonic when processes end. ``/proc/<pid>/stat``'s cutime/cstime and
``/proc/<pid>/io`` include every child the process has reaped, so summing ``user + system +
children_user + children_system`` over the live processes counts a dead process once its
parent in the job reaped it. A process that vanishes while its last-seen parent is not in the
job (the root, reaped by the wrapper; orphans re-parented to init) would be lost: its last
reading is kept in ``_gone``. When the wrapper itself is the root and excluded
(``JobCollector(root_pid=os.getpid(), exclude_pids={os.getpid()})``), its children_user and
children_system count the job processes it reaped, whole. With a cgroup, CPU time comes
from the cgroup's own counter (``cpu.stat`` usage_usec on v2, ``cpuacct.usage`` on v1),
which misses nothing.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

_JOB_DIR = re.compile(r"^job_\d+$")


def find_job_cgroup(pid: int, proc_root: str | Path = "/proc",
                    cgroup_root: str | Path = "/sys/fs/cgroup") -> Path | None:
    """The Slurm job cgroup (the ``job_<id>`` directory) holding ``pid``, or None.

    Reads ``<proc_root>/<pid>/cgroup``. cgroup v2 (``0::/path``) is looked up under
    ``cgroup_root`` (or ``cgroup_root/unified`` on a hybrid host); v1 under the hierarchy
    holding ``cpuacct``. Only a path with a ``job_<digits>`` component counts: any other cgroup
    (a login session, the root) holds processes that are not the job's, so the caller falls
    back to the process tree.
    """
    try:
        text = (Path(proc_root) / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    root = Path(cgroup_root)
    candidates: list[tuple[Path, str]] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            base = root if (root / "cgroup.controllers").exists() else root / "unified"
            candidates.insert(0, (base, path))
        elif "cpuacct" in controllers.split(","):
            candidates.append((root / controllers, path))
    for base, path in candidates:
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            if _JOB_DIR.match(part):
                cg = base.joinpath(*parts[: i + 1])
                if (cg / "cgroup.procs").exists():
                    return cg
    return None


def cpus_allocated_from_env(env: Mapping[str, str], pid: int = 0) -> int:
    """CPUs the job may use on this node: ``SLURM_CPUS_ON_NODE``, else the CPU affinity of
    ``pid`` (Slurm's cpuset, taskset), else the CPU count."""
    value = env.get("SLURM_CPUS_ON_NODE", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        return len(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_cgroup_pids(cgroup_path: Path) -> list[int]:
    """Every pid in ``cgroup.procs`` of ``cgroup_path`` and all cgroups below it (v2 puts a
    job's processes in leaf cgroups such as ``step_0/user/task_0``)."""
    pids: set[int] = set()
    for dirpath, _dirs, files in os.walk(cgroup_path):
        if "cgroup.procs" in files:
            try:
                text = Path(dirpath, "cgroup.procs").read_text()
            except OSError:  # removed between walk and read
                continue
            pids.update(int(t) for t in text.split() if t.isdigit())
    return sorted(pids)


def read_cgroup_cpu_seconds(cgroup_path: Path) -> float | None:
    """The cgroup's CPU time in seconds, hierarchical: v2 ``cpu.stat`` usage_usec, v1
    ``cpuacct.usage`` (nanoseconds). None when neither file is readable."""
    try:
        for line in (cgroup_path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    try:
        return int((cgroup_path / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


class JobCollector:
    """The job's figures: ``collect() -> dict`` with cpu_seconds_total, cpu_percent (100 = one
    core, over the last interval), memory_rss_bytes, memory_pss_bytes, io_read_bytes,
    io_write_bytes, threads, processes, cpus_allocated. Never raises."""

    def __init__(self, root_pid: int | None = None, cgroup_path: str | Path | None = None, *,
                 proc_root: str | Path = "/proc", clock: Callable[[], float] = time.monotonic,
                 cpus_allocated: int | None = None, psutil: Any = None,
                 exclude_pids: Iterable[int] = (), read_pss: bool = True):
        self.root_pid = root_pid
        self.proc_root = Path(proc_root)
        self.read_pss = read_pss
        self._children_files: bool | None = None  # /proc/<pid>/task/<tid>/children present?
        self.cgroup_path = Path(cgroup_path) if cgroup_path is not None else None
        self.clock = clock
        self._psutil = psutil  # None: imported when first needed (psutil)
        self.exclude_pids = set(exclude_pids)
        if cpus_allocated is None:
            cpus_allocated = cpus_allocated_from_env({}, root_pid or 0)
        self.cpus_allocated = cpus_allocated
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process, kept so create_time is read once
        self._last: dict[int, tuple[int, float, int, int]] = {}  # pid -> ppid, cpu, read, write
        self._gone = [0.0, 0, 0]  # cpu seconds, read bytes, write bytes of lost processes
        self._prev: tuple[float, float] | None = None  # (clock, cpu_seconds_total)
        self._peak = {"cpu": 0.0, "read": 0, "write": 0}
        self._pids: list[int] = []
        self._warned: set[str] = set()
        self._warnings: list[str] = []
        # Normal events, counted rather than warned about (``counts()``): a process of the job
        # that ended between being listed and being read (a make, a shell pipeline, a data
        # loader's workers end all the time), and one the user may not read (a setuid
        # program). ``_vanished``, ``_denied``: the pids of the last sample's events, so that a
        # pid still listed at the next sample is counted once.
        self._ended = 0
        self._unreadable = 0
        self._vanished: set[int] = set()
        self._denied: set[int] = set()

    @property
    def psutil(self) -> Any:
        """The ``psutil`` module given, or psutil itself, imported on first use: ~10 ms of
        CPU that a capture without sampling (each task of a step) never needs."""
        if self._psutil is None:
            import psutil

            self._psutil = psutil
        return self._psutil

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self._warnings.append(message)

    def pop_warnings(self) -> list[str]:
        out, self._warnings = self._warnings, []
        return out

    def counts(self) -> dict[str, int]:
        """Processes of the job that ended while a sample read them (their figures as of the
        sample before are kept), and processes that could not be read (skipped); each
        process counted once. Normal events, for the end record, not warnings."""
        return {"processes_ended_mid_sample": self._ended,
                "processes_unreadable": self._unreadable}

    def pids(self) -> list[int]:
        """The job's pids as of the last ``collect()`` (found afresh before the first)."""
        return list(self._pids) if self._prev is not None else self._find_pids()

    def _find_pids(self) -> list[int]:
        if self.cgroup_path is not None:
            pids = read_cgroup_pids(self.cgroup_path)
        elif self.root_pid is not None:
            found = self._tree_from_children_files(self.root_pid)
            if found is not None:
                pids = found
            else:  # psutil scans every /proc/<pid>/stat: a few ms on a busy node
                ps = self.psutil
                try:
                    root = self._procs.get(self.root_pid) or ps.Process(self.root_pid)
                    pids = [root.pid] + [c.pid for c in root.children(recursive=True)]
                except ps.Error:  # NoSuchProcess: the job has ended
                    pids = []
        else:
            pids = []
        return [p for p in pids if p not in self.exclude_pids]

    def _tree_from_children_files(self, root: int) -> list[int] | None:
        """The tree under ``root`` from ``<proc_root>/<pid>/task/<tid>/children`` (Linux >= 4.2
        with CONFIG_PROC_CHILDREN): reads only the job's own entries. None when the kernel
        has no such files. A child forked during the walk may be missed until the next
        sample, which the kernel documents for this file."""
        proc = self.proc_root
        if self._children_files is None:
            if not (proc / str(root)).exists():
                return []
            self._children_files = (proc / str(root) / "task" / str(root) / "children").exists()
        if not self._children_files:
            return None
        pids, seen, i = [root], {root}, 0
        while i < len(pids):
            pid = pids[i]
            i += 1
            try:
                tids = os.listdir(proc / str(pid) / "task")
            except OSError:  # ended meanwhile
                if pid == root:
                    return []
                continue
            for tid in tids:
                try:
                    text = (proc / str(pid) / "task" / tid / "children").read_text()
                except OSError:
                    continue
                for token in text.split():
                    child = int(token)
                    if child not in seen:
                        seen.add(child)
                        pids.append(child)
        return pids

    def _process(self, pid: int) -> Any:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = self.psutil.Process(pid)
        return proc

    def collect(self) -> dict[str, Any]:
        try:
            return self._collect()
        except Exception as e:  # never into the job wrapper
            self._warn("collect:" + type(e).__name__,
                       f"job sampling failed: {type(e).__name__}: {e}")
            return {"cpus_allocated": self.cpus_allocated}

    def _read_process(self, pid: int) -> tuple[int, float, int, int, int, int, int | None]:
        """One process's (ppid, CPU seconds with its reaped children's, bytes read, bytes
        written, threads, RSS, PSS or None); psutil's NoSuchProcess or AccessDenied when it
        ended or is not the user's."""
        ps = self.psutil
        proc = self._process(pid)
        with proc.oneshot():
            ppid = proc.ppid()
            t = proc.cpu_times()
            cpu = t.user + t.system + t.children_user + t.children_system
            threads = proc.num_threads()
            full = None
            if self.read_pss:
                try:  # smaps_rollup: the kernel walks the page tables, the costly part
                    full = proc.memory_full_info()
                except ps.AccessDenied:
                    pass
            rss, pss = (full.rss, full.pss) if full is not None else (proc.memory_info().rss,
                                                                      None)
            try:
                io = proc.io_counters()
                read, write = io.read_bytes, io.write_bytes
            except (ps.AccessDenied, AttributeError):
                read = write = 0
        return ppid, cpu, read, write, threads, rss, pss

    def _collect(self) -> dict[str, Any]:
        ps = self.psutil
        now = self.clock()
        current: dict[int, tuple[int, float, int, int]] = {}
        rss = pss = threads = 0
        have_pss = False
        vanished: set[int] = set()
        denied: set[int] = set()
        for pid in self._find_pids():
            try:
                ppid, cpu, read, write, n, proc_rss, proc_pss = self._read_process(pid)
            except ps.NoSuchProcess:  # ended since it was listed: normal, counted
                self._procs.pop(pid, None)
                vanished.add(pid)
                continue
            except ps.AccessDenied:  # not the user's to read (setuid): skipped, counted once
                denied.add(pid)
                continue
            threads += n
            rss += proc_rss
            if proc_pss is not None:
                pss += proc_pss
                have_pss = True
            current[pid] = (ppid, cpu, read, write)
        # The wrapper as root (root_pid in exclude_pids): its own figures are not the job's,
        # but its children_user/children_system are exactly the job processes it reaped.
        reaper = self.root_pid if self.root_pid in self.exclude_pids else None
        reaped_cpu = 0.0
        if reaper is not None:
            try:
                t = self._process(reaper).cpu_times()
                reaped_cpu = t.children_user + t.children_system
            except ps.Error:
                pass
        # A process that vanished without a parent in the job to reap it takes its counters
        # with it: keep its last reading (see the module docstring).
        for pid, (ppid, cpu, read, write) in self._last.items():
            if pid not in current:
                self._procs.pop(pid, None)
                if ppid not in current:
                    if ppid != reaper:
                        self._gone[0] += cpu
                    self._gone[1] += read
                    self._gone[2] += write
        self._ended += len(vanished - self._vanished)
        self._unreadable += len(denied - self._denied)
        self._vanished, self._denied = vanished, denied
        self._last = current
        self._pids = sorted(current)
        cpu_total = self._gone[0] + reaped_cpu + sum(v[1] for v in current.values())
        if self.cgroup_path is not None:
            cg = read_cgroup_cpu_seconds(self.cgroup_path)
            if cg is not None:
                cpu_total = cg
        peak = self._peak
        peak["cpu"] = max(peak["cpu"], cpu_total)
        peak["read"] = max(peak["read"], self._gone[1] + sum(v[2] for v in current.values()))
        peak["write"] = max(peak["write"], self._gone[2] + sum(v[3] for v in current.values()))
        cpu_percent = None
        if self._prev is not None and now > self._prev[0]:
            cpu_percent = 100.0 * (peak["cpu"] - self._prev[1]) / (now - self._prev[0])
        self._prev = (now, peak["cpu"])
        return {
            "cpu_seconds_total": peak["cpu"],
            "cpu_percent": cpu_percent,
            # No resident page in any process: none is alive (no process, or only exited
            # ones not reaped yet, zombies): nothing was measured, not "0 B".
            "memory_rss_bytes": rss or None,
            "memory_pss_bytes": pss if have_pss and rss else None,
            "io_read_bytes": peak["read"],
            "io_write_bytes": peak["write"],
            "threads": threads,
            "processes": len(current),
            "cpus_allocated": self.cpus_allocated,
        }
