"""Tensor placement: writing a tensor into an arena (or a client's region) as a wire tuple, and
viewing one back.

    wire tensor   = WireTensor(name, datatype, shape, handle)            pystub_backend.ipc.records
    arena handle  = [segment, offset, nbytes]                       pystub_backend.ipc.arena.Handle
    region handle = [generation, offset, nbytes, key, inode]        bytes in a client's region
                    [generation, offset, nbytes, "cuda:<device>", IPC handle]   ... in its CUDA memory

A region handle names bytes in a system shared memory region a client registered
(docs/reference/protocol.md#system-shared-memory-extension), so that a tensor the client already put in shared
memory crosses to the stub without a copy through the backend:

    generation  the registration, unique per backend; the stub caches its mapping under it and
                drops it when the backend says the registration is gone (ClientShmForget)
    offset      from the start of the shm object (the region's own offset included)
    key, inode  the POSIX shm name and the object the backend mapped when the client registered
                it; a reader refuses a different object found behind the same name

The two forms differ by length, so code that handles only arena handles (release, free) can never
mistake one for the other: unpacking a region handle as `(segment, offset, nbytes)` fails.

Numeric tensors are viewed in place (read-only numpy views: zero copy on the reading side); BYTES
tensors are decoded into object arrays of `bytes`, the form models expect.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from pystub_backend.ipc.arena import EMPTY_HANDLE, ArenaReader, ArenaWriter
from pystub_backend.ipc.bytes_codec import deserialize_bytes
from pystub_backend.ipc.dtypes import numpy_dtype
from pystub_backend.ipc.records import WireTensor

__all__ = ["place", "to_array", "wire_handle", "region_handle", "is_region_handle", "place_in_region",
           "RegionViews", "RegionTooSmallError", "cuda_region_handle", "cuda_region_device"]

_REGION_HANDLE_LENGTH = 5


class RegionViews(Protocol):
    """What maps region handles: the stub's cache of client regions (pystub_backend.stub.features.client_shm)."""

    def view(self, handle: list[Any], writable: bool = False) -> memoryview:
        """The handle's bytes. Raises ValueError when they cannot be mapped."""
        ...


class RegionTooSmallError(ValueError):
    """An output does not fit the region bytes the client gave it; the message is Triton's text."""


def region_handle(generation: int, offset: int, nbytes: int, key: str, inode: int) -> list[Any]:
    return [generation, offset, nbytes, key, inode]


def is_region_handle(handle: list[Any]) -> bool:
    return len(handle) == _REGION_HANDLE_LENGTH


_CUDA_KEY = "cuda:"


def cuda_region_handle(generation: int, offset: int, nbytes: int, device_id: int, ipc_handle: bytes) -> list[Any]:
    """A region handle into a client's CUDA shared memory: the key names the device, the last item
    is the client's CUDA IPC handle (which the stub opens; the backend never does)."""
    return [generation, offset, nbytes, f"{_CUDA_KEY}{device_id}", ipc_handle]


def cuda_region_device(handle: list[Any]) -> int | None:
    """The device of a CUDA region handle; None for a system region's handle."""
    key = handle[3]
    return int(key[len(_CUDA_KEY):]) if isinstance(key, str) and key.startswith(_CUDA_KEY) else None


def place(writer: ArenaWriter, name: str, datatype: str, shape: list[int] | tuple[int, ...],
          buffer: Any) -> WireTensor:
    """Write `buffer` into the arena and return the wire tensor. (Data already in the arena, from
    `pb_utils.new_output_array`, is claimed by the stub before this: pystub_backend.stub.output_buffers.)

    Raises ArenaFullError when the arena cannot hold it.
    """
    return WireTensor(name, datatype, list(shape), list(writer.write(buffer)))


def place_in_region(regions: RegionViews, name: str, datatype: str, shape: list[int] | tuple[int, ...],
                    buffer: Any, target: list[Any]) -> WireTensor:
    """Write `buffer` at the start of the region bytes `target` names (a client's shm output) and
    return the wire tensor, whose handle is empty: the data are already where the client reads them.

    Raises RegionTooSmallError when the data do not fit, ValueError when the region cannot be mapped.
    """
    source = memoryview(buffer)
    nbytes = source.nbytes
    if nbytes > target[2]:
        raise RegionTooSmallError(
            f"shared memory size specified with the request for output '{name}' ({target[2]} bytes) "
            f"should be at least {nbytes} bytes to hold the results")
    if nbytes:
        destination = regions.view(target, writable=True)
        # cast() accepts only C-contiguous views; anything else is gathered first.
        flat = source.cast("B") if source.c_contiguous else memoryview(source.tobytes())
        destination[:nbytes] = flat
    return WireTensor(name, datatype, list(shape), list(EMPTY_HANDLE))


def wire_handle(wire_tensor: WireTensor) -> list[int]:
    return wire_tensor[3]


def to_array(reader: ArenaReader, wire_tensor: WireTensor, regions: RegionViews | None = None) -> np.ndarray:
    """The tensor as a numpy array: a read-only view for numeric types, decoded for BYTES.

    `regions` maps region handles; without it a region handle is refused. Raises ValueError for a
    handle or size that does not match the datatype and shape (or a region that cannot be mapped),
    and BytesDecodeError (a ValueError) for malformed BYTES data.
    """
    name, datatype, shape, handle = wire_tensor
    if is_region_handle(handle):
        if regions is None:
            raise ValueError(f"tensor '{name}' lives in a client shared memory region, "
                             f"which this reader cannot map")
        view = regions.view(handle)
    else:
        view = reader.view(handle)
    count = 1
    for dim in shape:
        count *= dim
    if datatype == "BYTES":
        return deserialize_bytes(view, count).reshape(shape)
    # BF16 has no numpy type: its raw bits travel as uint16 (pb_utils keeps the tensor BF16).
    array = np.frombuffer(view, dtype="<u2" if datatype == "BF16" else numpy_dtype(datatype))
    if array.size != count:
        raise ValueError(f"tensor '{name}' holds {array.size} elements, its shape {shape} needs {count}")
    return array.reshape(shape)
