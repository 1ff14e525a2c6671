"""Tensor placement: writing a tensor into an arena as a wire tuple, and viewing one back.

    wire tensor = [name, datatype, shape, handle]

Numeric tensors are viewed in place (read-only numpy views of the arena: zero copy on the reading
side); BYTES tensors are decoded into object arrays of `bytes`, the form models expect.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipc.arena import ArenaReader, ArenaWriter
from ipc.bytes_codec import deserialize_bytes
from ipc.dtypes import numpy_dtype

__all__ = ["place", "to_array", "wire_handle"]


def place(writer: ArenaWriter, name: str, datatype: str, shape: list[int] | tuple[int, ...],
          buffer: Any) -> list[Any]:
    """Write `buffer` into the arena (unless it already lives there) and return the wire tensor.

    Raises ArenaFullError when the arena cannot hold it.
    """
    handle = writer.owns(buffer) if isinstance(buffer, np.ndarray) else None
    if handle is None:
        handle = writer.write(buffer)
    return [name, datatype, list(shape), list(handle)]


def wire_handle(wire_tensor: list[Any]) -> list[int]:
    return wire_tensor[3]


def to_array(reader: ArenaReader, wire_tensor: list[Any]) -> np.ndarray:
    """The tensor as a numpy array: a read-only view for numeric types, decoded for BYTES.

    Raises ValueError for a handle or size that does not match the datatype and shape, and
    BytesDecodeError (a ValueError) for malformed BYTES data.
    """
    _, datatype, shape, handle = wire_tensor
    view = reader.view(handle)
    count = 1
    for dim in shape:
        count *= dim
    if datatype == "BYTES":
        return deserialize_bytes(view, count).reshape(shape)
    if datatype == "BF16":
        array = np.frombuffer(view, dtype="<u2")
    else:
        array = np.frombuffer(view, dtype=numpy_dtype(datatype))
    if array.size != count:
        raise ValueError(f"tensor '{wire_tensor[0]}' holds {array.size} elements, its shape {shape} needs {count}")
    return array.reshape(shape)
