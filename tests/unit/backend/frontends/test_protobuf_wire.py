"""Large bytes fields outside protobuf: the split request and the appended response parse exactly
as protobuf's own encoding does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from pystub_backend.backend.frontends.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
    parse_infer_request,
    serialize_infer_response,
)
from pystub_backend.backend.frontends.grpc.protobuf_wire import append_length_delimited, split_length_delimited
from pystub_backend.backend.inference import InferResponse, Tensor

_raw_contents = st.lists(st.binary(max_size=300), max_size=4)


def _request_message(raw: list[bytes], name: str, shape: list[int]) -> service_pb2.ModelInferRequest:
    msg = service_pb2.ModelInferRequest(model_name=name, model_version="3", id="req")
    msg.parameters["priority"].int64_param = 2
    for index, data in enumerate(raw):
        msg.inputs.add(name=f"IN{index}", datatype="UINT8", shape=shape or [len(data)])
    msg.outputs.add(name="OUT")
    msg.raw_input_contents.extend(raw)
    return msg


@settings(max_examples=200, deadline=None)
@given(raw=_raw_contents, name=st.text(max_size=40), shape=st.lists(st.integers(0, 2**40), max_size=3))
def test_split_gives_protobufs_fields_back(raw: list[bytes], name: str, shape: list[int]) -> None:
    message = _request_message(raw, name, shape)
    rest, payloads = split_length_delimited(message.SerializeToString(), 7)
    assert [bytes(p) for p in payloads] == raw
    parsed = service_pb2.ModelInferRequest.FromString(rest)
    del message.raw_input_contents[:]
    assert parsed == message


def test_large_request_inputs_are_views_of_the_received_bytes() -> None:
    data = np.arange(1 << 18, dtype=np.float32).tobytes()  # 1 MiB: above the split threshold
    wire = _request_message([data, b"small"], "m", []).SerializeToString()
    parsed = parse_infer_request(wire)
    assert all(isinstance(raw, memoryview) and raw.obj is wire for raw in parsed.raw_input_contents)
    request = decode_infer_request(parsed.message, parsed.raw_input_contents)
    assert [bytes(t.data) for t in request.inputs] == [data, b"small"]
    assert (request.model_name, request.id, request.parameters) == ("m", "req", {"priority": 2})


def test_small_request_is_parsed_by_protobuf() -> None:
    parsed = parse_infer_request(_request_message([b"abc"], "m", []).SerializeToString())
    assert list(parsed.raw_input_contents) == [b"abc"]


@pytest.mark.parametrize("wire", [b"\x3a\x05abc", b"\x08", b"\x0b\x00", b"\x80" * 11])
def test_malformed_messages_are_refused(wire: bytes) -> None:
    with pytest.raises(ValueError):
        split_length_delimited(wire, 7)


def test_serialized_response_equals_the_protobuf_encoding() -> None:
    image = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    response = InferResponse("m", "1", id="r", parameters={"sequence_end": True}, outputs=[
        Tensor("A", "FP32", (2, 3, 4), image),
        Tensor("B", "UINT8", (3,), memoryview(bytearray(b"xyz"))),
        Tensor("C", "INT32", (3, 2), np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]),
        Tensor("D", "FP32", (4,), bytes(16), {"shared_memory_region": "r0"}),
        Tensor("E", "UINT8", (200,), bytes(range(200))),
    ])
    wire = serialize_infer_response(response)
    assert service_pb2.ModelInferResponse.FromString(wire) == encode_infer_response(response)


def test_append_uses_multi_byte_lengths() -> None:
    payload = bytes(300)  # a length that needs a two-byte varint
    wire = append_length_delimited(b"", 6, [payload, memoryview(b"ab")])
    assert list(service_pb2.ModelInferResponse.FromString(wire).raw_output_contents) == [payload, b"ab"]
