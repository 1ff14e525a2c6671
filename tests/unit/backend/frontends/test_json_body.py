"""The one JSON body parser of the HTTP frontend: depth-safe, 400 with the Triton prefix (issue 18 item 5)."""

from __future__ import annotations

import json

import pytest

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.json_body import MAX_JSON_DEPTH, parse_json_body


def _refusal(text: bytes) -> str:
    with pytest.raises(ServerError) as info:
        parse_json_body(text)
    assert info.value.status == Status.INVALID_ARG
    assert info.value.message.startswith("failed to parse the request JSON buffer: ")
    return info.value.message


@pytest.mark.parametrize("text", [
    b"[" * 100_000,                                   # unclosed, as in the issue
    b"[" * 100_000 + b"]" * 100_000,                  # balanced, far too deep
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,         # objects
    b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
    b'{"inputs":[' + b"[" * 5000 + b"1" + b"]" * 5000 + b"]}",
])
def test_too_deep_is_refused_with_the_depth_named(text: bytes):
    assert f"nesting deeper than {MAX_JSON_DEPTH} levels" in _refusal(text)


def test_the_limit_itself_parses():
    deepest = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    value = parse_json_body(deepest)
    for _ in range(MAX_JSON_DEPTH - 1):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == []


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"id": "[" * 10_000 + '\\"{' * 500, "nested": [[[1]]]}).encode()
    assert parse_json_body(text) == json.loads(text)


def test_many_shallow_brackets_parse():
    rows = [[float(i), 2.0] for i in range(20_000)]  # 20,001 '[' but only 2 deep
    text = json.dumps({"inputs": [{"name": "X", "shape": [20_000, 2], "datatype": "FP32", "data": rows}]}).encode()
    assert parse_json_body(bytearray(text))["inputs"][0]["data"] == rows


@pytest.mark.parametrize(("text", "detail"), [
    (b"", "Expecting value"),
    (b"{", "Expecting property name"),
    (b"[" * 200 + b"}", "nesting deeper"),   # deep before it goes wrong: reported as too deep
    (b"[}" * 300, "Expecting value"),        # shallow and malformed: the decoder says where
    # cut off after an inner pair closed: 129 levels at the innermost '{', though only 128 stay open
    (b"[" * 128 + b'{"a":1}', "nesting deeper"),
    (b'"\xc3\x28"', "codec can't decode"),
    (b"1" * 10_000, "Exceeds the limit"),     # CPython's int digit limit
])
def test_malformed_text_is_invalid_argument(text: bytes, detail: str):
    assert detail in _refusal(text)
