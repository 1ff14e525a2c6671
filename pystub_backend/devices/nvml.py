"""The DeviceSystem of a machine with NVIDIA's driver, through NVML (`nvidia-ml-py`, the `gpu` extra).

NVML is imported only here, and only by `open_nvml`: a CPU install never loads it. NVML creates
no CUDA context, so the parent process can enumerate and measure GPUs without holding device
memory. A reading a GPU does not support (NVML_ERROR_NOT_SUPPORTED, e.g. power on some boards)
is None rather than an error.
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
        if not self._open or not 0 <= device_id < len(self._handles):
            raise DeviceError(f"no visible GPU {device_id}")
        handle, nvml = self._handles[device_id], self._nvml
        utilization = self._value(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        memory = self._value(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        return GpuReading(
            utilization=utilization,
            memory_total_bytes=None if memory is None else int(memory.total),
            memory_used_bytes=None if memory is None else int(memory.used),
            power_watts=self._value(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / _MILLI),
            power_limit_watts=self._value(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / _MILLI),
            energy_joules=self._value(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / _MILLI))

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


def open_nvml(environ: Mapping[str, str]) -> NvmlSystem | None:
    """NVML's view of the visible GPUs; None when nvidia-ml-py is not installed or NVML cannot
    start (no driver: NVMLError_LibraryNotFound / DriverNotLoaded), i.e. "no GPU"."""
    try:
        import pynvml  # the `gpu` extra
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        physical = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in physical]
        names = [_text(pynvml.nvmlDeviceGetName(handle)) for handle in physical]
    except pynvml.NVMLError:
        pynvml.nvmlShutdown()
        return None
    chosen = visible_physical(uuids, environ)
    infos = [GpuInfo(logical, uuids[index], names[index]) for logical, index in enumerate(chosen)]
    return NvmlSystem(pynvml, [physical[index] for index in chosen], infos)


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str; older releases returned bytes.
    return value.decode() if isinstance(value, bytes) else value
