"""The device interface: what pystub asks of GPUs, typed, with no CUDA or NVML import.

Two small protocols, one per process side:

    backend (parent)                         stub (one per instance)
    DeviceSystem: which GPUs, readings       DeviceMemory: alloc, copy, CUDA IPC handles
      `- NVML (nvml.py), fake (fake.py)        `- CUDA runtime (cuda_runtime.py), fake (fake.py)

The parent only enumerates and measures (NVML creates no CUDA context); memory work happens
in the stubs, which own the CUDA contexts of their devices. Logical device ids are the CUDA
ones: index `i` is the `i`-th device that CUDA_VISIBLE_DEVICES leaves visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["GpuInfo", "GpuReading", "DeviceSystem", "DeviceMemory", "DeviceError", "IPC_HANDLE_SIZE", "host_address"]

IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t): what travels between processes


def host_address(buffer: memoryview) -> int:
    """The address of a C-contiguous host buffer (writable or read-only), for device copies.
    Raises DeviceError for a strided one."""
    if not buffer.c_contiguous:
        raise DeviceError("host buffers for device copies must be C-contiguous")
    return int(np.frombuffer(buffer.cast("B"), dtype=np.uint8).ctypes.data)


class DeviceError(Exception):
    """A device operation failed; the message names the operation and the driver's reason."""


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU: its logical (CUDA) id, NVML's UUID ("GPU-..."), and its product name."""

    device_id: int
    uuid: str
    name: str


@dataclass(frozen=True)
class GpuReading:
    """One sample of a GPU's gauges and counters, in Triton's units (None: the driver has no value)."""

    utilization: float | None = None  # 0.0 .. 1.0
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # since the driver was loaded


class DeviceSystem(Protocol):
    """The machine's GPUs, as the parent process sees them (no CUDA context)."""

    def gpus(self) -> list[GpuInfo]:
        """The visible GPUs in logical order (empty: none, or no driver)."""
        ...

    def reading(self, device_id: int) -> GpuReading:
        """The current sample of one GPU. Raises DeviceError when it cannot be read."""
        ...

    def process_memory(self) -> dict[int, dict[int, int]]:
        """{pid: {device id: bytes}}: the device memory each process holds on each visible GPU, as
        the driver counts it (its CUDA context included); empty without a GPU."""
        ...

    def close(self) -> None:
        """Release the driver library (idempotent)."""
        ...


class DeviceMemory(Protocol):
    """Device memory, as a stub uses it. Device ids are the server's logical ids; pointers are
    integers; every call raises DeviceError (nothing else) and leaves the calling thread's current
    device as it found it.

    Copies are done when they return: the bytes are at their destination, for any reader in any
    process. Each is ordered after the work the model queued before it on the device's default
    (legacy) stream, not after work on streams the model created non-blocking (hand pystub such a
    tensor through `__dlpack__(stream=consumer_stream(d))`, then `wait_stream(d)`)."""

    def alloc(self, device_id: int, byte_size: int) -> int:
        """A new cudaMalloc block (0 for 0 bytes)."""
        ...

    def free(self, device_id: int, pointer: int) -> None:
        """Free an `alloc` block (0: nothing). cudaFree synchronizes the device: free rarely."""
        ...

    def to_host(self, device_id: int, pointer: int, destination: memoryview) -> None:
        """Copy `len(destination)` bytes at `pointer` into host memory."""
        ...

    def from_host(self, device_id: int, pointer: int, source: memoryview) -> None:
        """Copy `source` to the device memory at `pointer`."""
        ...

    def device_copy(self, device_id: int, destination: int, source: int, nbytes: int) -> None:
        """Copy `nbytes` between two addresses on one device."""
        ...

    def peer_copy(self, destination_device: int, destination: int, source_device: int, source: int,
                  nbytes: int) -> None:
        """Copy `nbytes` from one device's memory to another's (cudaMemcpyPeer)."""
        ...

    def consumer_stream(self, device_id: int) -> int:
        """The stream (its handle as an int) on which this process consumes tensors handed over by
        DLPack: `obj.__dlpack__(stream=...)` makes it wait for the producer's work."""
        ...

    def wait_stream(self, device_id: int) -> None:
        """Wait until the work queued on `consumer_stream(device_id)` so far has finished."""
        ...

    def synchronize(self, device_id: int) -> None:
        """Wait until every stream of this process on the device is idle (cudaDeviceSynchronize)."""
        ...

    def export_handle(self, device_id: int, pointer: int) -> tuple[bytes, int]:
        """(IPC handle, offset): the handle (IPC_HANDLE_SIZE bytes) of the cudaMalloc block that
        holds `pointer`, and `pointer`'s offset in it. CUDA refuses NULL, memory another process
        exported, and memory not from cudaMalloc (caching pools, expandable segments)."""
        ...

    def open_handle(self, device_id: int, handle: bytes) -> int:
        """Map an exported allocation; returns its base pointer here (this process's own export:
        its own pointer, as CUDA cannot open it). Fails once the exporter freed it or exited."""
        ...

    def close_handle(self, device_id: int, pointer: int) -> None:
        """Unmap what `open_handle` mapped (once per open). Work still queued on the mapping must
        have finished (`synchronize`)."""
        ...
