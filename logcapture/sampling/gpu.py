"""GPU figures through NVML, and which GPUs are the job's.

The NVML library is a constructor argument (``nvml``, a module-like object defaulting to
``pynvml``) so tests pass ``tests/fakenvml.py`` instead of patching the module.

Which GPUs are the job's (docs/sampling.md, "The index trap"): Slurm's GPU ids
(``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``) are indexes into the node's gres list, whose order is
the order of the ``File=/dev/nvidiaN`` device files, i.e. the device *minor number*; NVML's
index is PCI bus order; CUDA's ordinal (``CUDA_VISIBLE_DEVICES=0,1``) is "fastest first" unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and is relative to what the device cgroup lets the job see. The
three orders agree on many machines and disagree on some, so numbers are never matched against
NVML indexes when anything better is known: UUIDs (``GPU-...``, ``MIG-...``) are matched by
UUID, Slurm ids by ``nvmlDeviceGetMinorNumber``.

Faults never raise out of ``collect()``: no library, no GPU, a GPU that fell off the bus, a
field a device does not support each become one warning (``pop_warnings()``), and the collector
carries on with what it has.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms (records.py)
if TYPE_CHECKING:
    from typing import Any

# Where the NVIDIA kernel driver shows itself, on the host and in GPU containers alike. NVML
# cannot work without it, so on a node with none of these pynvml is not even imported (it
# costs ~30 ms of CPU at every job start; docs/performance.md).
DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl")


def default_nvml() -> Any:
    """pynvml when this node has an NVIDIA driver, else None ("NVML unavailable")."""
    if not any(os.path.exists(p) for p in DRIVER_PATHS):
        return None
    try:  # nvidia-ml-py; only imported, the shared library is loaded by nvmlInit()
        import pynvml
    except ImportError:  # pragma: no cover - it is a declared dependency
        return None
    return pynvml

# Token prefixes returned by job_gpus_from_env (a bare "N" is taken as an NVML index).
MINOR = "minor:"  # a Slurm GPU id: the /dev/nvidiaN minor number
INDEX = "index:"  # a CUDA ordinal, taken as the NVML index (PCI bus order)

_OLD_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")  # before driver R470
_NOT_DEVICES = {"", "nodevfiles", "none", "void", "-1"}


def job_gpus_from_env(env: Mapping[str, str]) -> list[str] | None:
    """The job's GPUs as tokens for ``GpuCollector(job_gpus=...)``, or None for "all GPUs".

    Precedence (docs/sampling.md):
    1. ``CUDA_VISIBLE_DEVICES`` when it holds UUIDs (``GPU-...``, ``MIG-...``): unambiguous.
    2. ``SLURM_STEP_GPUS`` then ``SLURM_JOB_GPUS``: Slurm's global GPU ids on this node, not
       relative to the device cgroup -> ``minor:N``. The step variable comes first because
       ``SLURM_JOB_GPUS`` describes the batch host and is copied unchanged to other nodes.
    3. ``CUDA_VISIBLE_DEVICES`` holding ordinals -> ``index:N`` (NVML index; right when
       ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and no device cgroup renumbers the devices).
    4. Nothing set: ``[]`` inside a Slurm job (no GPUs were allocated), None outside Slurm.
    """
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    cvd_tokens = _split(cvd) if cvd is not None else None
    if cvd_tokens and any(t.startswith(("GPU-", "MIG-")) for t in cvd_tokens):
        return cvd_tokens
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = env.get(name)
        if value is not None:
            return [MINOR + t if t.isdigit() else t for t in _split(value)]
    if cvd_tokens is not None:
        return [INDEX + t if t.isdigit() else t for t in cvd_tokens]
    if env.get("SLURM_JOB_ID"):
        return []
    return None


def _split(value: str) -> list[str]:
    tokens = [t.strip() for t in value.split(",")]
    if len(tokens) == 1 and tokens[0].lower() in _NOT_DEVICES:
        return []
    return [t for t in tokens if t]


class _Device:
    """One GPU (or MIG device) as the collector knows it. ``index``: the NVML index of the
    physical GPU (the parent's for a MIG device); ``lost``: it stopped answering;
    ``unsupported``: the queries it refused. (A plain class, not a dataclass: this module is
    on every job's start path, and ``dataclasses`` costs ~10 ms to import: records.py.)"""

    __slots__ = ("handle", "uuid", "index", "name", "minor", "mig", "parent_uuid",
                 "gpu_instance_id", "compute_instance_id", "lost", "unsupported")

    def __init__(self, handle: Any, uuid: str, index: int, name: str, minor: int | None = None,
                 mig: bool = False, parent_uuid: str | None = None):
        self.handle = handle
        self.uuid = uuid
        self.index = index
        self.name = name
        self.minor = minor
        self.mig = mig
        self.parent_uuid = parent_uuid
        self.gpu_instance_id: int | None = None
        self.compute_instance_id: int | None = None
        self.lost = False
        self.unsupported: set[str] = set()


class _Lost(Exception):
    pass


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuCollector:
    """Per-GPU figures of the job's GPUs: ``collect() -> list[dict]``.

    ``job_gpus``: tokens from ``job_gpus_from_env`` (``GPU-…``/``MIG-…`` UUIDs or prefixes,
    ``minor:N``, ``index:N`` or ``N``); None means every GPU of the node, ``[]`` none
    (``collect()`` then never loads NVML; ``inventory()`` still lists the node's GPUs).
    ``pids_fn`` returns the job's pids, to attribute per-process GPU memory; without it
    ``job_memory_used_bytes`` is None.
    """

    def __init__(self, nvml: Any = None, job_gpus: list[str] | None = None,
                 pids_fn: Callable[[], Iterable[int]] | None = None):
        self.nvml = nvml  # None: default_nvml() at the first use
        self._default_nvml = nvml is None
        self.job_gpus = None if job_gpus is None else list(job_gpus)
        self.pids_fn = pids_fn
        self._lock = threading.Lock()
        self._state = "new"  # new -> ready | off; closed
        self._physical: list[_Device] = []
        self._mig: dict[str, list[_Device]] = {}
        self._devices: list[_Device] = []
        self._warned: set[Any] = set()
        self._warnings: list[str] = []

    # -- warnings ---------------------------------------------------------------------------

    def _warn(self, key: Any, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self._warnings.append(message)

    def pop_warnings(self) -> list[str]:
        """New warnings since the last call (each distinct problem is reported once)."""
        with self._lock:
            out, self._warnings = self._warnings, []
        return out

    # -- start-up -----------------------------------------------------------------------------

    def _ensure_started(self) -> bool:
        if self._state == "new":
            self._state = "off"
            if self.nvml is None and self._default_nvml:
                self.nvml = default_nvml()
                if self.nvml is None:
                    if self.job_gpus != []:
                        self._warn("init", "NVML unavailable (no NVIDIA driver on this node): "
                                   "no GPU figures")
                    return False
            if self.nvml is None:
                self._warn("init", "NVML unavailable (pynvml not importable): no GPU figures")
                return False
            try:
                self.nvml.nvmlInit()
            except Exception as e:  # LibraryNotFound, DriverNotLoaded, NoPermission, OSError
                if self.job_gpus != []:  # silent for a job that was given no GPUs
                    self._warn("init", f"NVML unavailable ({_errname(e)}): no GPU figures")
                return False
            self._state = "ready"
            try:
                self._enumerate()
            except Exception as e:
                self._warn("count", f"NVML could not list GPUs ({_errname(e)}): no GPU figures")
                self._physical = []
            self._devices = self._resolve()
        return self._state == "ready"

    def _enumerate(self) -> None:
        nv = self.nvml
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(h))
            except Exception as e:
                self._warn(("enum", i), f"GPU at NVML index {i} unusable ({_errname(e)})")
                continue
            name = self._opt(nv.nvmlDeviceGetName, h)
            dev = _Device(h, uuid, i, "" if name is None else _text(name))
            dev.minor = self._opt(nv.nvmlDeviceGetMinorNumber, h)
            self._physical.append(dev)

    @staticmethod
    def _opt(fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None when it fails: for figures that may be missing."""
        try:
            return fn(*args)
        except Exception:
            return None

    def _mig_devices(self, parent: _Device) -> list[_Device]:
        if parent.uuid in self._mig:
            return self._mig[parent.uuid]
        nv, h, out = self.nvml, parent.handle, []
        try:
            current = nv.nvmlDeviceGetMigMode(h)[0]
        except Exception:  # NotSupported on GPUs without MIG
            current = 0
        if current == 1:  # NVML_DEVICE_MIG_ENABLE
            for j in range(self._opt(nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                except Exception:  # NVMLError_NotFound: an empty slot
                    continue
                uuid = self._opt(nv.nvmlDeviceGetUUID, mh)
                mig = _Device(mh, "" if uuid is None else _text(uuid), parent.index,
                              parent.name, parent.minor, mig=True, parent_uuid=parent.uuid)
                mig.gpu_instance_id = self._opt(nv.nvmlDeviceGetGpuInstanceId, mh)
                mig.compute_instance_id = self._opt(nv.nvmlDeviceGetComputeInstanceId, mh)
                out.append(mig)
        self._mig[parent.uuid] = out
        return out

    def _resolve(self) -> list[_Device]:
        if self.job_gpus is None:
            return list(self._physical)
        out: list[_Device] = []
        for token in self.job_gpus:
            dev = self._match(token)
            if dev is None:
                self._warn(("match", token),
                           f"job GPU {token!r} matches no NVML device; it is not sampled")
            elif all(d.uuid != dev.uuid for d in out):
                out.append(dev)
        return out

    def _match(self, token: str) -> _Device | None:
        phys = self._physical
        if token.startswith(MINOR) and token[len(MINOR):].isdigit():
            n = int(token[len(MINOR):])
            return next((d for d in phys if d.minor == n), None)
        if token.startswith(INDEX) or token.isdigit():
            n = int(token.removeprefix(INDEX)) if token.removeprefix(INDEX).isdigit() else -1
            return next((d for d in phys if d.index == n), None)
        old = _OLD_MIG.match(token)
        if old:
            parent = next((d for d in phys if d.uuid == old.group(1)), None)
            gi, ci = int(old.group(2)), int(old.group(3))
            migs = self._mig_devices(parent) if parent else []
            return next((m for m in migs
                         if m.gpu_instance_id == gi and m.compute_instance_id == ci), None)
        if token.startswith("MIG-"):
            migs = [m for p in phys for m in self._mig_devices(p)]
            return _by_uuid(migs, token)
        if token.startswith("GPU-"):
            return _by_uuid(phys, token)
        return None

    # -- sampling -----------------------------------------------------------------------------

    def collect(self) -> list[dict[str, Any]]:
        """One reading of every job GPU still on the bus. Never raises."""
        with self._lock:
            try:
                # a job given no GPUs never loads NVML while it runs
                if self.job_gpus == [] or not self._ensure_started():
                    return []
                pids = None
                if self.pids_fn is not None:
                    try:
                        pids = set(self.pids_fn())
                    except Exception as e:
                        self._warn("pids", f"job pids unavailable for GPU memory ({_errname(e)})")
                out = []
                for dev in self._devices:
                    if dev.lost:
                        continue
                    try:
                        out.append(self._read_device(dev, pids))
                    except _Lost as e:
                        dev.lost = True
                        self._warn(("lost", dev.uuid),
                                   f"GPU {dev.uuid} (NVML index {dev.index}) is lost "
                                   f"({e}); no further figures from it")
                return out
            except Exception as e:  # a bug or an unexpected library state: carry on
                self._warn(("collect", type(e).__name__), f"GPU sampling failed: {_errname(e)}")
                return []

    def _read(self, dev: _Device, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        if name in dev.unsupported:
            return None
        nv = self.nvml
        try:
            return fn(dev.handle, *args)
        except nv.NVMLError_GpuIsLost as e:
            raise _Lost(_errname(e)) from None
        except (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission) as e:
            dev.unsupported.add(name)
            self._warn(("field", dev.uuid, name),
                       f"GPU {dev.uuid}: {name} not available ({_errname(e)}); left empty")
        except nv.NVMLError as e:  # transient: try again next sample
            self._warn(("field", dev.uuid, name, type(e).__name__),
                       f"GPU {dev.uuid}: reading {name} failed ({_errname(e)})")
        return None

    def _memory(self, dev: _Device) -> Any:
        """The device's memory as nvidia-smi reports it: ``nvmlDeviceGetMemoryInfo_v2``, whose
        ``used`` leaves out what the driver reserves (``reserved``, hundreds of MiB on a data
        centre GPU) where the first version counts it as used (NVML API reference,
        nvmlDeviceGetMemoryInfo_v2). A driver or binding without it: the first version, once
        known, without ``reserved``."""
        nv = self.nvml
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None and "memory_v2" not in dev.unsupported:
            try:
                return nv.nvmlDeviceGetMemoryInfo(dev.handle, version=version)
            except nv.NVMLError_GpuIsLost as e:
                raise _Lost(_errname(e)) from None
            except (nv.NVMLError_FunctionNotFound, nv.NVMLError_NotSupported,
                    nv.NVMLError_InvalidArgument, TypeError):
                dev.unsupported.add("memory_v2")  # an older driver: say nothing, use v1
            except nv.NVMLError as e:  # transient: try again next sample
                self._warn(("field", dev.uuid, "memory", type(e).__name__),
                           f"GPU {dev.uuid}: reading memory failed ({_errname(e)})")
                return None
        return self._read(dev, "memory", nv.nvmlDeviceGetMemoryInfo)

    def _read_device(self, dev: _Device, pids: set[int] | None) -> dict[str, Any]:
        nv = self.nvml
        util = self._read(dev, "utilization", nv.nvmlDeviceGetUtilizationRates)
        mem = self._memory(dev)
        power_mw = self._read(dev, "power", nv.nvmlDeviceGetPowerUsage)
        temp = self._read(dev, "temperature", nv.nvmlDeviceGetTemperature,
                          nv.NVML_TEMPERATURE_GPU)
        clock = self._read(dev, "sm_clock", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        job_mem = None
        if pids is not None:
            procs = self._read(dev, "processes", nv.nvmlDeviceGetComputeRunningProcesses)
            if procs is not None:
                # usedGpuMemory is None when NVML cannot tell (e.g. under MIG without privilege)
                job_mem = sum(p.usedGpuMemory or 0 for p in procs if p.pid in pids)
        return {
            "uuid": dev.uuid,
            "index": dev.index,
            "name": dev.name,
            "mig": dev.mig,
            "utilization_gpu_percent": None if util is None else util.gpu,
            "memory_used_bytes": None if mem is None else mem.used,
            "memory_total_bytes": None if mem is None else mem.total,
            "memory_reserved_bytes": getattr(mem, "reserved", None),
            "power_watts": None if power_mw is None else power_mw / 1000.0,
            "temperature_celsius": temp,
            "sm_clock_mhz": clock,
            "job_memory_used_bytes": job_mem,
        }

    # -- inventory ----------------------------------------------------------------------------

    def inventory(self) -> list[dict[str, Any]]:
        """Every GPU of the node (not only the job's): index, uuid, name, minor_number,
        pci_bus_id, memory_total_bytes, mig_enabled, mig_devices, job. Never raises."""
        with self._lock:
            try:
                if not self._ensure_started():
                    return []
                job_uuids = {d.uuid for d in self._devices}
                job_parents = {d.parent_uuid for d in self._devices if d.mig}
                return [self._inventory_one(d, job_uuids, job_parents) for d in self._physical]
            except Exception as e:
                self._warn(("inventory", type(e).__name__), f"GPU inventory failed: {_errname(e)}")
                return []

    def _inventory_one(self, dev: _Device, job_uuids: set[str],
                       job_parents: set[str | None]) -> dict[str, Any]:
        nv, h = self.nvml, dev.handle
        migs = self._mig_devices(dev)
        mem = self._opt(nv.nvmlDeviceGetMemoryInfo, h)
        pci_info = self._opt(nv.nvmlDeviceGetPciInfo, h)
        mig_mem = {m.uuid: self._opt(nv.nvmlDeviceGetMemoryInfo, m.handle) for m in migs}
        return {
            "index": dev.index,
            "uuid": dev.uuid,
            "name": dev.name,
            "minor_number": dev.minor,
            "pci_bus_id": None if pci_info is None else _text(pci_info.busId),
            "memory_total_bytes": None if mem is None else mem.total,
            "mig_enabled": bool(migs),
            "mig_devices": [
                {"uuid": m.uuid, "gpu_instance_id": m.gpu_instance_id,
                 "compute_instance_id": m.compute_instance_id,
                 "memory_total_bytes": None if mig_mem[m.uuid] is None else mig_mem[m.uuid].total,
                 "job": m.uuid in job_uuids}
                for m in migs
            ],
            "job": dev.uuid in job_uuids or dev.uuid in job_parents,
        }

    def job_gpu_uuids(self) -> list[str]:
        """UUIDs of the job's GPUs (MIG UUIDs for MIG devices), as resolved at start."""
        with self._lock:
            self._ensure_started()
            return [d.uuid for d in self._devices]

    def versions(self) -> dict[str, Any]:
        """driver_version and cuda_version ("12.4") of the node, None when unknown."""
        with self._lock:
            if not self._ensure_started():
                return {"driver_version": None, "cuda_version": None}
            nv = self.nvml
            cuda = self._opt(nv.nvmlSystemGetCudaDriverVersion)
            driver = self._opt(nv.nvmlSystemGetDriverVersion)
            return {
                "driver_version": None if driver is None else _text(driver),
                # NVML gives 1000*major + 10*minor: 12040 -> "12.4"
                "cuda_version": None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
            }

    def close(self) -> None:
        """Release NVML (pynvml counts nvmlInit/nvmlShutdown pairs). Idempotent."""
        with self._lock:
            if self._state == "ready":
                self._opt(self.nvml.nvmlShutdown)
            self._state = "closed"


def _by_uuid(devices: list[_Device], token: str) -> _Device | None:
    exact = next((d for d in devices if d.uuid == token), None)
    if exact is not None:
        return exact
    # CUDA accepts any unique UUID prefix in CUDA_VISIBLE_DEVICES
    prefixed = [d for d in devices if d.uuid.startswith(token)]
    return prefixed[0] if len(prefixed) == 1 else None


def _errname(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
