"""A fake NVML: a small object implementing exactly the pynvml calls logcapture uses.

Pass an instance wherever the code takes ``nvml=`` (default ``pynvml``). Devices, MIG
instances, processes and faults are plain data::

    nv = FakeNVML([FakeGPU("GPU-aaaa", minor=1, processes=[(1234, 2 << 30)])])
    nv.gpus[0].lost = True                  # nvmlDevice* calls now raise NVMLError_GpuIsLost
    nv.gpus[0].unsupported = {"power"}      # nvmlDeviceGetPowerUsage raises NotSupported
    FakeNVML(init_error=FakeNVML.NVMLError_LibraryNotFound)   # no libnvidia-ml.so

Error classes mirror pynvml's (one subclass of NVMLError per code); ``calls`` counts calls per
function so tests can check what the code asked for. tests/test_sampler.py checks that every
NVML name the sampler uses exists both here and in the real pynvml.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    value = 999

    def __str__(self) -> str:
        return f"fake NVML error {self.value}"


def _error(name: str, value: int) -> type[NVMLError]:
    return type(name, (NVMLError,), {"value": value})


NVMLError_Uninitialized = _error("NVMLError_Uninitialized", 1)
NVMLError_InvalidArgument = _error("NVMLError_InvalidArgument", 2)
NVMLError_NotSupported = _error("NVMLError_NotSupported", 3)
NVMLError_NoPermission = _error("NVMLError_NoPermission", 4)
NVMLError_NotFound = _error("NVMLError_NotFound", 6)
NVMLError_DriverNotLoaded = _error("NVMLError_DriverNotLoaded", 9)
NVMLError_LibraryNotFound = _error("NVMLError_LibraryNotFound", 12)
NVMLError_FunctionNotFound = _error("NVMLError_FunctionNotFound", 13)
NVMLError_GpuIsLost = _error("NVMLError_GpuIsLost", 15)
NVMLError_Unknown = _error("NVMLError_Unknown", 999)

GiB = 1 << 30


@dataclass
class FakeMig:
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_total: int = 10 * GiB
    memory_used: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)


@dataclass
class FakeGPU:
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    minor: int | None = None  # None: same as the NVML index
    pci_bus_id: str = ""
    memory_total: int = 40 * GiB
    memory_used: int = 1 * GiB  # as nvidia-smi says it: without ``memory_reserved``
    memory_reserved: int = 0  # the driver's (nvmlDeviceGetMemoryInfo_v2's ``reserved``)
    utilization: int = 50
    power_mw: int = 250_000
    temperature: int = 60
    sm_clock: int = 1410
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig: list[FakeMig | None] | None = None  # None: MIG not supported; slots may be empty
    unsupported: set[str] = field(default_factory=set)  # "utilization", "power", ...
    errors: dict[str, type[NVMLError]] = field(default_factory=dict)  # field -> error to raise
    lost: bool = False


class FakeNVML:
    """Module-like: ``FakeNVML(gpus).nvmlDeviceGetCount()`` and so on."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    nvmlMemory_v2 = 0x02000028  # pynvml's version constant for nvmlDeviceGetMemoryInfo_v2

    def __init__(self, gpus: list[FakeGPU] | None = None, *,
                 init_error: type[NVMLError] | None = None,
                 driver_version: str = "550.54.15", cuda_version: int = 12040,
                 memory_v2: bool = True):
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.memory_v2 = memory_v2  # False: a driver without nvmlDeviceGetMemoryInfo_v2
        self.initialized = 0
        self.calls: Counter[str] = Counter()

    # -- helpers --------------------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        self.calls[name] += 1
        if not self.initialized:
            raise NVMLError_Uninitialized()

    def _gpu(self, handle: object, what: str) -> FakeGPU:
        gpu = handle[1] if isinstance(handle, tuple) and handle[0] == "mig" else handle
        assert isinstance(gpu, FakeGPU), handle
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if what in gpu.errors:
            raise gpu.errors[what]()
        if what in gpu.unsupported:
            raise NVMLError_NotSupported()
        return gpu

    @staticmethod
    def _mig(handle: object) -> FakeMig | None:
        return handle[2] if isinstance(handle, tuple) and handle[0] == "mig" else None

    # -- library --------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    # -- devices --------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGPU:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        self._enter("nvmlDeviceGetUUID")
        mig = self._mig(handle)
        return mig.uuid if mig else self._gpu(handle, "uuid").uuid

    def nvmlDeviceGetName(self, handle: object) -> str:
        self._enter("nvmlDeviceGetName")
        return self._gpu(handle, "name").name

    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        self._enter("nvmlDeviceGetMinorNumber")
        gpu = self._gpu(handle, "minor")
        return self.gpus.index(gpu) if gpu.minor is None else gpu.minor

    def nvmlDeviceGetPciInfo(self, handle: object) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo")
        gpu = self._gpu(handle, "pci")
        bus = gpu.pci_bus_id or f"00000000:{0x10 + self.gpus.index(gpu):02X}:00.0"
        return SimpleNamespace(busId=bus)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates")
        if self._mig(handle):  # as on real MIG slices
            self._gpu(handle, "utilization")
            raise NVMLError_NotSupported()
        gpu = self._gpu(handle, "utilization")
        return SimpleNamespace(gpu=gpu.utilization, memory=gpu.utilization // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None
                                ) -> SimpleNamespace:
        """As pynvml's: with ``version`` (``nvmlMemory_v2``) the _v2 call, whose ``used``
        leaves the driver's ``reserved`` out; without it the first call, which counts it."""
        self._enter("nvmlDeviceGetMemoryInfo" + ("_v2" if version else ""))
        if version and not self.memory_v2:
            raise NVMLError_FunctionNotFound()
        gpu = self._gpu(handle, "memory")
        src = self._mig(handle) or gpu
        reserved = 0 if isinstance(src, FakeMig) else gpu.memory_reserved
        free = src.memory_total - src.memory_used - reserved
        if version:
            return SimpleNamespace(version=version, total=src.memory_total, used=src.memory_used,
                                   reserved=reserved, free=free)
        return SimpleNamespace(total=src.memory_total, used=src.memory_used + reserved,
                               free=free)

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        self._enter("nvmlDeviceGetPowerUsage")
        gpu = self._gpu(handle, "power")
        if self._mig(handle):
            raise NVMLError_NotSupported()
        return gpu.power_mw

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature")
        assert sensor == self.NVML_TEMPERATURE_GPU
        gpu = self._gpu(handle, "temperature")
        if self._mig(handle):
            raise NVMLError_NotSupported()
        return gpu.temperature

    def nvmlDeviceGetClockInfo(self, handle: object, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo")
        assert clock == self.NVML_CLOCK_SM
        gpu = self._gpu(handle, "sm_clock")
        if self._mig(handle):
            raise NVMLError_NotSupported()
        return gpu.sm_clock

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        gpu = self._gpu(handle, "processes")
        src = self._mig(handle) or gpu
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in src.processes]

    # -- MIG ------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        gpu = self._gpu(handle, "mig")
        if gpu.mig is None:
            raise NVMLError_NotSupported()
        return [1, 1] if gpu.mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        gpu = self._gpu(handle, "mig")
        return len(gpu.mig or [])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> tuple:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        gpu = self._gpu(handle, "mig")
        slots = gpu.mig or []
        if not 0 <= index < len(slots) or slots[index] is None:
            raise NVMLError_NotFound()
        return ("mig", gpu, slots[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: object) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        mig = self._mig(handle)
        if mig is None:
            raise NVMLError_InvalidArgument()
        return mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: object) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        mig = self._mig(handle)
        if mig is None:
            raise NVMLError_InvalidArgument()
        return mig.compute_instance_id


def gpus(n: int, **kw: object) -> list[FakeGPU]:
    """``n`` plain GPUs with UUIDs GPU-0000…, GPU-0001…"""
    return [FakeGPU(f"GPU-{i:04d}{'a' * 4}-1111-2222-3333-444444444444", **kw)  # type: ignore[arg-type]
            for i in range(n)]
