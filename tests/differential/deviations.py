"""Deliberate deviations from Triton 2.51 that the tier asserts (docs/triton-differences.md,
"Deliberate deviations"): for these cases the test checks Triton's status and pystub's own
documented answer instead of requiring agreement.

Malformed client input: Triton answers most of it with 500 (503 for one logging setting) and the
wording of its JSON library (RapidJSON); pystub answers 400 (gRPC INVALID_ARGUMENT), because the
mistake is the client's, and keeps its own wording where Triton's is the parser's. Where Triton's
text is a fixed sentence, pystub answers with that sentence (only the status differs).
"""

from __future__ import annotations

from dataclasses import dataclass

from calls import agree
from oracle import without_variant

# The prefix both servers put before their JSON parser's message; the parser's own wording follows.
PARSE_ERROR = "failed to parse the request JSON buffer: "


@dataclass(frozen=True)
class Deviation:
    """Triton's status, pystub's status and pystub's error text (`prefix` True: the text starts so)."""

    triton_status: object
    pystub_status: object
    pystub_error: str
    prefix: bool = False


def _same_text(triton_status: object, pystub_status: object) -> Deviation:
    """Only the status differs: pystub answers with Triton's own sentence (checked by the caller)."""
    return Deviation(triton_status, pystub_status, "", prefix=True)


_PARSE = Deviation(500, 400, PARSE_ERROR, prefix=True)
_SHAPE = Deviation(500, 400, "'shape' of input 'INPUT0' must be an array of non-negative int64 integers")

MALFORMED: dict[str, Deviation] = {
    # unparsable JSON bodies (every endpoint that takes one)
    "test_http_json[bad_json]": _PARSE,
    "test_http_binary_raw[header_length_too_small]": _PARSE,
    "test_generate[gen_bad_json]": _PARSE,
    "test_repository_errors[bad_json]": _PARSE,
    "test_system_shared_memory_http[register_bad_json]": _PARSE,
    "test_logging_update[not_json]": _PARSE,
    # a JSON document of the wrong shape
    "test_http_json[empty_object]": Deviation(
        500, 400, "[request id: <id_unknown>] expected 2 inputs but got 0 inputs for model 'add_sub'. Got input(s) "
                  "[], but missing required input(s) ['INPUT0','INPUT1']. Please provide all required input(s)."),
    "test_http_json[body_is_array]": Deviation(500, 400, "the inference request must be a JSON object"),
    "test_http_json[inputs_not_list]": Deviation(500, 400,
                                                 "'inputs' of the inference request must be an array of objects"),
    "test_http_json[input_without_datatype]": Deviation(500, 400, "invalid datatype for input INPUT0"),
    "test_http_json[input_without_shape]": _SHAPE,
    "test_http_json[negative_shape]": _SHAPE,
    "test_http_json[data_count_mismatch]": Deviation(
        500, 400, "unexpected number of elements in 'data' of input 'INPUT0': shape [4] needs 4, got 3"),
    "test_http_json[string_in_fp32]": Deviation(500, 400, "'data' of input 'INPUT0' must contain only numbers"),
    "test_http_json[bytes_json_number]": Deviation(500, 400, "'data' of input 'INPUT0' must contain only strings"),
    "test_reserved_parameters[binary_data_output]": Deviation(500, 400,
                                                              "parameter 'binary_data_output' must be a boolean"),
    "test_logging_update[body3]": Deviation(500, 400, "log setting 'log_verbose_level' must be an integer >= 0, "
                                                      "got -1"),
    "test_logging_update[body4]": Deviation(500, 400, "log setting 'log_info' must be a boolean, got 'yes'"),
    # Triton's fixed sentence, pystub's status
    "test_logging_update[body5]": _same_text(503, 400),
    "test_system_shared_memory_http[register_missing_key]": _same_text(500, 400),
    "test_grpc_admin[shm_register_missing_key]": _same_text("StatusCode.INTERNAL", "StatusCode.INVALID_ARGUMENT"),
    # a value INT32 cannot hold: Triton feeds the model 0 and answers 200; pystub refuses it
    "test_http_json[int32_out_of_range]": Deviation(
        200, 400, "'data' of input 'MODE' holds a value outside the range of INT32 [-2147483648, 2147483647]"),
    "test_generate_document[int8_out_of_range]": Deviation(
        200, 400, "'data' of input 'INT8' holds a value outside the range of INT8 [-128, 127]"),
    # generate (test_generate.py): Triton's own sentence for the client's mistake, answered with 500
    "test_generate_document[empty_body]": _PARSE,
    "test_generate[gen_number_input]": _same_text(500, 400),
    **{f"test_generate_document[{case}]": _same_text(500, 400) for case in (
        "bad_type_before_duplicate", "bad_type_in_parameters", "bool_from_int", "fp32_from_bool", "fp32_from_string",
        "id_number", "int32_from_bool", "int32_from_float", "int32_nested_too_many", "int8_from_string",
        "nested_into_two_variable", "not_an_object", "parameters_not_object", "parameters_null", "string_from_int",
        "string_from_null", "string_from_object", "uint8_from_negative")},
}


def _status_and_error(answer: object) -> tuple[object, object]:
    """(status, error text) of `[status, {"error": ...}]` (raw HTTP) or `{"status", "error"}` (gRPC)."""
    if isinstance(answer, (list, tuple)):
        body = answer[1]
        return answer[0], body.get("error") if isinstance(body, dict) else body
    if isinstance(answer, dict):
        return answer.get("status"), answer.get("error")
    raise AssertionError(f"not an answer with a status: {answer!r}")


def agree_or_deviate(case: str, triton: object, pystub: object) -> None:
    """`agree`, unless `case` (the test's name with its parameters) is a documented deviation."""
    deviation = MALFORMED.get(without_variant(case))
    if deviation is None:
        agree(triton, pystub)
        return
    (triton_status, triton_error), (pystub_status, pystub_error) = map(_status_and_error, (triton, pystub))
    assert triton_status == deviation.triton_status, f"Triton answered {triton!r}"
    assert pystub_status == deviation.pystub_status, f"pystub answered {pystub!r}"
    assert isinstance(pystub_error, str), pystub
    if deviation.pystub_error == "" and deviation.prefix:   # Triton's fixed sentence
        agree(triton_error, pystub_error)
    elif deviation.prefix:   # the parser's wording follows the prefix on both
        assert isinstance(triton_error, str) and triton_error.startswith(deviation.pystub_error), triton
        assert pystub_error.startswith(deviation.pystub_error), pystub_error
    else:
        agree(deviation.pystub_error, pystub_error)
