"""Unit tests for pystub_backend.backend.models.validation: every Triton error text and the batch size."""

from __future__ import annotations

import numpy as np
import pytest

from pystub_backend.backend.config.model_config import normalize, parse_config_text
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, RequestedOutput, Tensor
from pystub_backend.backend.models import validation
from pystub_backend.backend.models.validation import RequestChecks, model_parameters, validate_request
from pystub_backend.ipc.bytes_codec import serialize_bytes
from pystub_backend.ipc.status import Status

ADD_SUB = """
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] },
       { name: "INPUT1" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] },
        { name: "OUTPUT1" data_type: TYPE_FP32 dims: [4] }]
"""

BATCHING = """
max_batch_size: 8
input [{ name: "A" data_type: TYPE_INT32 dims: [2, -1] },
       { name: "B" data_type: TYPE_STRING dims: [1] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [-1] }]
"""

OPTIONAL = """
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] },
       { name: "INPUT1" data_type: TYPE_FP32 dims: [1] },
       { name: "INPUT2" data_type: TYPE_FP32 dims: [1] optional: true }]
"""


@pytest.fixture(autouse=True, params=["full", "precomputed"])
def check_kind(request, monkeypatch) -> str:
    """Every test runs twice: through `validate_request`, and through a model's `RequestChecks`
    (the serving path), whose fast accept must agree with the full check on every case here."""
    if request.param == "precomputed":
        monkeypatch.setitem(globals(), "validate_request",
                            lambda request, config: RequestChecks(config).validate(request))
    return request.param


def config(text: str, name: str):
    return normalize(parse_config_text(text, "config.pbtxt"), name)


def fp32(name: str, shape: tuple[int, ...] = (4,), dtype: str = "FP32") -> Tensor:
    count = int(np.prod(shape)) if all(d >= 0 for d in shape) else 0
    return Tensor(name, dtype, shape, np.zeros(count, np.float32).tobytes())


def add_sub_request(*inputs: Tensor, id: str = "", **kwargs) -> InferRequest:
    return InferRequest("add_sub", id=id, inputs=list(inputs), **kwargs)


def fails(request: InferRequest, cfg, message: str) -> None:
    with pytest.raises(ServerError) as info:
        validate_request(request, cfg)
    assert info.value.status == Status.INVALID_ARG
    assert info.value.message == message


@pytest.fixture
def add_sub():
    return config(ADD_SUB, "add_sub")


@pytest.fixture
def batching():
    return config(BATCHING, "batcher")


def batch_inputs(batch: int = 3, a_shape: tuple[int, ...] | None = None) -> list[Tensor]:
    a_shape = a_shape or (batch, 2, 5)
    size = int(np.prod(a_shape)) if min(a_shape) >= 0 else 0
    a = Tensor("A", "INT32", a_shape, bytes(4 * size))
    b = Tensor("B", "BYTES", (batch, 1), serialize_bytes([b"x"] * batch))
    return [a, b]


# ---------------------------------------------------------------------------------------------
# Valid requests


def test_valid_non_batching(add_sub) -> None:
    assert validate_request(add_sub_request(fp32("INPUT0"), fp32("INPUT1")), add_sub) == 1


def test_valid_batching_returns_batch_size(batching) -> None:
    request = InferRequest("batcher", inputs=batch_inputs(3))
    assert validate_request(request, batching) == 3


def test_valid_with_requested_outputs(add_sub) -> None:
    request = add_sub_request(fp32("INPUT0"), fp32("INPUT1"),
                              outputs=[RequestedOutput("OUTPUT1")])
    assert validate_request(request, add_sub) == 1


def test_valid_numpy_and_memoryview_data(add_sub) -> None:
    a = Tensor("INPUT0", "FP32", (4,), np.ones(4, np.float32))
    b = Tensor("INPUT1", "FP32", (4,), memoryview(np.ones(4, np.float32).tobytes()))
    assert validate_request(add_sub_request(a, b), add_sub) == 1


def test_optional_input_may_be_missing() -> None:
    cfg = config(OPTIONAL, "opt")
    request = InferRequest("opt", inputs=[fp32("INPUT0", (1,)), fp32("INPUT1", (1,))])
    assert validate_request(request, cfg) == 1


# ---------------------------------------------------------------------------------------------
# Names and counts


def test_unknown_input(add_sub) -> None:
    fails(add_sub_request(fp32("INPUT0"), fp32("BOGUS")), add_sub,
          "unexpected inference input 'BOGUS' for model 'add_sub'")


def test_unknown_input_in_batching_model(batching) -> None:
    a, _ = batch_inputs()
    fails(InferRequest("batcher", inputs=[a, fp32("Z", (3,))]), batching,
          "unexpected inference input 'Z' for model 'batcher'")


def test_duplicate_input(add_sub) -> None:
    fails(add_sub_request(fp32("INPUT0"), fp32("INPUT0"), id="r1"), add_sub,
          "[request id: r1] input 'INPUT0' already exists in request")


def test_missing_input(add_sub) -> None:
    fails(add_sub_request(fp32("INPUT0")), add_sub,
          "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. "
          "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. "
          "Please provide all required input(s).")


def test_no_inputs(add_sub) -> None:
    fails(add_sub_request(id="7"), add_sub,
          "[request id: 7] expected 2 inputs but got 0 inputs for model 'add_sub'. "
          "Got input(s) [], but missing required input(s) ['INPUT0','INPUT1']. "
          "Please provide all required input(s).")


def test_too_many_inputs(add_sub) -> None:
    # Triton's own quirk: an empty missing list renders as "]".
    fails(add_sub_request(fp32("INPUT0"), fp32("INPUT1"), fp32("X")), add_sub,
          "[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. "
          "Got input(s) ['X','INPUT1','INPUT0'], but missing required input(s) ]. "
          "Please provide all required input(s).")


def test_missing_with_optional_inputs() -> None:
    cfg = config(OPTIONAL, "opt")
    fails(InferRequest("opt", inputs=[fp32("INPUT2", (1,))]), cfg,
          "[request id: <id_unknown>] expected number of inputs between 2 and 3 but got 1 "
          "inputs for model 'opt'. Got input(s) ['INPUT2'], but missing required input(s) "
          "['INPUT0','INPUT1']. Please provide all required input(s).")


def test_unknown_output(add_sub) -> None:
    request = add_sub_request(fp32("INPUT0"), fp32("INPUT1"),
                              outputs=[RequestedOutput("OUTPUT0"), RequestedOutput("NOPE")])
    fails(request, add_sub, "unexpected inference output 'NOPE' for model 'add_sub'")


# ---------------------------------------------------------------------------------------------
# Datatypes


def test_wrong_datatype(add_sub) -> None:
    bad = Tensor("INPUT1", "INT32", (4,), bytes(16))
    fails(add_sub_request(fp32("INPUT0"), bad, id="x"), add_sub,
          "[request id: x] inference input 'INPUT1' data-type is 'INT32', but model 'add_sub' "
          "expects 'FP32'")


def test_bf16_against_fp32(add_sub) -> None:
    bad = Tensor("INPUT0", "BF16", (4,), bytes(8))
    fails(add_sub_request(bad, fp32("INPUT1")), add_sub,
          "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'BF16', but model "
          "'add_sub' expects 'FP32'")


def test_unknown_datatype_name(add_sub) -> None:
    bad = Tensor("INPUT0", "FLOAT", (4,), bytes(16))
    fails(add_sub_request(bad, fp32("INPUT1")), add_sub,
          "[request id: <id_unknown>] inference input 'INPUT0' data-type is '<invalid>', but "
          "model 'add_sub' expects 'FP32'")


def test_bytes_against_string_config(batching) -> None:
    a, b = batch_inputs()
    b.datatype = "STRING"
    with pytest.raises(ServerError, match="data-type is '<invalid>', but model 'batcher' "
                                          "expects 'BYTES'"):
        validate_request(InferRequest("batcher", inputs=[a, b]), batching)


def test_bf16_accepted_when_configured() -> None:
    cfg = config('input [{ name: "H" data_type: TYPE_BF16 dims: [3] }]', "bf")
    assert validate_request(InferRequest("bf", inputs=[Tensor("H", "BF16", (3,), bytes(6))]),
                            cfg) == 1
    fails(InferRequest("bf", inputs=[Tensor("H", "BF16", (3,), bytes(12))]), cfg,
          "[request id: <id_unknown>] input byte size mismatch for input 'H' for model 'bf'. "
          "Expected 6, got 12")


# ---------------------------------------------------------------------------------------------
# Shapes


def test_wrong_shape(add_sub) -> None:
    fails(add_sub_request(fp32("INPUT0", (3,)), fp32("INPUT1")), add_sub,
          "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. "
          "Expected [4], got [3]. ")


def test_wrong_rank(add_sub) -> None:
    fails(add_sub_request(fp32("INPUT0"), fp32("INPUT1", (1, 4))), add_sub,
          "[request id: <id_unknown>] unexpected shape for input 'INPUT1' for model 'add_sub'. "
          "Expected [4], got [1,4]. ")


def test_wrong_shape_batching_prints_full_shapes_and_note(batching) -> None:
    request = InferRequest("batcher", id="b", inputs=batch_inputs(3, (3, 5, 5)))
    with pytest.raises(ServerError) as info:
        validate_request(request, batching)
    assert info.value.message.startswith(
        "[request id: b] unexpected shape for input 'A' for model 'batcher'. "
        "Expected [-1,2,-1], got [3,5,5]. NOTE: Setting a non-zero max_batch_size in the model "
        "config requires a batch dimension to be prepended to each input shape."
    )


def test_wildcard_config_dim_matches_any_size(batching) -> None:
    for size in (0, 1, 1000):
        request = InferRequest("batcher", inputs=batch_inputs(2, (2, 2, size)))
        assert validate_request(request, batching) == 2


def test_wildcard_in_request_shape(add_sub) -> None:
    fails(add_sub_request(fp32("INPUT0", (-1,)), fp32("INPUT1")), add_sub,
          "[request id: <id_unknown>] All input dimensions should be specified for input "
          "'INPUT0' for model 'add_sub', got [-1]")


def test_other_negative_dims_are_shape_errors(add_sub, batching) -> None:
    fails(add_sub_request(fp32("INPUT0", (-4,)), fp32("INPUT1")), add_sub,
          "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. "
          "Expected [4], got [-4]. ")
    request = InferRequest("batcher", inputs=batch_inputs(2, (2, 2, -3)))
    with pytest.raises(ServerError, match=r"Expected \[-1,2,-1\], got \[2,2,-3\]"):
        validate_request(request, batching)


def test_non_batching_model_keeps_first_dim() -> None:
    cfg = config('input [{ name: "X" data_type: TYPE_INT8 dims: [-1, 3] }]', "nb")
    request = InferRequest("nb", inputs=[Tensor("X", "INT8", (100, 3), bytes(300))])
    assert validate_request(request, cfg) == 1


# ---------------------------------------------------------------------------------------------
# Batch dimension


def test_batch_size_too_large(batching) -> None:
    fails(InferRequest("batcher", id="big", inputs=batch_inputs(9)), batching,
          "[request id: big] inference request batch-size must be <= 8 for 'batcher'")


def test_batch_size_mismatch(batching) -> None:
    a, _ = batch_inputs(3)
    _, b = batch_inputs(2)
    fails(InferRequest("batcher", inputs=[a, b]), batching,
          "[request id: <id_unknown>] input 'B' batch size does not match other inputs "
          "for 'batcher'")


def test_batching_input_without_shape(batching) -> None:
    a, _ = batch_inputs(1)
    b = Tensor("B", "BYTES", (), serialize_bytes([b"x"]))
    fails(InferRequest("batcher", inputs=[a, b]), batching,
          "[request id: <id_unknown>] input 'B' has no shape but model requires batch "
          "dimension for 'batcher'")


@pytest.mark.parametrize("batch", [0, -1])
def test_batch_dim_below_one(batching, batch: int) -> None:
    a = Tensor("A", "INT32", (batch, 2, 1), b"")
    b = Tensor("B", "BYTES", (batch, 1), b"")
    fails(InferRequest("batcher", inputs=[a, b]), batching,
          "[request id: <id_unknown>] inference request batch-size must be >= 1 for 'batcher'")


def test_shape_tensor_is_not_batched() -> None:
    cfg = config("""
        max_batch_size: 4
        input [{ name: "S" data_type: TYPE_INT32 dims: [2] is_shape_tensor: true },
               { name: "X" data_type: TYPE_INT32 dims: [1] }]
    """, "shp")
    s = Tensor("S", "INT32", (2,), bytes(8))
    x = Tensor("X", "INT32", (3, 1), bytes(12))
    assert validate_request(InferRequest("shp", inputs=[s, x]), cfg) == 3


# ---------------------------------------------------------------------------------------------
# Byte sizes


def test_byte_size_mismatch(add_sub) -> None:
    short = Tensor("INPUT1", "FP32", (4,), bytes(15))
    fails(add_sub_request(fp32("INPUT0"), short, id="s"), add_sub,
          "[request id: s] input byte size mismatch for input 'INPUT1' for model 'add_sub'. "
          "Expected 16, got 15")


def test_huge_shape_allocates_nothing() -> None:
    cfg = config('input [{ name: "X" data_type: TYPE_FP64 dims: [-1, -1, -1] }]', "huge")
    shape = (2**40, 2**40, 2**40)
    fails(InferRequest("huge", inputs=[Tensor("X", "FP64", shape, b"1234")]), cfg,
          "[request id: <id_unknown>] input byte size mismatch for input 'X' for model 'huge'. "
          f"Expected {8 * 2**120}, got 4")


def test_huge_bytes_shape() -> None:
    cfg = config('input [{ name: "X" data_type: TYPE_STRING dims: [-1, -1] }]', "hb")
    request = InferRequest("hb", inputs=[Tensor("X", "BYTES", (2**62, 2**62),
                                                serialize_bytes([b"a"]))])
    fails(request, cfg, "[request id: <id_unknown>] expected " + str(2**124)
          + " string elements for inference input 'X' for model 'hb', got 1")


def test_bytes_element_count_mismatch(batching) -> None:
    a, _ = batch_inputs(2)
    b = Tensor("B", "BYTES", (2, 1), serialize_bytes([b"x", b"y", b"z"]))
    fails(InferRequest("batcher", id="q", inputs=[a, b]), batching,
          "[request id: q] expected 2 string elements for inference input 'B' for model "
          "'batcher', got 3")


def test_bytes_empty_strings_count(batching) -> None:
    a, _ = batch_inputs(2)
    b = Tensor("B", "BYTES", (2, 1), serialize_bytes([b"", b""]))
    assert validate_request(InferRequest("batcher", inputs=[a, b]), batching) == 2


@pytest.mark.parametrize("data, reason", [
    (b"\x05\x00\x00\x00ab", "string extends beyond buffer"),
    (b"\x01\x00\x00\x00a\x00\x00", "incomplete length field"),
])
def test_malformed_bytes(batching, data: bytes, reason: str) -> None:
    a, _ = batch_inputs(1)
    b = Tensor("B", "BYTES", (1, 1), data)
    fails(InferRequest("batcher", inputs=[a, b]), batching,
          f"[request id: <id_unknown>] Invalid bytes tensor data: {reason}")


def test_shape_checked_before_byte_size(add_sub) -> None:
    """All data-type/shape checks run before any byte-size check, as in Triton."""
    short = Tensor("INPUT0", "FP32", (4,), bytes(3))
    fails(add_sub_request(short, fp32("INPUT1", (5,))), add_sub,
          "[request id: <id_unknown>] unexpected shape for input 'INPUT1' for model 'add_sub'. "
          "Expected [4], got [5]. ")


# ---------------------------------------------------------------------------------------------
# Parameters

RESERVED_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
    "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
)


def valid_add_sub(**parameters) -> InferRequest:
    return add_sub_request(fp32("INPUT0"), fp32("INPUT1"), parameters=parameters)


def test_reserved_triton_key(add_sub) -> None:
    fails(valid_add_sub(triton_foo=True), add_sub, RESERVED_MESSAGE)


def test_allowed_triton_key(add_sub) -> None:
    assert validate_request(valid_add_sub(triton_enable_empty_final_response=True), add_sub) == 1


def test_parameters_checked_first(add_sub) -> None:
    fails(add_sub_request(parameters={"triton_x": 1}), add_sub, RESERVED_MESSAGE)


@pytest.mark.parametrize("key", ["priority", "timeout"])
@pytest.mark.parametrize("value", [0, 1, 2**63])
def test_priority_timeout_valid(add_sub, key: str, value: int) -> None:
    assert validate_request(valid_add_sub(**{key: value}), add_sub) == 1


@pytest.mark.parametrize("key", ["priority", "timeout"])
@pytest.mark.parametrize("value", [-1, "1", 1.5, True])
def test_priority_timeout_invalid(add_sub, key: str, value: object) -> None:
    with pytest.raises(ServerError) as info:
        validate_request(valid_add_sub(**{key: value}), add_sub)
    assert info.value.status == Status.INVALID_ARG
    assert f"'{key}' parameter" in info.value.message


def test_model_parameters_strip_reserved() -> None:
    request = InferRequest("m", parameters={
        "sequence_id": 3, "sequence_start": True, "sequence_end": False, "priority": 1,
        "timeout": 10, "headers": "h", "binary_data_output": True,
        "triton_enable_empty_final_response": True, "triton_other": 1,
        "custom": "v", "n": 2, "f": 0.5, "flag": False,
    })
    assert model_parameters(request) == {"custom": "v", "n": 2, "f": 0.5, "flag": False}
    assert model_parameters(InferRequest("m")) == {}


def test_a_required_input_left_out_for_an_optional_one_is_refused():
    from pystub_backend.backend.config.model_config import parse_config_text
    from pystub_backend.backend.errors import ServerError
    from pystub_backend.backend.inference import InferRequest, Tensor
    from pystub_backend.backend.models.validation import validate_request
    config = parse_config_text(
        'name: "m" input [ { name: "A" data_type: TYPE_INT32 dims: [1] }, '
        '{ name: "B" data_type: TYPE_INT32 dims: [1] optional: true } ] '
        'output [ { name: "O" data_type: TYPE_INT32 dims: [1] } ]', "test")
    request = InferRequest("m", inputs=[Tensor("B", "INT32", (1,), b"\0" * 4)])
    try:
        validate_request(request, config)
    except ServerError as error:
        assert "missing required input(s) ['A']" in error.message
    else:
        raise AssertionError("a request without its required input was accepted")


def test_precomputed_checks_accept_valid_requests_without_the_full_check(add_sub, batching, monkeypatch):
    """The fast path really is taken for the common request (the full check is not run)."""
    def full_check(request, config):
        raise AssertionError("the full check ran for a request the fast path should accept")

    monkeypatch.setattr(validation, "validate_request", full_check)
    a = Tensor("A", "INT32", (3, 2, 5), bytes(4 * 30))
    wildcard = config(BATCHING.replace('"B" data_type: TYPE_STRING', '"B" data_type: TYPE_FP32'), "batcher")
    b = Tensor("B", "FP32", (3, 1), bytes(12))
    assert RequestChecks(add_sub).validate(add_sub_request(fp32("INPUT0"), fp32("INPUT1"))) == 1
    assert RequestChecks(wildcard).validate(InferRequest("batcher", inputs=[a, b])) == 3


@pytest.mark.parametrize("a_shape, b_shape", [
    ((1, 2, 5), (3, 1)),    # batch sizes differ, the first is 1
    ((3, 2, 5), (1, 1)),    # batch sizes differ, the second is 1
    ((9, 2, 5), (9, 1)),    # above max_batch_size
    ((0, 2, 5), (0, 1)),    # batch of 0
    ((3, 2, -1), (3, 1)),   # -1 in the request where the config has -1
    ((3, 2), (3, 1)),       # too few dims
])
def test_precomputed_checks_leave_bad_shapes_to_the_full_check(a_shape, b_shape):
    """Each of these is refused, by the same text through both paths."""
    cfg = config(BATCHING.replace('"B" data_type: TYPE_STRING', '"B" data_type: TYPE_FP32'), "batcher")
    size = int(np.prod(a_shape)) if min(a_shape) >= 0 else 0
    request = InferRequest("batcher", inputs=[Tensor("A", "INT32", a_shape, bytes(4 * size)),
                                              Tensor("B", "FP32", b_shape, bytes(4 * max(0, int(np.prod(b_shape)))))])
    with pytest.raises(ServerError) as full:
        validation.validate_request(request, cfg)
    with pytest.raises(ServerError) as precomputed:
        RequestChecks(cfg).validate(request)
    assert precomputed.value.message == full.value.message
