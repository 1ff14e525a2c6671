"""Tensor data in JSON form <-> raw tensor bytes (PROTOCOL.md section 3, "JSON tensors").

Incoming `data` may be nested or flat and must hold exactly as many values as the shape says, each
of the JSON type the datatype needs (booleans for BOOL, integers in range for the integer types,
numbers for FP32/FP64, strings for BYTES). FP16 and BF16 cannot travel as JSON input.

Outgoing data are flat lists. BYTES elements become strings: valid UTF-8 as it is, other bytes via
`surrogateescape`, which the header encoder turns back into the raw bytes. That is what Triton does
(it writes the bytes verbatim into the JSON string); tritonclient then tells the user to ask for
binary data. A JSON input string may carry `\\udc80`..`\\udcff` escapes to send such bytes back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.inference import Tensor
from pystub_backend.ipc.bytes_codec import deserialize_bytes, serialize_bytes
from pystub_backend.ipc.dtypes import numpy_dtype

__all__ = ["json_to_tensor_bytes", "tensor_to_json"]

_INTEGER_TYPES = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


def json_to_tensor_bytes(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> bytes:
    """The raw bytes (BYTES: length-prefixed) of input `name`'s JSON `data`.

    Raises ServerError(INVALID_ARG) naming the input when the data do not fit datatype and shape.
    """
    if datatype in ("FP16", "BF16"):
        raise _invalid(f"receiving {datatype} data via JSON is not supported. Please use the binary data "
                       f"format for input {name}")
    convert = _CONVERTERS.get(datatype)
    if convert is None:
        raise _invalid(f"input '{name}' has unsupported datatype '{datatype}'")
    flat = _flatten(name, data)
    expected = math.prod(shape)
    if len(flat) != expected:
        raise _invalid(
            f"unexpected number of elements in 'data' of input '{name}': shape {list(shape)} "
            f"needs {expected}, got {len(flat)}"
        )
    return convert(name, datatype, flat)


def _flatten(name: str, data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise _invalid(f"'data' of input '{name}' must be an array")
    if not any(type(item) is list for item in data):
        return data  # the common flat case: no copy
    flat: list[Any] = []
    _extend_flat(flat, data)
    return flat


def _extend_flat(flat: list[Any], data: list[Any]) -> None:
    for item in data:
        if type(item) is list:
            _extend_flat(flat, item)
        else:
            flat.append(item)


def _check_types(name: str, values: list[Any], allowed: tuple[type, ...], what: str) -> None:
    # `type(x)` rather than isinstance: bool is an int subclass but is not a valid integer here.
    if not set(map(type, values)).issubset(allowed):
        raise _invalid(f"'data' of input '{name}' must contain only {what}")


def _bools(name: str, datatype: str, values: list[Any]) -> bytes:
    _check_types(name, values, (bool,), "booleans (true/false)")
    return np.array(values, dtype=np.bool_).tobytes()


def _integers(name: str, datatype: str, values: list[Any]) -> bytes:
    _check_types(name, values, (int,), "integers")
    dtype = numpy_dtype(datatype)
    if values:
        limits = np.iinfo(dtype)
        if min(values) < limits.min or max(values) > limits.max:
            raise _invalid(
                f"'data' of input '{name}' holds a value outside the range of {datatype} "
                f"[{limits.min}, {limits.max}]"
            )
    return np.array(values, dtype=dtype).tobytes()


def _floats(name: str, datatype: str, values: list[Any]) -> bytes:
    _check_types(name, values, (int, float), "numbers")
    try:
        # A double beyond FP32's range becomes inf, as a C cast does in Triton.
        with np.errstate(over="ignore"):
            return np.array(values, dtype=numpy_dtype(datatype)).tobytes()
    except OverflowError:
        message = f"'data' of input '{name}' holds an integer too large for {datatype}"
        raise _invalid(message) from None


def _strings(name: str, datatype: str, values: list[Any]) -> bytes:
    _check_types(name, values, (str,), "strings")
    try:
        return serialize_bytes([value.encode("utf-8", "surrogateescape") for value in values])
    except UnicodeEncodeError:
        message = f"'data' of input '{name}' holds a string that is not valid Unicode"
        raise _invalid(message) from None


_CONVERTERS: dict[str, Callable[[str, str, list[Any]], bytes]] = {
    "BOOL": _bools,
    "FP32": _floats,
    "FP64": _floats,
    "BYTES": _strings,
    **{datatype: _integers for datatype in _INTEGER_TYPES},
}


def tensor_to_json(tensor: Tensor) -> list[Any]:
    """The tensor's elements as a flat JSON-ready list (see the module docstring for BYTES).

    Raises ValueError when the data do not match the shape and KeyError for an unknown datatype.
    """
    if tensor.datatype == "BYTES":
        count = math.prod(tensor.shape)
        data = memoryview(tensor.data).cast("B")  # type: ignore[arg-type]
        items = deserialize_bytes(data, count)
        return [item.decode("utf-8", "surrogateescape") for item in items]
    if tensor.datatype == "BF16":
        # bfloat16 is the upper half of a float32, so widening is exact.
        halves = np.frombuffer(tensor.data, dtype="<u2").astype("<u4")
        return (halves << 16).view("<f4").tolist()
    return np.frombuffer(tensor.data, dtype=numpy_dtype(tensor.datatype)).tolist()
