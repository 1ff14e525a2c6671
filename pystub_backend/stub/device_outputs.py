"""GPU tensors leaving a stub: one device-to-host copy, straight into where the bytes go.

    model's CUDA tensor ──cudaMemcpy D2H──▶ s2p arena block      (HTTP/gRPC response, BLS input)
                        └─────────────────▶ client's shm region  (output to client shared memory)

The stub copies, not the backend: the stub already has (or creates, on its first GPU tensor) the
CUDA context of its device, while a backend that copied would need a context of its own on every
GPU (hundreds of MiB each) and CUDA in the parent process. The copy lands in the memory the
backend reads from, so there is no second host copy. The tensor's owner (the producer's DLPack
deleter) is held until the copy has finished.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from pystub_backend.devices.interface import DeviceError, DeviceMemory
from pystub_backend.ipc.arena import EMPTY_HANDLE, ArenaWriter
from pystub_backend.ipc.records import WireTensor
from pystub_backend.ipc.tensors import RegionTooSmallError, RegionViews

__all__ = ["DeviceBuffer", "DeviceError", "copy_to_host", "place", "place_in_region"]

_memory: DeviceMemory | None = None
_memory_lock = threading.Lock()


@dataclass(frozen=True)
class DeviceBuffer:
    """A tensor's bytes on a GPU: where they are, how many, and what keeps them alive."""

    device_id: int
    pointer: int
    nbytes: int
    owner: Any


def _device_memory() -> DeviceMemory:
    """The device memory of this stub, opened on first use (CUDA is loaded only then)."""
    global _memory
    with _memory_lock:
        if _memory is None:  # imported here: a stub that never meets a GPU tensor loads none of it
            from pystub_backend.devices.discovery import device_memory

            _memory = device_memory(os.environ)
        return _memory


def copy_to_host(buffer: DeviceBuffer, destination: memoryview) -> None:
    """Copy the buffer's bytes into `destination` (at least `buffer.nbytes` long). Raises DeviceError."""
    if buffer.nbytes:
        _device_memory().to_host(buffer.device_id, buffer.pointer, destination[:buffer.nbytes])


def place(writer: ArenaWriter, name: str, datatype: str, shape: list[int], buffer: DeviceBuffer) -> WireTensor:
    """The tensor copied into a new s2p arena block. Raises ArenaFullError, DeviceError."""
    handle = writer.allocate(buffer.nbytes)
    try:
        copy_to_host(buffer, writer.view(handle))
    except BaseException:
        writer.free(handle)
        raise
    return WireTensor(name, datatype, list(shape), list(handle))


def place_in_region(regions: RegionViews, name: str, datatype: str, shape: list[int], buffer: DeviceBuffer,
                    target: list[Any]) -> WireTensor:
    """The tensor copied to the start of a client's region (`target`), as ipc.tensors.place_in_region
    does for host data. Raises RegionTooSmallError, ValueError (unmappable region), DeviceError."""
    if buffer.nbytes > target[2]:
        raise RegionTooSmallError(
            f"shared memory size specified with the request for output '{name}' ({target[2]} bytes) "
            f"should be at least {buffer.nbytes} bytes to hold the results")
    if buffer.nbytes:
        copy_to_host(buffer, regions.view(target, writable=True))
    return WireTensor(name, datatype, list(shape), list(EMPTY_HANDLE))
