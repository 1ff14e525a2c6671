"""The gRPC codec: ModelInferRequest -> InferRequest and InferResponse -> ModelInferResponse."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.grpc.codec import (
    ParsedInferRequest,
    ReceivedInferRequest,
    decode_infer_request,
    encode_infer_response,
    parameter_value,
    parameters_to_proto,
    receive_infer_request,
)
from pystub_backend.backend.inference import InferResponse, Tensor, tensor_to_numpy
from pystub_backend.ipc.bytes_codec import serialize_bytes
from pystub_backend.ipc.dtypes import numpy_dtype

# (datatype, contents field, values) for every datatype that has a typed-contents field
TYPED_CASES = [
    ("BOOL", "bool_contents", [True, False, True, True]),
    ("INT8", "int_contents", [-128, -1, 0, 127]),
    ("INT16", "int_contents", [-32768, -1, 0, 32767]),
    ("INT32", "int_contents", [-(2**31), -1, 0, 2**31 - 1]),
    ("INT64", "int64_contents", [-(2**63), -1, 0, 2**63 - 1]),
    ("UINT8", "uint_contents", [0, 1, 128, 255]),
    ("UINT16", "uint_contents", [0, 1, 32768, 65535]),
    ("UINT32", "uint_contents", [0, 1, 2**31, 2**32 - 1]),
    ("UINT64", "uint64_contents", [0, 1, 2**63, 2**64 - 1]),
    ("FP32", "fp32_contents", [0.0, -1.5, 3.25, 1e30]),
    ("FP64", "fp64_contents", [0.0, -1.5, 3.25, 1e300]),
]
RAW_DTYPES = ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
              "FP16", "FP32", "FP64"]


def _request(**kwargs: object) -> service_pb2.ModelInferRequest:
    return service_pb2.ModelInferRequest(model_name="m", **kwargs)  # type: ignore[arg-type]


def _input(name: str, datatype: str, shape: list[int], **kwargs: object
           ) -> service_pb2.ModelInferRequest.InferInputTensor:
    return service_pb2.ModelInferRequest.InferInputTensor(
        name=name, datatype=datatype, shape=shape, **kwargs)  # type: ignore[arg-type]


def _invalid_arg(msg: service_pb2.ModelInferRequest) -> str:
    with pytest.raises(ServerError) as info:
        decode_infer_request(msg)
    assert info.value.status == Status.INVALID_ARG
    return info.value.message


# --- inputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", RAW_DTYPES)
def test_raw_contents_round_trip_every_datatype(datatype: str) -> None:
    values = np.arange(6) % 2 if datatype == "BOOL" else np.arange(6) - 2  # negatives wrap for UINT
    array = values.astype(numpy_dtype(datatype)).reshape(2, 3)
    msg = _request(inputs=[_input("x", datatype, [2, 3])], raw_input_contents=[array.tobytes()])
    request = decode_infer_request(msg)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 3))
    np.testing.assert_array_equal(tensor_to_numpy(tensor), array)


def test_raw_contents_bf16_and_bytes_pass_through_unchanged() -> None:
    strings = serialize_bytes([b"a", b"", b"xyz"])
    msg = _request(inputs=[_input("b", "BF16", [2]), _input("s", "BYTES", [3])],
                   raw_input_contents=[b"\x01\x02\x03\x04", strings])
    bf16, text = decode_infer_request(msg).inputs
    assert bytes(bf16.data) == b"\x01\x02\x03\x04"
    assert list(tensor_to_numpy(text)) == [b"a", b"", b"xyz"]


def test_raw_contents_are_bytes_objects() -> None:
    msg = _request(inputs=[_input("x", "UINT8", [3])], raw_input_contents=[b"abc"])
    (tensor,) = decode_infer_request(msg).inputs
    assert type(tensor.data) is bytes


@pytest.mark.parametrize(("datatype", "field", "values"), TYPED_CASES)
def test_typed_contents_every_datatype(datatype: str, field: str, values: list[object]) -> None:
    inp = _input("x", datatype, [2, 2])
    getattr(inp.contents, field).extend(values)
    (tensor,) = decode_infer_request(_request(inputs=[inp])).inputs
    result = tensor_to_numpy(tensor)
    assert result.shape == (2, 2)
    assert result.dtype.byteorder in "<|=" and result.dtype.itemsize == tensor.nbytes // 4
    np.testing.assert_array_equal(result.ravel(), np.array(values, dtype=result.dtype))


def test_typed_bytes_contents_are_length_prefixed() -> None:
    inp = _input("s", "BYTES", [3])
    inp.contents.bytes_contents.extend([b"hello", b"", b"\x00\xff"])
    (tensor,) = decode_infer_request(_request(inputs=[inp])).inputs
    assert bytes(tensor.data) == serialize_bytes([b"hello", b"", b"\x00\xff"])


def test_typed_contents_of_several_inputs() -> None:
    a, b = _input("a", "INT32", [2]), _input("b", "FP64", [1])
    a.contents.int_contents.extend([1, 2])
    b.contents.fp64_contents.append(0.5)
    ta, tb = decode_infer_request(_request(inputs=[a, b])).inputs
    assert tensor_to_numpy(ta).tolist() == [1, 2] and tensor_to_numpy(tb).tolist() == [0.5]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_typed_contents_rejected_for_half_floats(datatype: str) -> None:
    inp = _input("h", datatype, [1])
    inp.contents.fp32_contents.append(1.0)
    assert "'h'" in _invalid_arg(_request(inputs=[inp]))


def test_typed_contents_in_the_wrong_field() -> None:
    inp = _input("x", "FP32", [1])
    inp.contents.int_contents.append(1)
    assert "int_contents" in _invalid_arg(_request(inputs=[inp]))


def test_typed_contents_out_of_range_for_narrow_int() -> None:
    inp = _input("x", "INT8", [1])
    inp.contents.int_contents.append(300)
    assert "'x'" in _invalid_arg(_request(inputs=[inp]))


@pytest.mark.parametrize("count", [3, 5])
def test_typed_contents_count_must_match_shape(count: int) -> None:
    inp = _input("x", "FP32", [2, 2])
    inp.contents.fp32_contents.extend([1.0] * count)
    message = _invalid_arg(_request(inputs=[inp]))
    assert "'x'" in message and "4" in message and str(count) in message


def test_input_without_any_data_is_rejected() -> None:
    assert "'x'" in _invalid_arg(_request(inputs=[_input("x", "FP32", [2])]))


def test_empty_tensor_needs_no_data() -> None:
    (tensor,) = decode_infer_request(_request(inputs=[_input("x", "FP32", [0, 3])])).inputs
    assert tensor.nbytes == 0 and tensor.shape == (0, 3)


def test_mixing_raw_and_typed_contents() -> None:
    typed = _input("b", "INT32", [1])
    typed.contents.int_contents.append(1)
    msg = _request(inputs=[_input("a", "INT32", [1]), typed], raw_input_contents=[bytes(4)])
    assert _invalid_arg(msg) == ("contents field must not be specified when using "
                                 "raw_input_contents for 'b' for model 'm'")


@pytest.mark.parametrize("raw_count", [1, 3])
def test_raw_count_must_match_inputs(raw_count: int) -> None:
    msg = _request(inputs=[_input("a", "INT32", [1]), _input("b", "INT32", [1])],
                   raw_input_contents=[bytes(4)] * raw_count)
    message = _invalid_arg(msg)
    assert "'m'" in message and str(raw_count) in message


def test_shm_inputs_take_no_raw_entry() -> None:
    shm = _input("a", "FP32", [4])
    shm.parameters["shared_memory_region"].string_param = "in0"
    shm.parameters["shared_memory_byte_size"].int64_param = 16
    shm.parameters["shared_memory_offset"].int64_param = 8
    msg = _request(inputs=[shm, _input("b", "UINT8", [2])], raw_input_contents=[b"xy"])
    a, b = decode_infer_request(msg).inputs
    assert a.nbytes == 0
    assert a.parameters == {"shared_memory_region": "in0", "shared_memory_byte_size": 16,
                            "shared_memory_offset": 8}
    assert bytes(b.data) == b"xy"
    # the one raw entry belongs to the only non-shm input: a second one is too many
    msg.raw_input_contents.append(b"zz")
    _invalid_arg(msg)


def test_shm_parameter_of_the_wrong_kind() -> None:
    shm = _input("a", "FP32", [4])
    shm.parameters["shared_memory_region"].int64_param = 3
    message = _invalid_arg(_request(inputs=[shm]))
    assert "shared_memory_region" in message and "'a'" in message


# --- parameters ---------------------------------------------------------------------------------


def test_request_parameters_of_every_kind() -> None:
    msg = _request(inputs=[_input("x", "FP32", [0])], id="req-7", model_version="3")
    msg.parameters["flag"].bool_param = True
    msg.parameters["count"].int64_param = -5
    msg.parameters["name"].string_param = "text"
    msg.parameters["ratio"].double_param = 0.25
    request = decode_infer_request(msg)
    assert request.parameters == {"flag": True, "count": -5, "name": "text", "ratio": 0.25}
    assert isinstance(request.parameters["flag"], bool)
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "req-7")


def test_default_version_is_empty_string() -> None:
    assert decode_infer_request(_request()).model_version == ""


def test_custom_uint64_parameter_rejected() -> None:
    msg = _request()
    msg.parameters["big"].uint64_param = 7
    assert "'big'" in _invalid_arg(msg)


def test_unset_custom_parameter_rejected() -> None:
    msg = _request()
    msg.parameters["empty"].SetInParent()
    assert "'empty'" in _invalid_arg(msg)


@pytest.mark.parametrize("kind,value", [("int64_param", 42), ("uint64_param", 2**64 - 1),
                                        ("string_param", "session-1")])
def test_sequence_id_kinds(kind: str, value: object) -> None:
    msg = _request()
    setattr(msg.parameters["sequence_id"], kind, value)
    msg.parameters["sequence_start"].bool_param = True
    msg.parameters["sequence_end"].bool_param = False
    params = decode_infer_request(msg).parameters
    assert params == {"sequence_id": value, "sequence_start": True, "sequence_end": False}


@pytest.mark.parametrize("kind", ["int64_param", "uint64_param"])
def test_priority_kinds(kind: str) -> None:
    msg = _request()
    setattr(msg.parameters["priority"], kind, 2)
    msg.parameters["timeout"].int64_param = 1000
    assert decode_infer_request(msg).parameters == {"priority": 2, "timeout": 1000}


@pytest.mark.parametrize("key,kind,value", [
    ("sequence_id", "double_param", 1.0),
    ("sequence_start", "int64_param", 1),
    ("priority", "string_param", "high"),
    ("priority", "int64_param", -1),
    ("timeout", "uint64_param", 5),
])
def test_reserved_parameter_of_the_wrong_kind(key: str, kind: str, value: object) -> None:
    msg = _request()
    setattr(msg.parameters[key], kind, value)
    assert f"'{key}'" in _invalid_arg(msg)


def test_triton_parameters_pass_to_the_core() -> None:
    msg = _request()
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    msg.parameters["triton_other"].uint64_param = 3  # the core rejects it, naming the key
    assert decode_infer_request(msg).parameters == {
        "triton_enable_empty_final_response": True, "triton_other": 3}


def test_requested_outputs_keep_parameters_but_not_binary_data() -> None:
    out = service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="y")
    out.parameters["binary_data"].bool_param = True
    out.parameters["shared_memory_region"].string_param = "out0"
    out.parameters["shared_memory_byte_size"].uint64_param = 64
    out.parameters["classification"].int64_param = 2
    (requested,) = decode_infer_request(_request(outputs=[out])).outputs
    assert requested.name == "y"
    assert requested.parameters == {"shared_memory_region": "out0",
                                    "shared_memory_byte_size": 64, "classification": 2}


def test_parameters_to_proto_every_kind() -> None:
    msg = service_pb2.ModelInferResponse()
    values = {"b": False, "i": -3, "u": 2**64 - 1, "d": 1.5, "s": "x"}
    parameters_to_proto(values, msg.parameters)
    kinds = {k: msg.parameters[k].WhichOneof("parameter_choice") for k in values}
    assert kinds == {"b": "bool_param", "i": "int64_param", "u": "uint64_param",
                     "d": "double_param", "s": "string_param"}
    assert {k: parameter_value(v) for k, v in msg.parameters.items()} == values


# --- response -----------------------------------------------------------------------------------


def test_encode_several_outputs_in_order_and_release_is_left_to_the_caller() -> None:
    released: list[bool] = []
    fp32 = np.arange(6, dtype=np.float32).reshape(2, 3)
    arena = bytearray(b"\x07" * 4)
    response = InferResponse(
        model_name="m", model_version="1", id="r1",
        outputs=[Tensor("A", "FP32", (2, 3), fp32),
                 Tensor("B", "UINT8", (4,), memoryview(arena)),
                 Tensor("C", "INT64", (1,), np.int64(9).tobytes())],
        parameters={"triton_final_response": True, "note": "n"},
        release=lambda: released.append(True),
    )
    msg = encode_infer_response(response)
    assert not released
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "r1")
    assert [(o.name, o.datatype, list(o.shape)) for o in msg.outputs] == [
        ("A", "FP32", [2, 3]), ("B", "UINT8", [4]), ("C", "INT64", [1])]
    assert list(msg.raw_output_contents) == [fp32.tobytes(), b"\x07" * 4,
                                             np.int64(9).tobytes()]
    arena[:] = b"\x00" * 4  # the message owns its copy: the arena may be reused after release
    assert msg.raw_output_contents[1] == b"\x07" * 4
    assert msg.parameters["triton_final_response"].bool_param is True
    assert msg.parameters["note"].string_param == "n"


def test_encode_non_contiguous_array_in_c_order() -> None:
    array = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    msg = encode_infer_response(InferResponse("m", "1", outputs=[Tensor("A", "INT32", (3, 2), array)]))
    assert msg.raw_output_contents[0] == np.ascontiguousarray(array).tobytes()


def test_encode_bytes_output() -> None:
    data = serialize_bytes([b"one", b"two!"])
    msg = encode_infer_response(InferResponse("m", "1", outputs=[Tensor("S", "BYTES", (2,), data)]))
    assert msg.outputs[0].datatype == "BYTES"
    assert msg.raw_output_contents[0] == data


def test_encode_shm_outputs_get_empty_entries() -> None:
    shm_params = {"shared_memory_region": "out0", "shared_memory_byte_size": 16}
    response = InferResponse("m", "1", outputs=[
        Tensor("A", "FP32", (4,), bytes(16), dict(shm_params)),
        Tensor("B", "UINT8", (2,), b"ok"),
        Tensor("C", "FP32", (1,), bytes(4), {"shared_memory_region": "out1"}),
    ])
    msg = encode_infer_response(response)
    assert list(msg.raw_output_contents) == [b"", b"ok", b""]
    assert [o.name for o in msg.outputs] == ["A", "B", "C"]
    assert not msg.outputs[0].parameters  # shm references are not echoed


def test_encode_refuses_numpy_object_arrays() -> None:
    # numpy would export the element pointers as the buffer; BYTES must come serialized
    tensor = Tensor("S", "BYTES", (1,), np.array([b"x"], dtype=np.object_))
    with pytest.raises(TypeError, match="'S'"):
        encode_infer_response(InferResponse("m", "1", outputs=[tensor]))


def _large_request(inputs: int, nbytes: int) -> bytes:
    message = service_pb2.ModelInferRequest(model_name="identity_fp32")
    for index in range(inputs):
        message.inputs.add(name=f"INPUT{index}", datatype="FP32", shape=[1, nbytes // 4 // inputs])
        message.raw_input_contents.append(bytes(range(256)) * (nbytes // 256 // inputs))
    return message.SerializeToString()


def test_a_large_request_of_the_usual_shape_is_taken_apart_at_once() -> None:
    """1 MiB in raw contents and a few fields: parsed on receipt, its contents views of the bytes
    received (a hop to the parsing threads would cost more than the parse)."""
    data = _large_request(2, 1 << 20)
    received = receive_infer_request(data)
    assert isinstance(received, ParsedInferRequest)
    assert [tensor.name for tensor in received.message.inputs] == ["INPUT0", "INPUT1"]
    assert [bytes(raw) for raw in received.raw_input_contents] == [bytes(range(256)) * 2048] * 2
    assert all(isinstance(raw, memoryview) and raw.obj is data for raw in received.raw_input_contents)


@pytest.mark.parametrize("shape", ["many fields", "large typed contents", "malformed"])
def test_a_large_request_of_another_shape_is_left_to_the_parsing_threads(shape: str) -> None:
    if shape == "many fields":
        data = _large_request(2000, 1 << 20)  # 2,000 inputs: thousands of fields
    elif shape == "large typed contents":
        message = service_pb2.ModelInferRequest(model_name="identity_fp32")
        message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1 << 16]).contents.fp32_contents.extend(
            [1.0] * (1 << 16))
        data = message.SerializeToString()
    else:
        data = _large_request(1, 1 << 20)[:-10]  # truncated
    received = receive_infer_request(data)
    assert isinstance(received, ReceivedInferRequest) and received.parsed is None
