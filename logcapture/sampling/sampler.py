"""The resource sampler: collectors of GPU and job figures, run on an interval in a background
thread, handing ``Sample`` records to a callback (docs/sampling.md).

::

    GpuCollector.collect() -> list[dict]  (NVML; gpu.py)              ─┐
    JobCollector.collect() -> dict        (psutil, cgroup; job.py)    ─┴─► Sampler ─► emit(Sample)
                                                                               └─► warn(str), once
    inventory() -> dict                   (at start, for Start.inventory)
    summarize(samples) -> dict            (for ``logcapture show``; summary.py)

Nothing here raises into the job wrapper: a missing NVML library, a GPU that fell off the
bus, an unsupported field each become one warning string and the sampler carries on with what
it has. A process of the job that ends between two samples is no problem at all (a make, a
shell pipeline): it is counted (``Sampler.counts()``, for the end record), never warned about.
The only exception is ``sample_interval``, which checks configuration before anything starts
(a ConfigError naming the key: configuration fails early, not in the job's log).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import ConfigError
from ..records import Sample
from .gpu import GpuCollector, job_gpus_from_env
from .job import JobCollector, cpus_allocated_from_env

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

INTERVAL_ENV = "LOGCAPTURE_SAMPLE_INTERVAL"
DEFAULT_INTERVAL_SECONDS = 10.0


def sample_interval(env: Mapping[str, str], default: float = DEFAULT_INTERVAL_SECONDS) -> float:
    """The sampling interval in seconds: ``LOGCAPTURE_SAMPLE_INTERVAL`` when set, else
    ``default`` (the admin config's number). Raises ConfigError naming the variable when the
    value is not a finite number > 0."""
    raw = env.get(INTERVAL_ENV)
    if raw is None or raw.strip() == "":
        value = default
        where = "the default interval"
    else:
        where = f"{INTERVAL_ENV}={raw!r}"
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{where}: not a number of seconds", path=INTERVAL_ENV,
                              key=INTERVAL_ENV) from None
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{where}: the sampling interval must be a number of seconds > 0",
                          path=INTERVAL_ENV, key=INTERVAL_ENV)
    return float(value)


def _cpu_model(proc_root: Path) -> str:
    try:
        for line in (proc_root / "cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model", "Processor"):
                return value.strip()
    except OSError:
        pass
    import platform  # only here: ~2 ms to import, and processor() may run `uname -p`

    return platform.processor() or platform.machine()


def _memory_total_bytes(proc_root: Path) -> int | None:
    try:
        for line in (proc_root / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    return None


def inventory(nvml: Any = None, env: Mapping[str, str] | None = None, *,
              gpu: GpuCollector | None = None, proc_root: str | Path = "/proc",
              hostname: str | None = None, gpus: bool = True,
              warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """What the job runs on, for ``Start.inventory``: host, cpu_model, cpus (logical CPUs of
    the node), cpus_allocated, memory_total_bytes, gpus (every GPU of the node, see
    ``GpuCollector.inventory``), driver_version, cuda_version, job_gpus (UUIDs of the job's
    GPUs; MIG UUIDs for MIG slices). Pass the run's ``gpu`` collector to reuse its NVML session
    and its idea of the job's GPUs; otherwise one is built from ``nvml`` and ``env``. Never
    raises; problems go to ``warn``. ``gpus`` False: the CPU and memory part alone, without
    starting NVML (which costs a process ~50 ms of CPU and ~20 MiB on a GPU node)."""
    env = os.environ if env is None else env
    proc = Path(proc_root)
    node = {"host": hostname if hostname is not None else socket.gethostname(),
            "cpu_model": _cpu_model(proc), "cpus": os.cpu_count(),
            "cpus_allocated": cpus_allocated_from_env(env),
            "memory_total_bytes": _memory_total_bytes(proc)}
    if not gpus:
        return node
    own = gpu is None
    if gpu is None:
        gpu = GpuCollector(nvml=nvml, job_gpus=job_gpus_from_env(env))
    try:
        devices = gpu.inventory()
        versions = gpu.versions()
        job_gpus = gpu.job_gpu_uuids()
    finally:
        if own:
            gpu.close()
    if warn is not None:
        for message in gpu.pop_warnings():
            _call_warn(warn, message)
    return {**node, "gpus": devices, "driver_version": versions["driver_version"],
            "cuda_version": versions["cuda_version"], "job_gpus": job_gpus}


def _call_warn(warn: Callable[[str], None], message: str) -> None:
    try:
        warn(message)
    except Exception:  # a broken warning sink must not stop sampling
        pass


class Sampler:
    """Runs the collectors every ``interval`` seconds in a background thread and hands each
    ``Sample`` to ``emit``; warnings (each distinct one once) go to ``warn``.

    ``Sample``: run, stream ``sample:<node>``, seq from ``seq_start`` (0) up, ts from
    ``clock`` (epoch seconds), node, gpus = ``gpu.collect()``, job = ``job.collect()``.
    The first sample is taken at ``start()``, then one per interval on a fixed grid (a slow
    sample skips ticks rather than bunching up), and a last one at ``stop()``; a moment at
    which the job collector finds no process of the job gives no sample.
    """

    def __init__(self, run: str, node: str, *, gpu: GpuCollector | None = None,
                 job: JobCollector | None = None,
                 interval: float = DEFAULT_INTERVAL_SECONDS,
                 emit: Callable[[Sample], None],
                 warn: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 seq_start: int = 0):
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be a number of seconds > 0, not {interval!r}")
        self.run = run
        self.node = node
        self.stream = f"sample:{node}"
        self.gpu = gpu
        self.job = job
        self.interval = float(interval)
        self.emit = emit
        self.warn = warn
        self.clock = clock
        self.monotonic = monotonic
        self._seq = self._seq_start = seq_start
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._warned: set[str] = set()

    @property
    def next_seq(self) -> int:
        return self._seq

    def counts(self) -> dict[str, int]:
        """For the end record: samples taken, warnings given, and the job collector's counts
        of normal events (``JobCollector.counts()``). Never raises."""
        out = {"samples": self._seq - self._seq_start, "warnings": len(self._warned)}
        try:
            if self.job is not None and hasattr(self.job, "counts"):
                out.update(self.job.counts())
        except Exception:  # a broken collector must not cost the end record
            pass
        return out

    def _warn(self, message: str) -> None:
        if message in self._warned or self.warn is None:
            return
        self._warned.add(message)
        _call_warn(self.warn, message)

    def _drain(self, collector: Any) -> None:
        try:
            for message in collector.pop_warnings():
                self._warn(message)
        except Exception:
            pass

    def _collect(self, collector: Any, what: str, empty: Any) -> Any:
        """``collector.collect()``, or ``empty`` after a warning when it fails; then the
        collector's own warnings."""
        try:
            got = collector.collect()
        except Exception as e:
            self._warn(f"{what} sampling failed: {type(e).__name__}: {e}")
            got = empty
        self._drain(collector)
        return got

    def sample_once(self) -> Sample | None:
        """Collect, emit and return one Sample; None when the job has no process now (before
        it started or after it ended: such a sample would describe no job, an RSS of 0 and a
        GPU someone else may use). Never raises."""
        with self._lock:
            job: dict[str, Any] = {}
            gpus: list[dict[str, Any]] = []
            # job first: the GPU collector attributes process memory through job.pids()
            if self.job is not None:
                job = self._collect(self.job, "job", job)
                if job.get("processes") == 0:
                    return None
            if self.gpu is not None:
                gpus = self._collect(self.gpu, "GPU", gpus)
            try:
                ts = float(self.clock())
            except Exception:
                ts = time.time()
            sample = Sample(run=self.run, stream=self.stream, seq=self._seq, ts=ts,
                            node=self.node, gpus=gpus, job=job)
            self._seq += 1
            try:
                self.emit(sample)
            except Exception as e:
                self._warn(f"sample could not be handed on: {type(e).__name__}: {e}")
            return sample

    def start(self) -> None:
        """Take the first sample now and keep sampling in a daemon thread. Idempotent."""
        with self._lock:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(target=self._loop, name="logcapture-sampler",
                                            daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_at = self.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_at += self.interval
            now = self.monotonic()
            if next_at <= now:  # fell behind: skip the missed ticks
                next_at = now + self.interval - (now - next_at) % self.interval
            if self._stop.wait(next_at - now):
                break

    def stop(self, final_sample: bool = True) -> None:
        """Stop the thread, wait for it, take one last sample (unless ``final_sample`` is
        False) and release NVML. Idempotent: only the first call does anything."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if final_sample:
            self.sample_once()
        if self.gpu is not None:
            try:
                self.gpu.close()
            except Exception:
                pass
