"""The HTTP inference body codec: JSON, binary, raw and compressed requests, and responses."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import numpy as np
import pytest

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.codec import (
    INFERENCE_HEADER,
    OutputFormat,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from pystub_backend.backend.frontends.http.compression import (
    compress_body,
    decompress_body,
    is_identity,
    response_encoding,
)
from pystub_backend.backend.frontends.http.raw import RawInputSpec, decode_raw_request, raw_input_spec
from pystub_backend.backend.inference import InferResponse, Tensor, tensor_to_numpy
from pystub_backend.ipc.bytes_codec import deserialize_bytes, serialize_bytes


def _body(document: dict[str, Any], *buffers: bytes) -> tuple[bytes, int | None]:
    header = json.dumps(document).encode()
    if not buffers:
        return header, None
    return header + b"".join(buffers), len(header)


def _decode(document: dict[str, Any], *buffers: bytes) -> Any:
    body, length = _body(document, *buffers)
    return decode_infer_request(body, length, "m", "1")


def _input(
    name: str, datatype: str, shape: Any, data: Any = None, **parameters: Any
) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if data is not None:
        tensor["data"] = data
    if parameters:
        tensor["parameters"] = parameters
    return tensor


def _invalid(document: dict[str, Any] | bytes, *buffers: bytes, match: str) -> None:
    if isinstance(document, bytes):
        body, length = document, None
    else:
        body, length = _body(document, *buffers)
    with pytest.raises(ServerError, match=match) as info:
        decode_infer_request(body, length, "m")
    assert info.value.status == Status.INVALID_ARG


# -- JSON tensors ----------------------------------------------------------------------------------


def test_json_nested_and_flat_data_decode_to_the_same_bytes() -> None:
    nested = _decode({"inputs": [_input("A", "FP32", [2, 2], [[1, 2.5], [3, 4]])]})
    flat = _decode({"inputs": [_input("A", "FP32", [2, 2], [1, 2.5, 3, 4])]})
    (a,) = nested.request.inputs
    assert a.name == "A" and a.datatype == "FP32" and a.shape == (2, 2)
    assert bytes(a.data) == bytes(flat.request.inputs[0].data)
    np.testing.assert_array_equal(tensor_to_numpy(a), [[1, 2.5], [3, 4]])


@pytest.mark.parametrize(
    "datatype, values",
    [("INT8", [-128, 127]), ("UINT8", [0, 255]), ("INT16", [-32768, 7]), ("UINT16", [65535, 0]),
     ("INT32", [-(2**31), 2**31 - 1]), ("UINT32", [2**32 - 1, 0]), ("INT64", [-(2**63), 2**63 - 1]),
     ("UINT64", [2**64 - 1, 1]), ("FP64", [0.1, -3]), ("BOOL", [True, False])],
)
def test_json_numeric_types_roundtrip_their_limits(datatype: str, values: list[Any]) -> None:
    (tensor,) = _decode({"inputs": [_input("A", datatype, [2], values)]}).request.inputs
    assert tensor_to_numpy(tensor).tolist() == values


def test_json_bytes_are_utf8_length_prefixed() -> None:
    (tensor,) = _decode({"inputs": [_input("S", "BYTES", [1, 2], [["hi", "é"]])]}).request.inputs
    assert bytes(tensor.data) == serialize_bytes([b"hi", "é".encode()])
    assert tensor.shape == (1, 2)


def test_json_empty_tensor() -> None:
    (tensor,) = _decode({"inputs": [_input("A", "INT32", [0, 3], [])]}).request.inputs
    assert bytes(tensor.data) == b"" and tensor.shape == (0, 3)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_json_half_precision_is_refused(datatype: str) -> None:
    _invalid({"inputs": [_input("H", datatype, [1], [1.0])]},
             match=f"receiving {datatype} data via JSON is not supported.*binary data format for input H")


@pytest.mark.parametrize(
    "tensor, match",
    [
        (_input("A", "FP32", [2], ["1", "2"]), "'A'.*numbers"),
        (_input("A", "INT32", [2], [1, 2.5]), "'A'.*integers"),
        (_input("A", "INT32", [2], [1, True]), "'A'.*integers"),
        (_input("A", "INT8", [2], [1, 128]), "'A'.*range of INT8"),
        (_input("A", "UINT32", [1], [-1]), "'A'.*range of UINT32"),
        (_input("A", "BOOL", [2], [1, 0]), "'A'.*booleans"),
        (_input("A", "BYTES", [2], ["a", 1]), "'A'.*strings"),
        (_input("A", "FP32", [2, 2], [1, 2, 3]), "number of elements.*'A'.*needs 4, got 3"),
        (_input("A", "FP32", [2], {"x": 1}), "'data' of input 'A' must be an array"),
        (_input("A", "FP32", "2", [1, 2]), "'shape' of input 'A'"),
        (_input("A", "FP32", [2.0], [1, 2]), "'shape' of input 'A'"),
        (_input("A", "FP32", [-1], [1]), "'shape' of input 'A'"),
        (_input("A", "FP23", [1], [1]), "invalid datatype for input A"),
        (_input("A", "FP32", [1]), "input 'A' needs 'data'"),
        ({"datatype": "FP32", "shape": [1], "data": [1]}, "needs a string 'name'"),
        (_input("A", "FP32", [1], [1], binary_data_size=4), "'A'.*both 'data' and 'binary_data"),
        (_input("A", "FP32", [1], None, binary_data_size=-4), "'binary_data_size' of input 'A'"),
        (_input("A", "FP32", [1], None, binary_data_size="4"), "'binary_data_size' of input 'A'"),
        (_input("A", "FP32", [1], [1], x=[1]), "parameter 'x' of input 'A'"),
    ],
)
def test_malformed_input_is_refused_naming_it(tensor: dict[str, Any], match: str) -> None:
    _invalid({"inputs": [tensor]}, match=match)


def test_huge_integer_for_float_is_refused() -> None:
    _invalid({"inputs": [_input("A", "FP64", [1], [10**400])]}, match="'A'.*too large")


@pytest.mark.parametrize(
    "body, match",
    [
        (b"{not json", "failed to parse the request JSON"),
        (b"", "failed to parse the request JSON"),
        (b"\xff\xfe\xfd", "failed to parse the request JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"inputs": {}}', "'inputs'.*array of objects"),
        (b'{"inputs": [], "outputs": [1]}', "'outputs'.*array of objects"),
        (b'{"inputs": [], "id": 5}', "'id'.*string"),
        (b'{"inputs": [], "parameters": []}', "'parameters' of the inference request"),
        (b'{"inputs": [], "parameters": {"p": null}}', "parameter 'p'"),
        (b'{"inputs": [], "parameters": {"binary_data_output": 1}}', "binary_data_output"),
        (b'{"inputs": [], "outputs": [{"name": "O", "parameters": {"binary_data": "yes"}}]}',
         "'binary_data' of output 'O'"),
    ],
)
def test_malformed_request_json_is_refused(body: bytes, match: str) -> None:
    _invalid(body, match=match)


# -- binary tensors and parameters -----------------------------------------------------------------


def test_binary_inputs_are_views_of_the_body_in_json_order() -> None:
    a = np.arange(6, dtype=np.float32)
    s = serialize_bytes([b"\x00\xff", b"x"])
    document = {"inputs": [_input("A", "FP32", [2, 3], None, binary_data_size=a.nbytes),
                           _input("J", "INT32", [1], [7]),
                           _input("S", "BYTES", [2], None, binary_data_size=len(s))]}
    body, length = _body(document, a.tobytes(), s)
    decoded = decode_infer_request(body, length, "m")
    a_in, j_in, s_in = decoded.request.inputs
    assert isinstance(a_in.data, memoryview) and a_in.data.obj is body  # no copy
    np.testing.assert_array_equal(tensor_to_numpy(a_in), a.reshape(2, 3))
    assert tensor_to_numpy(j_in).tolist() == [7]
    assert list(deserialize_bytes(bytes(s_in.data))) == [b"\x00\xff", b"x"]
    assert a_in.parameters == {} and s_in.parameters == {}  # binary_data_size stripped


def test_binary_fp16_input() -> None:
    half = np.array([1.5, -2], dtype=np.float16)
    (tensor,) = _decode({"inputs": [_input("H", "FP16", [2], None, binary_data_size=4)]},
                        half.tobytes()).request.inputs
    np.testing.assert_array_equal(tensor_to_numpy(tensor), half)


def test_binary_size_beyond_the_body_is_refused() -> None:
    _invalid({"inputs": [_input("A", "FP32", [2], None, binary_data_size=8)]}, b"1234",
             match="unexpected size for input 'A', expecting 8 additional bytes for model 'm'")


def test_binary_data_left_over_is_refused() -> None:
    _invalid({"inputs": [_input("A", "FP32", [1], None, binary_data_size=4)]}, b"12345678",
             match="unexpected additional input data for model 'm'")


def test_json_header_length_equal_to_the_body_is_plain_json() -> None:
    body, _ = _body({"inputs": [_input("A", "INT32", [1], [3])]})
    decoded = decode_infer_request(body, len(body), "m")
    assert tensor_to_numpy(decoded.request.inputs[0]).tolist() == [3]


def test_http_only_parameters_are_stripped_and_remembered() -> None:
    document = {
        "id": "r1",
        "parameters": {"binary_data_output": True, "sequence_id": 9, "priority": 2, "custom": "x"},
        "inputs": [_input("A", "FP32", [1], None, shared_memory_region="in",
                          shared_memory_byte_size=4, shared_memory_offset=0)],
        "outputs": [{"name": "O", "parameters": {"binary_data": False, "classification": 2}},
                    {"name": "P", "parameters": {"shared_memory_region": "out",
                                                 "shared_memory_byte_size": 16}},
                    {"name": "Q"}],
    }
    decoded = _decode(document)
    request, fmt = decoded.request, decoded.output_format
    assert request.id == "r1" and request.model_name == "m" and request.model_version == "1"
    assert request.parameters == {"sequence_id": 9, "priority": 2, "custom": "x"}
    (a,) = request.inputs
    assert bytes(a.data) == b"" and a.parameters["shared_memory_region"] == "in"
    assert [(o.name, o.parameters) for o in request.outputs] == [
        ("O", {"classification": 2}),
        ("P", {"shared_memory_region": "out", "shared_memory_byte_size": 16}),
        ("Q", {}),
    ]
    assert fmt.requested == {"O", "P", "Q"} and fmt.shared_memory == {"P"}
    assert fmt.request_id == "r1"
    assert not fmt.is_binary("O") and fmt.is_binary("Q")


def test_shared_memory_input_with_data_is_refused() -> None:
    _invalid({"inputs": [_input("A", "FP32", [1], [1.0], shared_memory_region="r")]},
             match="'A'.*shared memory")


@pytest.mark.parametrize(
    "value, ok",
    [("0", 0), ("12", 12), (" 7 ", 7), (None, None), ("20", None), ("-1", None), ("abc", None),
     ("1e3", None), ("2147483648", None), ("9" * 5000, None)],
)
def test_parse_header_length(value: str | None, ok: int | None) -> None:
    if ok is not None or value is None:
        assert parse_header_length(value, 19) == ok
    else:
        with pytest.raises(ServerError, match=f"{INFERENCE_HEADER}|inference header size") as info:
            parse_header_length(value, 19)
        assert info.value.status == Status.INVALID_ARG


# -- raw requests ----------------------------------------------------------------------------------


def _metadata(datatype: str, shape: list[int], inputs: int = 1) -> dict[str, Any]:
    tensors = [{"name": f"IN{i}", "datatype": datatype, "shape": shape} for i in range(inputs)]
    return {"name": "m", "versions": ["1"], "platform": "python", "inputs": tensors, "outputs": []}


def test_raw_request_batches_the_single_input() -> None:
    spec = raw_input_spec(_metadata("FP32", [-1, 4]), {"max_batch_size": 8})
    assert spec == RawInputSpec("IN0", "FP32", (4,), True)
    body = np.arange(4, dtype=np.float32).tobytes()
    decoded = decode_raw_request(body, spec, "m", "2")
    (tensor,) = decoded.request.inputs
    assert tensor.shape == (1, 4) and decoded.request.model_version == "2"
    assert isinstance(tensor.data, memoryview) and tensor.data.obj is body
    assert decoded.output_format.is_binary("anything") and decoded.request.outputs == []


def test_raw_request_without_batching_deduces_a_variable_dim() -> None:
    spec = raw_input_spec(_metadata("INT16", [2, -1]), {"max_batch_size": 0})
    (tensor,) = decode_raw_request(bytes(12), spec, "m").request.inputs
    assert tensor.shape == (2, 3)


@pytest.mark.parametrize("batching, shape", [(False, (1,)), (True, (1, 1))])
def test_raw_request_bytes_input_is_the_one_element(batching: bool, shape: tuple[int, ...]) -> None:
    # Triton 2.51: the body is the element itself, not length-prefixed BYTES
    dims = [-1, 1] if batching else [1]
    spec = raw_input_spec(_metadata("BYTES", dims), {"max_batch_size": 4 if batching else 0})
    (tensor,) = decode_raw_request(b"\x05hello", spec, "m").request.inputs
    assert tensor.shape == shape
    assert bytes(tensor.data) == serialize_bytes([b"\x05hello"])


# Triton 2.51's texts (its core's InferenceRequest::Normalize); the variable dimension rounds down.
_NO_ID = r"^\[request id: <id_unknown>\] "


@pytest.mark.parametrize(
    "metadata, config, body, match",
    [
        (_metadata("FP32", [4], inputs=3), {}, b"",
         _NO_ID + r"Raw request must only have 1 input \(found 1\) to be deduced but got 3 inputs in 'm' model "
         r"configuration$"),
        (_metadata("FP32", [-1]), {}, b"123",
         _NO_ID + r"input byte size mismatch for input 'raw_input' for model 'm'. Expected 0, got 3$"),
        (_metadata("FP32", [-1, -1]), {}, b"1234",
         _NO_ID + r"The shape of the raw input 'IN0' can not be deduced because there are more than one "
         r"variable-sized dimension$"),
        (_metadata("FP32", [-1, 3]), {}, b"12345678" * 2,
         _NO_ID + r"input byte size mismatch for input 'raw_input' for model 'm'. Expected 12, got 16$"),
        (_metadata("FP32", [4]), {}, b"1234",
         _NO_ID + r"input byte size mismatch for input 'raw_input' for model 'm'. Expected 16, got 4$"),
        (_metadata("BYTES", [-1]), {}, b"a",
         _NO_ID + r"For BYTE datatype raw input 'IN0', the model must have input shape \[1\]$"),
        (_metadata("BYTES", [-1, 2]), {"max_batch_size": 4}, b"a",
         _NO_ID + r"For BYTE datatype raw input 'IN0', the model must have input shape \[1\]$"),
    ],
)
def test_raw_request_errors(metadata: dict[str, Any], config: dict[str, Any], body: bytes,
                            match: str) -> None:
    with pytest.raises(ServerError, match=match) as info:
        decode_raw_request(body, raw_input_spec(metadata, config), "m")
    assert info.value.status == Status.INVALID_ARG


# -- compression -----------------------------------------------------------------------------------


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize("encoding, compress", [
    ("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", _raw_deflate),
])
def test_decompress_request_body(encoding: str, compress: Any) -> None:
    data = b'{"inputs": []}' * 50
    assert decompress_body(compress(data), encoding, 10_000) == data
    assert decompress_body(data, None, 10_000) is data


@pytest.mark.parametrize("encoding, identity", [
    (None, True), ("", True), ("identity", True), (" Identity ", True), ("gzip", False), ("  ", False),
    ("br", False),
])
def test_identity_encodings_leave_the_body_alone(encoding: str | None, identity: bool) -> None:
    # A body is decoded on a worker thread only when there is something to undo; "  " is not
    # identity, so it still reaches decompress_body's refusal.
    assert is_identity(encoding) is identity
    if identity:
        assert decompress_body(b"x", encoding, 100) == b"x"
    elif encoding != "gzip":
        with pytest.raises(ServerError, match="unsupported Content-Encoding"):
            decompress_body(b"x", encoding, 100)


def test_decompress_errors() -> None:
    with pytest.raises(ServerError, match="maximum input size of 100") as info:
        decompress_body(gzip.compress(bytes(1000)), "gzip", 100)
    assert info.value.status == Status.INVALID_ARG
    with pytest.raises(ServerError, match="decompress the gzip"):
        decompress_body(b"not gzip", "gzip", 100)
    with pytest.raises(ServerError, match="truncated"):
        decompress_body(gzip.compress(bytes(1000))[:20], "gzip", 10_000)
    with pytest.raises(ServerError, match="unsupported Content-Encoding 'br'") as info:
        decompress_body(b"x", "br", 100)
    assert info.value.status == Status.UNSUPPORTED


@pytest.mark.parametrize("accept, chosen", [
    (None, None), ("gzip", "gzip"), ("deflate", "deflate"), ("br, deflate, gzip", "deflate"),
    ("gzip;q=0, deflate", "deflate"), ("identity", None), ("GZIP;q=0.5", "gzip"),
])
def test_response_encoding_choice(accept: str | None, chosen: str | None) -> None:
    assert response_encoding(accept) == chosen


def test_compress_body_roundtrips() -> None:
    data = b"abc" * 100
    assert gzip.decompress(compress_body(data, "gzip")) == data
    assert zlib.decompress(compress_body(data, "deflate")) == data


# -- encoding --------------------------------------------------------------------------------------


def _split(body: bytes, headers: dict[str, str]) -> tuple[dict[str, Any], bytes]:
    if INFERENCE_HEADER not in headers:
        assert headers["Content-Type"] == "application/json"
        return json.loads(body), b""
    assert headers["Content-Type"] == "application/octet-stream"
    length = int(headers[INFERENCE_HEADER])
    return json.loads(body[:length]), body[length:]


def _encode(response: InferResponse, fmt: OutputFormat) -> tuple[dict[str, Any], bytes]:
    encoded = encode_infer_response(response, fmt)
    return _split(encoded.body, encoded.headers)


def _response(*outputs: Tensor) -> InferResponse:
    return InferResponse("m", "1", "", list(outputs))


def test_encode_json_outputs_flat_with_bool_and_bytes() -> None:
    response = _response(
        Tensor("F", "FP32", (2, 2), np.array([[1, 2], [3, 0.5]], dtype=np.float32)),
        Tensor("B", "BOOL", (2,), np.array([True, False])),
        Tensor("S", "BYTES", (2,), serialize_bytes([b"hi", "é".encode()])),
        Tensor("H", "FP16", (1,), np.array([1.5], dtype=np.float16)),
    )
    encoded = encode_infer_response(response, OutputFormat())
    document, rest = _split(encoded.body, encoded.headers)
    assert rest == b""
    assert document == {
        "model_name": "m", "model_version": "1",
        "outputs": [
            {"name": "F", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 0.5]},
            {"name": "B", "datatype": "BOOL", "shape": [2], "data": [True, False]},
            {"name": "S", "datatype": "BYTES", "shape": [2], "data": ["hi", "é"]},
            {"name": "H", "datatype": "FP16", "shape": [1], "data": [1.5]},
        ],
    }


def test_encode_non_utf8_bytes_as_raw_bytes_like_triton() -> None:
    response = _response(Tensor("S", "BYTES", (1,), serialize_bytes([b"\xff\x00"])))
    body = encode_infer_response(response, OutputFormat()).body
    assert b'"data":["\xff\\u0000"]' in body


def test_encode_bf16_json_widens_to_float() -> None:
    bits = (np.array([1.5, -2.0], dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
    response = _response(Tensor("BF", "BF16", (2,), bits.tobytes()))
    document, _ = _encode(response, OutputFormat())
    assert document["outputs"][0]["data"] == [1.5, -2.0]


def test_encode_binary_and_json_mix_in_header_order() -> None:
    f = np.arange(3, dtype=np.float32)
    h = np.array([[0.5, 2]], dtype=np.float16)
    s = serialize_bytes([b"\x00\x01", b""])
    response = _response(Tensor("F", "FP32", (3,), f), Tensor("J", "INT64", (1,), np.array([5])),
                         Tensor("H", "FP16", (1, 2), h), Tensor("S", "BYTES", (2,), s),
                         Tensor("E", "INT32", (0,), b""))
    fmt = OutputFormat(binary_default=True, binary={"J": False})
    encoded = encode_infer_response(response, fmt)
    document, rest = _split(encoded.body, encoded.headers)
    sizes = [o.get("parameters", {}).get("binary_data_size") for o in document["outputs"]]
    assert sizes == [12, None, 4, len(s), 0]
    assert "data" not in document["outputs"][0] and document["outputs"][1]["data"] == [5]
    assert rest == f.tobytes() + h.tobytes() + s


def test_encode_prunes_unrequested_outputs_and_echoes_id_and_parameters() -> None:
    response = InferResponse("m", "3", "abc", [Tensor("A", "INT8", (1,), b"\x01"),
                                               Tensor("B", "INT8", (1,), b"\x02")],
                             parameters={"sequence_end": True})
    fmt = OutputFormat(requested={"B"}, request_id="abc")
    document, _ = _encode(response, fmt)
    assert document == {"model_name": "m", "model_version": "3", "id": "abc",
                        "parameters": {"sequence_end": True},
                        "outputs": [{"name": "B", "datatype": "INT8", "shape": [1], "data": [2]}]}
    document, _ = _encode(response, OutputFormat())
    assert "id" not in document and len(document["outputs"]) == 2


def test_encode_shared_memory_output_has_no_parameters_or_data() -> None:
    response = _response(Tensor("O", "FP32", (2,), b"", {"shared_memory_region": "r"}),
                         Tensor("P", "FP32", (1,), b""))
    fmt = OutputFormat(binary_default=True, shared_memory={"P"})
    encoded = encode_infer_response(response, fmt)
    assert encoded.headers == {"Content-Type": "application/json"}
    assert json.loads(encoded.body)["outputs"] == [
        {"name": "O", "datatype": "FP32", "shape": [2]},
        {"name": "P", "datatype": "FP32", "shape": [1]},
    ]


def test_encode_raw_forces_binary_and_handles_non_contiguous_data() -> None:
    column = np.arange(6, dtype=np.int32).reshape(2, 3)[:, 1]
    response = _response(Tensor("C", "INT32", (2,), column),
                         Tensor("Z", "FP64", (), np.array(2.5)))
    encoded = encode_infer_response(response, OutputFormat(force_binary=True, binary={"C": False}))
    document, rest = _split(encoded.body, encoded.headers)
    assert [o["parameters"]["binary_data_size"] for o in document["outputs"]] == [8, 8]
    assert rest == np.array([1, 4], dtype=np.int32).tobytes() + np.array(2.5).tobytes()


def test_encode_copies_so_the_output_buffer_can_be_reused() -> None:
    data = bytearray(np.arange(4, dtype=np.float32).tobytes())
    encoded = encode_infer_response(_response(Tensor("F", "FP32", (4,), memoryview(data))),
                                    OutputFormat(binary_default=True))
    data[:] = bytes(len(data))
    _, rest = _split(encoded.body, encoded.headers)
    assert np.frombuffer(rest, dtype=np.float32).tolist() == [0, 1, 2, 3]
