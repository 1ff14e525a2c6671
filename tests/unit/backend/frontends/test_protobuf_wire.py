"""Large bytes fields outside protobuf: the split request and the appended response parse exactly
as protobuf's own encoding does."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from pystub_backend.backend.frontends.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
    parse_infer_request,
    serialize_infer_response,
)
from pystub_backend.backend.frontends.grpc.protobuf_wire import (
    MAX_FIELDS,
    append_length_delimited,
    schema_of,
    split_length_delimited,
)
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


@pytest.mark.parametrize("wire", [b"\x3a\x05abc", b"\x08", b"\x0b\x00", b"\x80" * 11, b"\x00\x00"])
def test_malformed_messages_are_refused(wire: bytes) -> None:
    with pytest.raises(DecodeError):
        split_length_delimited(wire, 7)


_SCHEMA = schema_of(service_pb2.ModelInferRequest.DESCRIPTOR)
_JUNK = {
    "zero bytes": bytes(1 << 20),
    "repeated unknown field 15": b"\x78\x00" * (1 << 19),
    "empty inputs": b"\x2a\x00" * (1 << 19),
    # one input whose 4 MiB are empty parameter entries: the walk counts fields at every depth
    "nested empty parameters": b"\x2a\x80\x80\x80\x02" + b"\x22\x00" * (1 << 21),
}


@pytest.mark.parametrize("wire", _JUNK.values(), ids=_JUNK.keys())
def test_messages_of_tiny_fields_are_refused_at_the_field_budget(wire: bytes) -> None:
    """Before the budget the splitter walked such a message one Python step per field (1 s per
    MiB) and kept a view per field; now it stops at MAX_FIELDS, however deep they are."""
    with pytest.raises(DecodeError, match=f"more than {MAX_FIELDS} fields|field number 0"):
        split_length_delimited(wire, 7, _SCHEMA)
    with pytest.raises(DecodeError):
        parse_infer_request(wire)


def test_a_request_just_under_the_budget_parses() -> None:
    message = _request_message([b"ab"] * 4000, "m", [2])  # 4000 inputs: some 20,000 fields
    parsed = parse_infer_request(message.SerializeToString() + b"\x3a\x00" * (70_000 - 4 * 4000))
    assert len(parsed.message.inputs) == 4000


def test_kept_fields_are_joined_in_runs_not_per_field() -> None:
    message = _request_message([bytes(1 << 17)], "m", [])
    rest, payloads = split_length_delimited(message.SerializeToString(), 7, _SCHEMA)
    assert [p.nbytes for p in payloads] == [1 << 17]
    assert service_pb2.ModelInferRequest.FromString(rest).inputs[0].name == "IN0"


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
