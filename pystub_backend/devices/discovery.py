"""Which DeviceSystem this machine has: the fake one (tests), NVML's, or none."""

from __future__ import annotations

from collections.abc import Mapping

from pystub_backend.devices.fake_engine import FAKE_VARIABLE
from pystub_backend.devices.interface import DeviceError, DeviceMemory, DeviceSystem, GpuInfo, GpuReading

__all__ = ["NoDevices", "discover", "device_memory"]


class NoDevices:
    """A machine without a usable GPU (no driver, no `gpu` extra, or none visible)."""

    def gpus(self) -> list[GpuInfo]:
        return []

    def reading(self, device_id: int) -> GpuReading:
        raise DeviceError(f"no visible GPU {device_id}")

    def process_memory(self) -> dict[int, dict[int, int]]:
        return {}

    def close(self) -> None:
        return None


def discover(environ: Mapping[str, str]) -> DeviceSystem:
    """The GPUs visible to this process (CUDA_VISIBLE_DEVICES honoured). Never raises: a missing
    driver or library means no GPU. NVML is imported only when the `gpu` extra is installed."""
    if environ.get(FAKE_VARIABLE):
        from pystub_backend.devices.fake import fake_system

        return fake_system(environ)
    from pystub_backend.devices.nvml import open_nvml  # imports pynvml only when installed

    system = open_nvml(environ)
    return NoDevices() if system is None or not system.gpus() else system


def device_memory(environ: Mapping[str, str]) -> DeviceMemory:
    """The memory of this process's GPUs: the fake's under PYSTUB_FAKE_GPUS, else the CUDA runtime
    (imported now, creating the CUDA context on first use). Raises DeviceError without the `gpu` extra."""
    from pystub_backend.devices.numbering import device_numbering

    if environ.get(FAKE_VARIABLE):
        from pystub_backend.devices.fake import fake_memory

        return fake_memory()
    from pystub_backend.devices.cuda_runtime import open_cuda

    return open_cuda(device_numbering())
