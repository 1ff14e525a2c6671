"""GPUs behind a small typed interface (interface.py): NVML and the CUDA runtime when the `gpu`
extra is installed and a driver is present, a fake for tests, none otherwise.

    backend ──discover()──▶ DeviceSystem (NVML | fake | none): placement, GPU metrics
    stub    ──device_memory()─▶ DeviceMemory (CUDA runtime | fake): copies, CUDA IPC handles

Nothing here imports pynvml or cuda at import time: a CPU install never loads them.
"""

from pystub_backend.devices.discovery import NoDevices, device_memory, discover
from pystub_backend.devices.fake import FAKE_VARIABLE, FakeMemory, FakeSystem, fake_cuda_capsule
from pystub_backend.devices.interface import (
    IPC_HANDLE_SIZE,
    DeviceError,
    DeviceMemory,
    DeviceSystem,
    GpuInfo,
    GpuReading,
)

__all__ = ["DeviceError", "DeviceMemory", "DeviceSystem", "GpuInfo", "GpuReading", "IPC_HANDLE_SIZE",
           "NoDevices", "discover", "device_memory", "FAKE_VARIABLE", "FakeMemory", "FakeSystem",
           "fake_cuda_capsule"]
