"""A client's CUDA shared memory inside the stub: the stub opens the client's CUDA IPC handle (the
backend never does: it holds no CUDA context) and moves the bytes itself.

    input  in a CUDA region ──device to host──▶ host bytes the model gets (inputs arrive on the CPU)
    output to a CUDA region ◀─host to device── a host output
                            ◀─device to device─ a GPU output on the region's GPU (no host trip)
                            ◀─peer copy─────── a GPU output on another GPU (cudaMemcpyPeer, as Triton)

Every copy is done when it returns (DeviceMemory: synchronized), so the client that reads its
buffer once the response arrived reads the output, from its own process. Handles are opened once
per registration (`generation`) and closed when the backend says the registration is gone
(ClientShmForget), like system regions' mappings; the stub answers once they are closed, and the
backend answers the client's unregister only then. No work of the model's is ever queued on a
region (it sees only host copies), so closing needs no wait for the device. The region's bounds
were checked by the backend against the registered size; a handle that does not open (a bad or
stale handle, an exporter that exited) fails the request with the driver's reason.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from pystub_backend.devices.interface import DeviceError
from pystub_backend.ipc.arena import EMPTY_HANDLE
from pystub_backend.ipc.records import WireTensor
from pystub_backend.ipc.tensors import RegionTooSmallError, cuda_region_device
from pystub_backend.stub import device_outputs

__all__ = ["CudaRegionError", "read", "write", "forget", "opened"]

_lock = threading.Lock()
_opened: dict[int, tuple[int, int]] = {}  # generation -> (device, base pointer here)
_forgotten: set[int] = set()


class CudaRegionError(ValueError):
    """A CUDA region that cannot be served (INVALID_ARG for the request)."""


def _base(handle: list[Any]) -> tuple[int, int]:
    generation, device_id = handle[0], cuda_region_device(handle)
    assert device_id is not None
    with _lock:
        if generation in _forgotten:
            raise CudaRegionError("the CUDA shared memory region was unregistered")
        opened = _opened.get(generation)
        if opened is None:
            try:
                base = device_outputs._device_memory().open_handle(device_id, bytes(handle[4]))
            except DeviceError as exc:
                raise CudaRegionError(f"failed to open CUDA IPC handle of a CUDA shared memory region: {exc}") \
                    from None
            opened = _opened[generation] = (device_id, base)
    return opened


def read(handle: list[Any]) -> memoryview:
    """A host copy of the bytes the handle names (an input). Raises CudaRegionError, DeviceError."""
    device_id, base = _base(handle)
    data = bytearray(handle[2])
    if data:
        device_outputs._device_memory().to_host(device_id, base + handle[1], memoryview(data))
    return memoryview(data)


def write(name: str, datatype: str, shape: list[int], buffer: Any, target: list[Any]) -> WireTensor:  # noqa: ANN401
    """Write an output (host array or DeviceBuffer) at the start of the region bytes `target` names.
    Raises RegionTooSmallError (Triton's text), CudaRegionError, DeviceError."""
    source = None if isinstance(buffer, device_outputs.DeviceBuffer) else memoryview(buffer).cast("B")
    nbytes = buffer.nbytes if source is None else source.nbytes
    if nbytes > target[2]:
        raise RegionTooSmallError(
            f"shared memory size specified with the request for output '{name}' ({target[2]} bytes) "
            f"should be at least {nbytes} bytes to hold the results")
    if nbytes:
        device_id, base = _base(target)
        memory = device_outputs._device_memory()
        if source is not None:
            memory.from_host(device_id, base + target[1], source)
        elif buffer.device_id == device_id:
            memory.device_copy(device_id, base + target[1], buffer.pointer, nbytes)
        else:
            memory.peer_copy(device_id, base + target[1], buffer.device_id, buffer.pointer, nbytes)
    return WireTensor(name, datatype, list(shape), list(EMPTY_HANDLE))


def forget(generations: list[int]) -> None:
    """Close the handles of registrations that are gone (before returning); later uses are refused."""
    with _lock:
        _forgotten.update(generations)
        dropped = [(g, _opened.pop(g)) for g in list(_opened) if g in _forgotten]
    for _, (device_id, base) in dropped:
        try:
            device_outputs._device_memory().close_handle(device_id, base)
        except DeviceError as exc:  # nothing to answer to but the log: the registration is gone anyway
            print(f"pystub: closing a CUDA shared memory region failed: {exc}", file=sys.stderr, flush=True)


def opened() -> int:
    with _lock:
        return len(_opened)
