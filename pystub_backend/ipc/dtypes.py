"""Data types: wire names, config names, numpy dtypes and element sizes (docs/reference/model-api.md#data-types).

The wire name (`FP32`, `BYTES`) is what travels in requests, in IPC frames and in metadata; the
config name (`TYPE_FP32`, `TYPE_STRING`) is what `config.pbtxt` uses; the code is the
`TRITONSERVER_DataType` number pb_utils reports from `Tensor.triton_dtype()`.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "WIRE_TO_NUMPY",
    "NUMPY_TO_WIRE",
    "WIRE_TO_CODE",
    "CODE_TO_WIRE",
    "element_size",
    "config_to_wire",
    "wire_to_config",
    "numpy_dtype",
    "wire_name_of",
    "NUMPY_DTYPES",
]

# Order follows the TRITONSERVER_DataType codes 1..14.
_TABLE: list[tuple[int, str, object]] = [
    (1, "BOOL", np.bool_),
    (2, "UINT8", np.uint8),
    (3, "UINT16", np.uint16),
    (4, "UINT32", np.uint32),
    (5, "UINT64", np.uint64),
    (6, "INT8", np.int8),
    (7, "INT16", np.int16),
    (8, "INT32", np.int32),
    (9, "INT64", np.int64),
    (10, "FP16", np.float16),
    (11, "FP32", np.float32),
    (12, "FP64", np.float64),
    (13, "BYTES", np.object_),
    (14, "BF16", None),
]

WIRE_TO_CODE: dict[str, int] = {wire: code for code, wire, _ in _TABLE}
CODE_TO_WIRE: dict[int, str] = {code: wire for code, wire, _ in _TABLE}
WIRE_TO_NUMPY: dict[str, object] = {wire: np_type for _, wire, np_type in _TABLE if np_type is not None}
NUMPY_TO_WIRE: dict[np.dtype, str] = {
    np.dtype(np_type): wire for _, wire, np_type in _TABLE if np_type is not None  # type: ignore[call-overload]
}
NUMPY_TO_WIRE[np.dtype(np.bytes_)] = "BYTES"

_SIZES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
          "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}


def element_size(wire: str) -> int:
    """Bytes per element, or 0 for BYTES (variable length). Raises KeyError for unknown names."""
    if wire == "BYTES":
        return 0
    return _SIZES[wire]


def config_to_wire(config_name: str) -> str:
    """`TYPE_FP32` -> `FP32`, `TYPE_STRING` -> `BYTES`."""
    name = config_name[5:] if config_name.startswith("TYPE_") else config_name
    return "BYTES" if name == "STRING" else name


def wire_to_config(wire: str) -> str:
    """`FP32` -> `TYPE_FP32`, `BYTES` -> `TYPE_STRING`."""
    return "TYPE_STRING" if wire == "BYTES" else "TYPE_" + wire


def _little_endian(wire: str) -> np.dtype:
    dtype = np.dtype(WIRE_TO_NUMPY[wire])  # type: ignore[call-overload]
    return dtype.newbyteorder("<") if dtype.itemsize > 1 and dtype.kind != "O" else dtype


# The numpy dtype of every wire name numpy has one for, computed once (hot paths look here first).
NUMPY_DTYPES: dict[str, np.dtype] = {wire: _little_endian(wire) for wire in WIRE_TO_NUMPY}


def numpy_dtype(wire: str) -> np.dtype:
    """The numpy dtype for a wire name, little-endian. Raises KeyError for BF16 and unknown names."""
    return NUMPY_DTYPES[wire]


def wire_name_of(dtype: np.dtype) -> str | None:
    """The wire name of a numpy dtype (any byte order), or None when it has none."""
    dtype = np.dtype(dtype)
    if dtype.kind == "S":
        return "BYTES"
    return NUMPY_TO_WIRE.get(dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype)
