"""GPUs behind a small typed interface (interface.py): NVML and the CUDA runtime when the `gpu`
extra is installed and a driver is present, a fake for tests, none otherwise.

    backend ──discover()──▶ DeviceSystem (NVML | fake | none): placement, GPU metrics
    stub    ──device_memory()─▶ DeviceMemory (CUDA runtime): copies, streams, CUDA IPC handles

The fake machine (tests) is the same NVML and CUDA code on stand-ins of NVIDIA's modules.

Nothing here imports pynvml or cuda at import time: a CPU install never loads them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers; at run time each loads with its module, on first use
    from pystub_backend.devices.discovery import NoDevices, device_memory, discover
    from pystub_backend.devices.fake import (
        FAKE_VARIABLE,
        FakeCudaTensor,
        fake_array_of,
        fake_cuda_capsule,
        fake_device_array,
        fake_kernel,
        fake_memory,
        fake_side_stream,
        fake_system,
        fake_write_later,
    )
    from pystub_backend.devices.interface import (
        IPC_HANDLE_SIZE,
        DeviceError,
        DeviceMemory,
        DeviceSystem,
        GpuInfo,
        GpuReading,
    )
    from pystub_backend.devices.numbering import DeviceNumbering, device_numbering, pin
    from pystub_backend.devices.pool import BufferPool

__all__ = ["DeviceError", "DeviceMemory", "DeviceSystem", "GpuInfo", "GpuReading", "IPC_HANDLE_SIZE",
           "NoDevices", "discover", "device_memory", "BufferPool", "DeviceNumbering", "device_numbering", "pin",
           "FAKE_VARIABLE", "fake_system", "fake_memory", "fake_cuda_capsule", "fake_device_array", "fake_kernel",
           "fake_write_later", "fake_side_stream", "FakeCudaTensor", "fake_array_of"]

# Every stub imports this package (its tensors may be GPU tensors), so importing it costs nothing
# until a name is used (PEP 562).
_MODULE_OF = {"DeviceError": "interface", "DeviceMemory": "interface", "DeviceSystem": "interface",
              "GpuInfo": "interface", "GpuReading": "interface", "IPC_HANDLE_SIZE": "interface",
              "NoDevices": "discovery", "discover": "discovery", "device_memory": "discovery",
              "BufferPool": "pool", "DeviceNumbering": "numbering", "device_numbering": "numbering", "pin": "numbering",
              **{name: "fake" for name in ("FAKE_VARIABLE", "fake_system", "fake_memory", "fake_cuda_capsule",
                                           "fake_device_array", "fake_kernel", "fake_write_later", "fake_side_stream",
                                           "FakeCudaTensor", "fake_array_of")}}


def __getattr__(name: str) -> Any:  # noqa: ANN401 - whichever public name is asked for
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'pystub_backend.devices' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pystub_backend.devices.{_MODULE_OF[name]}"), name)
