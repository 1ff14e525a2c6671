"""JSON in HTTP inference bodies: the documents (simdjson in, orjson out) and tensor data in JSON form.

## Documents

Why these two (measured on 262,144 FP32 values, a 5 MB body; see docs/performance.md):

    parse  json.loads 80 ms + list -> array 16 ms | orjson.loads 15 ms + 16 ms | simdjson 7.7 ms
    write  tolist 11 ms + json.dumps 136 ms       | orjson (numpy arrays) 6 ms

Headers up to 4 KiB (every binary-tensor request, small JSON tensors) are parsed by orjson into
plain objects. Larger ones go to simdjson, which parses the header into a tape without building
Python objects; everything except the inputs' `data` is converted to plain dicts and lists at
once, while each `data` stays a lazy
`simdjson.Array` that `json_to_tensor_bytes` turns into a typed array with one `as_buffer` call (no Python
float per element). orjson writes numeric outputs straight from numpy arrays.

The standard `json` module stays the authority on what a body means: any document orjson or
simdjson refuses (malformed, NaN/Infinity, lone surrogate escapes, integers past 64 bits, ...) is parsed
again by `json.loads`, which then either accepts it as before or raises the error it always
raised; likewise any header orjson cannot write (non-UTF-8 BYTES elements, non-finite floats) is
written by `json.dumps` exactly as before.

## Tensor data

Tensor data in JSON form <-> raw tensor bytes (docs/reference/protocol.md#http-inference-and-binary-tensors,
"JSON tensors"). Incoming `data` may be nested or flat and must hold exactly as many values as the shape says, each
of the JSON type the datatype needs (booleans for BOOL, integers in range for the integer types,
numbers for FP32/FP64, strings for BYTES). FP16 and BF16 cannot travel as JSON input.

Outgoing data are flat lists. BYTES elements become strings: valid UTF-8 as it is, other bytes via
`surrogateescape`, which the header encoder turns back into the raw bytes. That is what Triton does
(it writes the bytes verbatim into the JSON string); tritonclient then tells the user to ask for
binary data. A JSON input string may carry `\\udc80`..`\\udcff` escapes to send such bytes back.

Fast paths (see Documents above): numeric `data` still in simdjson's tape becomes a typed array
with one `as_buffer` call, and numeric outputs go to the JSON writer as numpy arrays. Whatever the
fast path does not accept as it is (a bool among numbers, a float among integers, a value out of
range, a wrong count) is converted the slow way, which raises the error the request deserves.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import orjson
import simdjson

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.inference import Tensor
from pystub_backend.ipc.bytes_codec import deserialize_bytes, serialize_bytes
from pystub_backend.ipc.dtypes import NUMPY_DTYPES, numpy_dtype

__all__ = ["JsonOnlyList", "LazyArray", "dump_header", "load_document", "json_to_tensor_bytes", "tensor_json_value",
           "tensor_to_json"]

LazyArray = simdjson.Array  # a JSON array not yet converted to Python objects
_SIMDJSON_ERRORS = (ValueError, RuntimeError, TypeError, UnicodeDecodeError)
# Below this many bytes orjson's plain objects cost less than simdjson's tape and proxies (a binary
# request's header: 0.5 us against 3 us); its few data values convert the slow way in no time.
_SMALL = 4096
# orjson reads an integer past 64 bits as a float, json as an int (an error the slow path names):
# such a header (19+ digits in a row, in a number or not) is left to json.
_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def load_document(text: bytes | bytearray) -> Any:
    """The parsed JSON `text`; each input's `data` array may be left as a `LazyArray`.

    Raises ValueError (json.JSONDecodeError, UnicodeDecodeError) for text that is not JSON.
    """
    if len(text) <= _SMALL and not _LONG_NUMBER.search(text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return json.loads(text)
    try:
        document = simdjson.Parser().parse(text)
    except _SIMDJSON_ERRORS:
        return json.loads(text)  # the authority: accepts what it always accepted, or says why not
    try:
        return _plain_document(document)
    except _SIMDJSON_ERRORS:
        return json.loads(text)


def _plain_document(document: Any) -> Any:
    if not isinstance(document, simdjson.Object):
        return _plain(document)
    return _convert_object(document, "inputs", _inputs)


def _convert_object(item: simdjson.Object, special: str, convert: Callable[[Any], Any]) -> Any:
    """`item` as a dict with `convert` applied to its `special` key and `_plain` to the others."""
    keys = list(item.keys())
    if len(set(keys)) != len(keys):
        return item.as_dict()  # duplicate keys: the last one wins, as in json.loads (no fast path)
    # item[key] is a lazy proxy for arrays and objects; items() would convert them all.
    return {key: convert(item[key]) if key == special else _plain(item[key]) for key in keys}


def _inputs(value: Any) -> Any:
    if not isinstance(value, simdjson.Array):
        return _plain(value)
    return [
        _convert_object(item, "data", _keep_array) if isinstance(item, simdjson.Object)
        else _plain(item)
        for item in value
    ]


def _keep_array(value: Any) -> Any:
    return value if isinstance(value, simdjson.Array) else _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def dump_header(document: dict[str, Any]) -> bytes:
    """`document` as compact UTF-8 JSON; numpy arrays in it are written as flat lists.

    Non-UTF-8 BYTES elements (carried as surrogate escapes) come out as their raw bytes, as Triton
    writes them. Raises TypeError for a value JSON cannot hold.
    """
    try:
        return orjson.dumps(document, default=_refuse, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), default=_tolist)
        return text.encode("utf-8", "surrogateescape")


class JsonOnlyList(list[float]):
    """A list that only `json.dumps` may write: it holds NaN or infinities, which orjson would
    write as null (Triton and the json module write NaN, Infinity)."""


# Subclasses of list, dict, str and int go to `_refuse` instead of being written by orjson.
_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_SUBCLASS


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is written by the json module")


def _tolist(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# -- tensor data ---------------------------------------------------------------------------------

_INTEGER_TYPES = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
# simdjson's buffer type per datatype: 'd' double, 'i' int64, 'u' uint64 (it refuses bools, strings,
# floats in an integer array and numbers out of the type's range with an error).
_BUFFER_TYPES: dict[str, Literal["d", "i", "u"]] = {"FP32": "d", "FP64": "d", "UINT64": "u",
                 **{datatype: "i" for datatype in _INTEGER_TYPES if datatype != "UINT64"}}
_BUFFER_DTYPES = {"d": np.float64, "i": np.int64, "u": np.uint64}



def _dtype(datatype: str) -> np.dtype:
    """`numpy_dtype`, from its table when it has the name (no call per tensor)."""
    dtype = NUMPY_DTYPES.get(datatype)
    return dtype if dtype is not None else numpy_dtype(datatype)

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
    expected = math.prod(shape)
    if isinstance(data, LazyArray):
        typed = _typed_array(datatype, data, expected)
        if typed is not None:
            return typed.tobytes()
        data = data.as_list()
    flat = _flatten(name, data)
    if len(flat) != expected:
        raise _invalid(
            f"unexpected number of elements in 'data' of input '{name}': shape {list(shape)} "
            f"needs {expected}, got {len(flat)}"
        )
    return convert(name, datatype, flat)


def _typed_array(datatype: str, data: LazyArray, expected: int) -> np.ndarray | None:
    """`data` (flattened) as an array of `datatype`, or None when it must take the slow path."""
    buffer_type = _BUFFER_TYPES.get(datatype)
    if buffer_type is None:
        return None
    try:
        buffer = data.as_buffer(of_type=buffer_type)
    except (ValueError, TypeError, RuntimeError):
        return None
    values = np.frombuffer(buffer, dtype=_BUFFER_DTYPES[buffer_type])
    if values.size != expected:
        return None
    dtype = _dtype(datatype)
    if buffer_type == "i" and values.size and dtype != np.int64:
        limits = np.iinfo(dtype)
        if values.min() < limits.min or values.max() > limits.max:
            return None
    # A double beyond FP32's range becomes inf, as a C cast does in Triton (and the slow path).
    with np.errstate(over="ignore"):
        return values.astype(dtype, copy=False)


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
    dtype = _dtype(datatype)
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
            return np.array(values, dtype=_dtype(datatype)).tobytes()
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


def tensor_json_value(tensor: Tensor) -> list[Any] | np.ndarray:
    """What `tensor_to_json` returns, or a flat numpy array that JSON-writes to the same values.

    Arrays only for numeric types whose values are all finite: NaN and infinities keep the slow
    path's spelling. Floats are widened to float64 because Triton writes each element as a double.
    Raises ValueError when the data do not match the shape and KeyError for an unknown datatype.
    """
    if tensor.datatype in ("BYTES", "BOOL"):
        return tensor_to_json(tensor)
    if tensor.datatype == "BF16":
        halves = np.frombuffer(tensor.data, dtype="<u2").astype("<u4")
        values = (halves << 16).view("<f4")  # exact, as in tensor_to_json
    else:
        values = np.frombuffer(tensor.data, dtype=_dtype(tensor.datatype))
    if values.dtype.kind == "f":
        values = values.astype(np.float64)
        if not np.isfinite(values).all():
            return JsonOnlyList(values.tolist())
    elif not values.dtype.isnative:
        values = values.astype(values.dtype.newbyteorder("="))
    return values


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
    return np.frombuffer(tensor.data, dtype=_dtype(tensor.datatype)).tolist()
