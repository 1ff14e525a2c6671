"""Data-type converters and BYTES serialization exactly as the original's Python helpers behave.

The converters compare with `==` against numpy scalar types, as the original does, so they take
numpy dtypes and numpy scalar types alike and return None for anything else (BF16 included).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pystub_backend.ipc.bytes_codec import BytesDecodeError, deserialize_bytes, serialize_bytes

from ._errors import TritonModelException

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
]

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_CODE_TO_NUMPY: list[tuple[int, Any]] = [
    (1, np.bool_),
    (2, np.uint8),
    (3, np.uint16),
    (4, np.uint32),
    (5, np.uint64),
    (6, np.int8),
    (7, np.int16),
    (8, np.int32),
    (9, np.int64),
    (10, np.float16),
    (11, np.float32),
    (12, np.float64),
    (13, np.object_),
]


def triton_to_numpy_type(data_type: Any) -> Any:
    """The numpy type for a `TRITONSERVER_DataType` code (1-13), else None."""
    for code, np_type in _CODE_TO_NUMPY:
        if data_type == code:
            return np_type
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The `TRITONSERVER_DataType` code of a numpy type or dtype, else None."""
    for code, np_type in _CODE_TO_NUMPY:
        if _equals(data_type, np_type):
            return code
    if _equals(data_type, np.bytes_):
        return 13
    return None


def _equals(data_type: Any, np_type: Any) -> bool:
    try:
        return bool(data_type == np_type)
    except (TypeError, ValueError):
        return False


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """`TRITON_STRING_TO_NUMPY[triton_type_string]`; raises KeyError for unknown names."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """Length-prefixed serialization of an `np.object_` / `np.bytes_` array, in C order.

    Returns `()` for an empty array and None for any other dtype, as the original does.
    """
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        return serialize_bytes(input_tensor.ravel(order="C"))
    return None


def deserialize_bytes_tensor(encoded_tensor: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """Decode serialized BYTES data into a 1-D `np.object_` array of `bytes`.

    Raises TritonModelException `Invalid bytes tensor data: ...` for malformed data.
    """
    len(encoded_tensor)  # what has no length is refused with len()'s TypeError, as in the original
    if isinstance(encoded_tensor, np.ndarray):
        encoded_tensor = np.ascontiguousarray(encoded_tensor).view(np.uint8).data
    try:
        return deserialize_bytes(encoded_tensor)
    except BytesDecodeError as exc:
        raise TritonModelException(str(exc)) from None
