"""The DeviceSystem of a machine with NVIDIA's driver, through NVML (`nvidia-ml-py`, the `gpu` extra).

NVML is imported only here, and only by `open_nvml`: a CPU install never loads it. NVML creates
no CUDA context, so the parent process can enumerate and measure GPUs without holding device
memory. A reading a GPU does not support (NVML_ERROR_NOT_SUPPORTED, e.g. power on some boards,
utilization on a MIG device) is None rather than an error.

The devices are those CUDA can enumerate, in NVML's order: each GPU, or, for a GPU in MIG mode,
its MIG devices (UUIDs "MIG-..."), which CUDA_VISIBLE_DEVICES names by UUID.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pystub_backend.devices.interface import DeviceError, GpuInfo, GpuReading
from pystub_backend.devices.visible import visible_physical

__all__ = ["NvmlSystem", "open_nvml"]

_MILLI = 1000.0


class NvmlSystem:
    """The visible GPUs of this machine. Built by `open_nvml`; `close()` shuts NVML down."""

    def __init__(self, nvml: Any, handles: list[Any], infos: list[GpuInfo]) -> None:  # noqa: ANN401 - pynvml
        self._nvml = nvml
        self._handles = handles  # by logical id
        self._infos = infos
        self._open = True

    def gpus(self) -> list[GpuInfo]:
        return list(self._infos)

    def reading(self, device_id: int) -> GpuReading:
        handle, nvml = self._handle(device_id), self._nvml
        utilization = self._value(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        memory = self._value(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        return GpuReading(
            utilization=utilization,
            memory_total_bytes=None if memory is None else int(memory.total),
            memory_used_bytes=None if memory is None else int(memory.used),
            power_watts=self._value(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / _MILLI),
            power_limit_watts=self._value(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / _MILLI),
            energy_joules=self._value(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / _MILLI))

    def process_memory(self) -> dict[int, dict[int, int]]:
        """{pid: {logical device id: bytes}}: NVML's figure of each compute process on each visible
        GPU (a process whose figure NVML cannot give, e.g. under Windows' WDDM, is left out)."""
        found: dict[int, dict[int, int]] = {}
        for device_id, handle in enumerate(self._handles if self._open else []):
            processes = self._processes(handle)
            for process in processes:
                if process.usedGpuMemory is not None:
                    per_device = found.setdefault(int(process.pid), {})
                    per_device[device_id] = per_device.get(device_id, 0) + int(process.usedGpuMemory)
        return found

    def _processes(self, handle: Any) -> list[Any]:  # noqa: ANN401 - an NVML device handle
        try:
            return list(self._nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except self._nvml.NVMLError:
            return []

    def _handle(self, device_id: int) -> Any:  # noqa: ANN401 - an NVML device handle
        if not self._open or not 0 <= device_id < len(self._handles):
            raise DeviceError(f"no visible GPU {device_id}")
        return self._handles[device_id]

    def _value(self, read: Callable[[], Any]) -> Any:  # noqa: ANN401 - whatever NVML returns
        try:
            return read()
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass


def open_nvml(environ: Mapping[str, str], nvml: Any = None) -> NvmlSystem | None:  # noqa: ANN401 - pynvml
    """NVML's view of the visible GPUs; None when nvidia-ml-py is not installed or NVML cannot
    start (no driver: NVMLError_LibraryNotFound / DriverNotLoaded), i.e. "no GPU". `nvml` is the
    module to use (a stand-in in tests), default pynvml."""
    if nvml is None:
        try:
            import pynvml  # the `gpu` extra
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        devices = _enumerable(nvml)
    except nvml.NVMLError:
        nvml.nvmlShutdown()
        return None
    chosen = visible_physical([uuid for uuid, _, _ in devices], environ)
    infos = [GpuInfo(logical, devices[index][0], devices[index][1]) for logical, index in enumerate(chosen)]
    return NvmlSystem(nvml, [devices[index][2] for index in chosen], infos)


def _enumerable(nvml: Any) -> list[tuple[str, str, Any]]:  # noqa: ANN401
    """(UUID, name, handle) of every device CUDA could enumerate: each GPU, or its MIG devices."""
    found = []
    for index in range(nvml.nvmlDeviceGetCount()):
        gpu = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(nvml.nvmlDeviceGetName(gpu))
        migs = _mig_devices(nvml, gpu)
        found += [(_text(nvml.nvmlDeviceGetUUID(h)), name, h) for h in migs] if migs else \
            [(_text(nvml.nvmlDeviceGetUUID(gpu)), name, gpu)]
    return found


def _mig_devices(nvml: Any, gpu: Any) -> list[Any]:  # noqa: ANN401
    """The MIG device handles of a GPU in MIG mode; [] for a GPU that is not (or cannot say)."""
    try:
        if nvml.nvmlDeviceGetMigMode(gpu)[0] != 1:
            return []
        slots = nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
    except (nvml.NVMLError, AttributeError):  # no MIG support, or an nvidia-ml-py without it
        return []
    handles = []
    for slot in range(slots):
        try:
            handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot))
        except nvml.NVMLError:  # an empty slot
            continue
    return handles


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str; older releases returned bytes.
    return value.decode() if isinstance(value, bytes) else value
