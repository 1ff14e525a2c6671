"""Tensor placement: writing a tensor into an arena (or a client's region) as a wire tuple, and
viewing one back.

    wire tensor   = WireTensor(name, datatype, shape, handle)            pystub_backend.ipc.records
    arena handle  = [segment, offset, nbytes]                       pystub_backend.ipc.arena.Handle
    inline handle = [-3, bytes]                                     a small tensor's bytes, in the frame
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

The forms differ by length, so code that handles only arena handles (release, free) can never
mistake one for another: unpacking a region handle as `(segment, offset, nbytes)` fails.

A small tensor travels inline (`place` with an `InlineBudget`): its bytes ride in the frame itself,
as the floor of this design does, so it costs no arena allocation, no view and no RELEASE frame
on either side. `INLINE_BYTES` bounds one tensor, the budget one frame (a batch of inline tensors
must stay far below the channel's frame limit); anything larger goes into the arena as before.

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
           "RegionViews", "RegionTooSmallError", "cuda_region_handle", "cuda_region_device", "INLINE_TAG",
           "INLINE_BYTES", "FRAME_INLINE_BYTES", "InlineBudget", "is_inline", "arena_handles", "wire_nbytes",
           "handle_view"]

_REGION_HANDLE_LENGTH = 5
INLINE_TAG = -3  # first item of an inline handle: [INLINE_TAG, bytes]
INLINE_BYTES = 1024  # the largest tensor that travels inline
FRAME_INLINE_BYTES = 32 * 1024  # inline bytes one frame may carry (the frame limit is 128 KiB)


class InlineBudget:
    """The inline bytes one frame may still carry."""

    __slots__ = ("left",)

    def __init__(self, left: int = FRAME_INLINE_BYTES) -> None:
        self.left = left


def is_inline(handle: list[Any]) -> bool:
    return bool(handle) and handle[0] == INLINE_TAG


def arena_handles(wire_tensors: list[WireTensor]) -> list[list[int]]:
    """The arena handles among `wire_tensors` (what a receiver releases): not inline, not a
    region's, not GPU memory (whose tags are negative, as the empty handle's segment is)."""
    return [t.handle for t in wire_tensors if len(t.handle) == 3 and t.handle[0] >= 0]


def wire_nbytes(wire_tensor: WireTensor) -> int:
    """How many bytes the tensor's data take (inline, arena or region)."""
    handle = wire_tensor.handle
    return len(handle[1]) if is_inline(handle) else int(handle[2]) if len(handle) > 2 else 0


def handle_view(reader: ArenaReader, handle: list[Any]) -> memoryview:
    """The bytes of an inline or arena handle (the reader's arena)."""
    return memoryview(handle[1]) if handle and handle[0] == INLINE_TAG else reader.view(handle)


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
          buffer: Any, budget: InlineBudget | None = None) -> WireTensor:
    """The wire tensor of `buffer`: inline when it is small and `budget` has room for it, else
    written into the arena. (Data already in the arena, from `pb_utils.new_output_array`, is
    claimed by the stub before this: pystub_backend.stub.output_buffers.)

    Raises ArenaFullError when the arena cannot hold it.
    """
    if budget is not None:
        data = _small_bytes(buffer)
        if data is not None and len(data) <= budget.left:
            budget.left -= len(data)
            return WireTensor(name, datatype, list(shape), [INLINE_TAG, data])
    return WireTensor(name, datatype, list(shape), list(writer.write(buffer)))


def _small_bytes(buffer: Any) -> bytes | None:
    """`buffer`'s bytes (C order) when it holds at most INLINE_BYTES, else None."""
    if isinstance(buffer, bytes):
        return buffer if len(buffer) <= INLINE_BYTES else None
    if isinstance(buffer, np.ndarray):
        return buffer.tobytes() if buffer.nbytes <= INLINE_BYTES else None
    view = memoryview(buffer)
    return view.tobytes() if view.nbytes <= INLINE_BYTES else None


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
    if handle and handle[0] == INLINE_TAG:
        view: Any = handle[1]
        if type(view) is not bytes:
            raise ValueError(f"tensor '{name}' has an inline handle without bytes")
    elif is_region_handle(handle):
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
