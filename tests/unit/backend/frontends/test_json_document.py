"""The fast JSON codec (simdjson in, orjson out) means exactly what the standard `json` path meant.

Every case is decoded twice: through `decode_infer_request` (the fast path) and through the slow
path (`json.loads` + `json_to_tensor_bytes` on Python lists), and both must give the same bytes or
the same error. Responses are written by orjson and compared value for value with `json.dumps` of
`tensor_to_json`, the writer they replace.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.frontends.http.codec import OutputFormat, decode_infer_request, encode_infer_response
from pystub_backend.backend.frontends.http.json_tensors import (
    LazyArray,
    json_to_tensor_bytes,
    load_document,
    tensor_to_json,
)
from pystub_backend.backend.inference import InferResponse, Tensor

_CASES: list[tuple[str, list[int], str]] = [
    ("FP32", [2, 2], "[[1.5, -2], [3e38, 1e-7]]"),
    ("FP32", [2], "[1e39, -1e39]"),  # beyond FP32: inf, as a C cast
    ("FP64", [3], "[0.1, 2, -0.0]"),
    ("FP32", [2], "[true, 1.0]"),  # bool among numbers
    ("FP32", [2], '[1, "2"]'),
    ("FP32", [3], "[1, 2]"),  # count
    ("FP32", [1], "[1e400]"),  # json.loads: inf
    ("FP32", [1], "[NaN]"),  # json.loads accepts NaN
    ("FP32", [1], "[100000000000000000000000]"),
    ("INT8", [3], "[-128, 0, 127]"),
    ("INT8", [1], "[128]"),
    ("UINT8", [1], "[-1]"),
    ("INT32", [2], "[1.0, 2]"),  # float among integers
    ("INT64", [1], "[9223372036854775807]"),
    ("INT64", [1], "[9223372036854775808]"),
    ("UINT64", [2], "[18446744073709551615, 0]"),
    ("UINT64", [1], "[18446744073709551616]"),
    ("INT64", [1], "[-9223372036854775809]"),
    ("FP32", [1], "[123456789012345678901234567890123456789012]"),  # json: int too large for FP32
    ("UINT32", [2], "[[4294967295], [0]]"),
    ("INT16", [0], "[]"),
    ("BOOL", [2], "[true, false]"),
    ("BOOL", [1], "[1]"),
    ("BYTES", [2], '["a", "\\udc80b"]'),  # lone surrogate escape: raw byte 0x80
    ("FP16", [1], "[1.0]"),
    ("FP32", [1], "1.0"),  # not an array
]


def _slow(datatype: str, shape: list[int], data: str) -> bytes | str:
    try:
        return json_to_tensor_bytes("x", datatype, tuple(shape), json.loads(data))
    except ServerError as exc:
        return f"error: {exc}"


_PAD = " " * 5000  # past load_document's small-header limit: simdjson, not orjson


def _fast(datatype: str, shape: list[int], data: str, pad: str = "") -> bytes | str:
    body = f'{{"inputs": [{{"name": "x", "datatype": "{datatype}", "shape": {shape}, "data": {data}}}]}}{pad}'
    try:
        decoded = decode_infer_request(body.encode(), None, "m")
    except ServerError as exc:
        return f"error: {exc}"
    return bytes(decoded.request.inputs[0].data)


@pytest.mark.parametrize("pad", ["", _PAD], ids=["orjson", "simdjson"])
@pytest.mark.parametrize(("datatype", "shape", "data"), _CASES)
def test_fast_decode_matches_the_json_module(datatype: str, shape: list[int], data: str, pad: str) -> None:
    assert _fast(datatype, shape, data, pad) == _slow(datatype, shape, data)


def test_numeric_data_stays_in_the_tape_until_converted() -> None:
    document = load_document(b'{"id": "a", "inputs": [{"name": "x", "data": [1, 2]}], "p": [3]}' + _PAD.encode())
    assert isinstance(document["inputs"][0]["data"], LazyArray)
    assert document["p"] == [3] and document["id"] == "a"


@pytest.mark.parametrize("pad", ["", _PAD], ids=["orjson", "simdjson"])
def test_duplicate_keys_keep_the_last_value_as_json_does(pad: str) -> None:
    text = b'{"id": "a", "id": "b", "inputs": [{"name": "x", "name": "y"}]}' + pad.encode()
    assert load_document(text)["id"] == json.loads(text)["id"] == "b"
    assert load_document(text)["inputs"][0]["name"] == "y"


_MALFORMED = [b"{", b'{"a": 1,}', b"\xff", b"[" * 5000 + b"]" * 5000, b"[" * 100 + b"]" * 100 + b"x",
              b'{"a": 1,}' + _PAD.encode()]


@pytest.mark.parametrize("text", _MALFORMED)
def test_malformed_json_still_raises_the_json_module_error(text: bytes) -> None:
    with pytest.raises((ValueError, RecursionError)):
        load_document(text)


def _written(tensor: Tensor) -> Any:
    response = InferResponse("m", "1", outputs=[tensor])
    return json.loads(encode_infer_response(response, OutputFormat()).body)["outputs"][0]["data"]


@pytest.mark.parametrize(
    "array",
    [
        np.array([0.1, -2.5, 3e38, 1e-45], dtype=np.float32),
        np.array([0.1, 1e-300, 1e300], dtype=np.float64),
        np.array([0.5, 65504], dtype=np.float16),
        np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        np.array([2**64 - 1, 0], dtype=np.uint64),
        np.array([-128, 127], dtype=np.int8),
        np.array([True, False]),
    ],
)
def test_numeric_outputs_write_the_same_values(array: np.ndarray) -> None:
    names = {"f4": "FP32", "f8": "FP64", "f2": "FP16", "i8": "INT64", "u8": "UINT64", "i1": "INT8",
             "b1": "BOOL"}
    datatype = names[array.dtype.str[1:]]
    tensor = Tensor("O", datatype, array.shape, array.tobytes())
    expected = tensor_to_json(tensor)
    written = _written(tensor)
    assert written == expected
    assert [type(value) for value in written] == [type(value) for value in expected]


def test_bf16_outputs_write_the_same_values() -> None:
    halves = (np.array([1.5, -2.0, 3e38], dtype=np.float32).view("<u4") >> 16).astype("<u2")
    tensor = Tensor("O", "BF16", (3,), halves.tobytes())
    assert _written(tensor) == tensor_to_json(tensor)


@pytest.mark.parametrize("datatype", ["FP32", "BF16"])
def test_non_finite_outputs_keep_their_spelling(datatype: str) -> None:
    floats = np.array([np.nan, np.inf, 1], dtype=np.float32)
    data = floats.tobytes() if datatype == "FP32" else (floats.view("<u4") >> 16).astype("<u2").tobytes()
    tensor = Tensor("O", datatype, (3,), data)
    body = encode_infer_response(InferResponse("m", "1", outputs=[tensor]), OutputFormat()).body
    assert b"[NaN,Infinity,1.0]" in body
    assert math.isnan(json.loads(body)["outputs"][0]["data"][0])


def test_non_utf8_bytes_outputs_come_out_raw() -> None:
    from pystub_backend.ipc.bytes_codec import serialize_bytes

    tensor = Tensor("O", "BYTES", (2,), serialize_bytes([b"ok", b"\x80\xff"]))
    body = encode_infer_response(InferResponse("m", "1", outputs=[tensor]), OutputFormat()).body
    assert b'["ok","\x80\xff"]' in body
