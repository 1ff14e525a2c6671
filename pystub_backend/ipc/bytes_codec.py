"""BYTES tensor serialization (docs/reference/model-api.md#bytes-tensors).

Layout, elements in C order, nothing else:

    +----------------------+-----------------+----------------------+-----
    | uint32 LE length n0  | n0 bytes        | uint32 LE length n1  | ...
    +----------------------+-----------------+----------------------+-----
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

__all__ = ["serialize_bytes", "deserialize_bytes", "BytesDecodeError", "count_elements"]

_LEN = struct.Struct("<I")


class BytesDecodeError(ValueError):
    """Malformed serialized BYTES data; the message is the text pb_utils reports."""


def _as_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, np.bytes_):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_bytes(items: Iterable[object]) -> bytes:
    """Length-prefix every element; `bytes` pass as they are, anything else as UTF-8 of `str(x)`."""
    encoded = [_as_bytes(item) for item in items]
    if not encoded:
        return b""
    lengths = np.fromiter((len(e) for e in encoded), dtype="<u4", count=len(encoded))
    prefixes = lengths.tobytes()
    parts: list[bytes] = [b""] * (2 * len(encoded))
    parts[0::2] = [prefixes[i : i + 4] for i in range(0, len(prefixes), 4)]
    parts[1::2] = encoded
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | bytearray | memoryview, count: int | None = None) -> np.ndarray:
    """Decode into a 1-D object array of `bytes`.

    With `count`, exactly that many elements are read and trailing data is an error; without it,
    elements are read until the buffer ends.
    """
    view = memoryview(buffer).cast("B")
    size = len(view)
    items: list[bytes] = []
    offset = 0
    while offset < size if count is None else len(items) < count:
        if offset + 4 > size:
            raise BytesDecodeError("Invalid bytes tensor data: incomplete length field")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > size:
            raise BytesDecodeError("Invalid bytes tensor data: string extends beyond buffer")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and offset != size:
        raise BytesDecodeError("Invalid bytes tensor data: unexpected data after the last element")
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def count_elements(buffer: bytes | memoryview) -> int:
    """Number of elements in serialized BYTES data; raises BytesDecodeError when malformed."""
    view = memoryview(buffer).cast("B")
    size = len(view)
    offset = count = 0
    while offset < size:
        if offset + 4 > size:
            raise BytesDecodeError("Invalid bytes tensor data: incomplete length field")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4 + length
        if offset > size:
            raise BytesDecodeError("Invalid bytes tensor data: string extends beyond buffer")
        count += 1
    return count
