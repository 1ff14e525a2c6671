"""The generate extension, document by document: Triton vs pystub (status, Content-Type, body).

What a model is handed (shape_* models describe their inputs): scalars and lists reshaped to the
model's input dims as Triton deduces them; members read in document order with duplicates kept
(bodies written as text where JSON must repeat a key); Triton's errors for duplicate, missing,
unfillable and wrongly typed inputs, ids and parameters. What comes back (gen_script's scripted
responses, raiser's errors): outputs as JSON values, FP16 refused, the one-response rule, and the
stream's status taken from its first event. Where Triton answers a client's mistake with 500,
pystub gives the same text with 400 (deviations.py).
"""

from __future__ import annotations

import json

import pytest
from calls import agree, both, raw
from deviations import agree_or_deviate
from oracle import Endpoint, Pair

PAIR_MODELS = ("gen_script", "raiser", "shape_s1", "shape_b1", "shape_sv", "shape_vv", "shape_b2", "shape_v2v",
               "shape_types")


def _json(text: bytes) -> object:
    # Triton writes BYTES that are not UTF-8 as their raw bytes inside the JSON string
    return json.loads(text.decode("utf-8", "surrogateescape"))


def _generate(endpoint: Endpoint, model: str, route: str, body: object) -> tuple[list, str | None]:
    """[status, the JSON body or the list of the stream's event documents], and the Content-Type."""
    reply = raw(endpoint, "POST", f"/v2/models/{model}/{route}", body if isinstance(body, bytes) else
                json.dumps(body).encode())
    content_type = reply.headers.get("content-type")
    if route == "generate_stream" and content_type == "text/event-stream; charset=utf-8":
        events = [_json(chunk[len(b"data: "):]) for chunk in reply.body.split(b"\n\n") if chunk]
        return [reply.status, events], content_type
    return [reply.status, _json(reply.body)], content_type


def _compare(request: pytest.FixtureRequest, triton: tuple[list, str | None], pystub: tuple[list, str | None]) -> None:
    agree(triton[1], pystub[1])  # the Content-Type, deviation or not
    agree_or_deviate(request.node.name, triton[0], pystub[0])


# name: (model, document or its exact text)
DOCUMENTS: dict[str, tuple[str, object]] = {
    # shapes: the value's length fills the input's dims (batch dimension included)
    "scalar_into_batched_1": ("shape_b1", {"PROMPT": "hi"}),
    "list_into_batched_1": ("shape_b1", {"PROMPT": ["a", "b"]}),
    "scalar_into_1": ("shape_s1", {"PROMPT": "hi"}),
    "list_into_vector": ("shape_sv", {"PROMPT": ["a", "b", "c"]}),
    "scalar_into_two_variable": ("shape_vv", {"X": 5}),
    "list_into_two_variable": ("shape_vv", {"X": [1, 2, 3, 4]}),
    "nested_into_two_variable": ("shape_vv", {"X": [[1, 2], [3, 4]]}),
    "pairs_into_batched_pairs": ("shape_b2", {"X": [1, 2, 3, 4, 5, 6]}),
    "odd_into_batched_pairs": ("shape_b2", {"X": [1, 2, 3]}),
    "scalar_into_batched_pairs": ("shape_b2", {"X": 5}),
    "empty_into_batched_pairs": ("shape_b2", {"X": []}),
    "list_between_variable": ("shape_v2v", {"X": [1, 2, 3, 4]}),
    "empty_between_variable": ("shape_v2v", {"X": []}),
    "scalar_between_variable": ("shape_v2v", {"X": 5}),
    "empty_into_1": ("shape_s1", {"PROMPT": []}),
    "missing_input": ("shape_s1", {}),
    # members in document order, duplicates kept
    "duplicate_input": ("shape_s1", b'{"PROMPT": "a", "PROMPT": "b"}'),
    "duplicate_input_with_id": ("shape_s1", b'{"PROMPT": "a", "PROMPT": "b", "id": "r1"}'),
    "duplicate_in_parameters": ("shape_s1", b'{"PROMPT": "a", "parameters": {"PROMPT": "b"}}'),
    "duplicate_before_parameters": ("shape_s1", b'{"parameters": {"PROMPT": "b"}, "PROMPT": "a"}'),
    "input_in_parameters": ("shape_s1", {"parameters": {"PROMPT": "b"}}),
    "bad_type_before_duplicate": ("shape_s1", b'{"PROMPT": 7, "PROMPT": "b"}'),
    "duplicate_before_bad_type": ("shape_s1", b'{"PROMPT": "b", "PROMPT": 7}'),
    "duplicate_before_bad_shape": ("shape_s1", b'{"PROMPT": "a", "PROMPT": []}'),
    # the JSON type each datatype reads
    "int8_from_string": ("shape_types", {"INT8": "s"}),
    "int8_out_of_range": ("shape_types", {"INT8": 300}),
    "int32_from_bool": ("shape_types", {"INT32": True}),
    "int32_from_float": ("shape_types", {"INT32": 1.5}),
    "int32_nested": ("shape_types", {"INT32": [[1]]}),
    "int32_nested_too_many": ("shape_types", {"INT32": [[1, 2]]}),
    "uint8_from_negative": ("shape_types", {"UINT8": -3}),
    "uint64_largest": ("shape_types", {"UINT64": 2**64 - 1}),
    "fp32_from_string": ("shape_types", {"FP32": "s"}),
    "fp32_from_bool": ("shape_types", {"FP32": True}),
    "fp32_from_int": ("shape_types", {"FP32": 7}),
    "bool_from_int": ("shape_types", {"BOOL": 1}),
    "bool": ("shape_types", {"BOOL": True}),
    "string_from_int": ("shape_types", {"STRING": 7}),
    "string_from_null": ("shape_types", {"STRING": None}),
    "string_from_object": ("shape_types", {"STRING": {"x": 1}}),
    "fp16_input": ("shape_types", {"FP16": 1.5}),
    "fp16_input_bad_shape": ("shape_types", {"FP16": [1, 2]}),
    "bad_type_in_parameters": ("shape_types", {"parameters": {"STRING": 7}}),
    # ids, parameters, the document itself
    "id_string": ("shape_s1", {"PROMPT": "a", "id": "r1"}),
    "id_number": ("shape_s1", {"PROMPT": "a", "id": 5}),
    "first_id_counts": ("shape_s1", b'{"PROMPT": "a", "id": "x", "id": 5}'),
    "parameters_not_object": ("shape_s1", {"PROMPT": "a", "parameters": 5}),
    "parameters_null": ("shape_s1", {"PROMPT": "a", "parameters": None}),
    "parameter_object": ("shape_s1", {"PROMPT": "a", "other": {"z": 1}}),
    "parameter_list_in_parameters": ("shape_s1", {"PROMPT": "a", "parameters": {"k": [1]}}),
    "parameter_null": ("shape_s1", {"PROMPT": "a", "other": None}),
    "parameter_float": ("shape_s1", {"PROMPT": "a", "x": 1.5, "parameters": {"y": -2}}),
    "not_an_object": ("shape_s1", [1]),
    "empty_body": ("shape_s1", b""),
}


@pytest.mark.parametrize("case", sorted(DOCUMENTS))
def test_generate_document(pair: Pair, case: str, request: pytest.FixtureRequest) -> None:
    model, body = DOCUMENTS[case]
    _compare(request, *both(pair, _generate, model, "generate", body))


GEN_SCRIPT_MODES = {0: "error", 1: "ok_then_error", 2: "ok_then_fp16", 3: "fp16", 4: "none", 5: "two",
                    6: "int32_2x2", 7: "bool", 8: "bytes_not_utf8", 9: "empty", 10: "fp64_infinity",
                    11: "uint64_largest", 12: "two_outputs"}


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("mode", sorted(GEN_SCRIPT_MODES), ids=[GEN_SCRIPT_MODES[m] for m in sorted(GEN_SCRIPT_MODES)])
def test_generate_responses(pair: Pair, mode: int, route: str, request: pytest.FixtureRequest) -> None:
    _compare(request, *both(pair, _generate, "gen_script", route, {"MODE": mode}))


RAISER_MODES = {1: "raises", 2: "error_response", 3: "invalid_arg", 8: "unavailable", 10: "unsupported"}


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("mode", sorted(RAISER_MODES), ids=[RAISER_MODES[m] for m in sorted(RAISER_MODES)])
def test_generate_model_errors(pair: Pair, mode: int, route: str, request: pytest.FixtureRequest) -> None:
    """Whatever the error's code, generate answers it with 400 (the stream too, as its first event)."""
    _compare(request, *both(pair, _generate, "raiser", route, {"MODE": mode}))
