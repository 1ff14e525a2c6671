"""The OpenAI port's request bodies: what becomes the model's sampling parameters (vLLM's fields
passed through unchanged, unknown fields ignored), choices, logprobs, prompts, structured output
and tools, and the 400s naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pystub_backend.backend.frontends.openai.errors import OpenAIError, error_body
from pystub_backend.backend.frontends.openai.request_body import chat_request, completion_request, parse_body
from pystub_backend.backend.frontends.openai.sampling import SAMPLING_FIELDS
from pystub_backend.backend.frontends.openai.tools import AUTO, NAMED, REQUIRED

_USER = [{"role": "user", "content": "x"}]


def _render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    return "|".join(f"{m['role']}:{m['content']}" for m in messages) + (f"|tools:{len(tools)}" if tools else "")


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


def test_completion_fields_become_sampling_parameters() -> None:
    request = completion_request({"model": "m", "prompt": ["p"], "max_tokens": 5, "temperature": 0,
                                  "top_p": 1, "stop": "x", "seed": 9, "stream": True,
                                  "stream_options": {"include_usage": True}, "user": "ignored"})
    assert (request.model, request.prompts, request.stream, request.include_usage) == ("m", ["p"], True, True)
    assert request.sampling == {"temperature": 0, "top_p": 1, "seed": 9, "stop": ["x"], "max_tokens": 5}
    assert request.max_tokens == 5 and not request.echo and request.stop == ["x"] and request.n == 1


# A value of the right type for every vLLM sampling field.
_VLLM_VALUES = {"temperature": 0.7, "top_p": 0.5, "presence_penalty": 0.1, "frequency_penalty": -0.1, "seed": 4,
                "repetition_penalty": 1.2, "length_penalty": 0.9, "top_k": 40, "min_p": 0.05, "min_tokens": 3,
                "ignore_eos": True, "stop_token_ids": [2, 3], "include_stop_str_in_output": True,
                "bad_words": ["darn"], "allowed_token_ids": [5, 6], "logit_bias": {"50256": -100},
                "prompt_logprobs": 1, "detokenize": True, "skip_special_tokens": False,
                "spaces_between_special_tokens": False, "truncate_prompt_tokens": 128, "use_beam_search": False,
                "extra_args": {"k": "v"}}


def test_every_vllm_sampling_field_passes_through_unchanged_and_unknown_ones_are_ignored() -> None:
    assert set(_VLLM_VALUES) == set(SAMPLING_FIELDS)
    request = completion_request({"model": "m", "prompt": "p", **_VLLM_VALUES, "made_up_field": 1, "metadata": {}})
    assert request.sampling == _VLLM_VALUES
    assert json.loads(json.dumps(request.sampling)) == _VLLM_VALUES  # JSON as it reaches the model
    chat = chat_request({"model": "m", "messages": _USER, **_VLLM_VALUES, "store": True}, _render)
    assert chat.sampling == _VLLM_VALUES and chat.include_stop


@pytest.mark.parametrize(("field", "value"), [("top_k", 1.5), ("min_p", 2), ("ignore_eos", "yes"),
                                              ("stop_token_ids", ["a"]), ("logit_bias", [1]), ("min_tokens", -1),
                                              ("repetition_penalty", -1)])
def test_a_vllm_field_of_the_wrong_type_is_a_400_naming_it(field: str, value: object) -> None:
    with pytest.raises(OpenAIError) as caught:
        completion_request({"model": "m", "prompt": "p", field: value})
    assert (caught.value.status, caught.value.param) == (400, field)


def test_chat_renders_text_parts_and_takes_max_completion_tokens() -> None:
    document = {"model": "m", "max_completion_tokens": 3, "messages": [
        {"role": "developer", "content": "d"}, {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                            {"type": "text", "text": "b"}]}]}
    request = chat_request(document, _render)
    assert request.prompts == ["developer:d|user:ab"] and request.max_tokens == 3
    assert request.counted_text == "d\nab" and request.chat


def test_a_template_failure_is_the_request_s_400() -> None:
    def refuse(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        raise ValueError("roles must alternate")

    with pytest.raises(OpenAIError, match="roles must alternate") as caught:
        chat_request({"model": "m", "messages": _USER}, refuse)
    assert caught.value.status == 400


def test_choices_logprobs_and_prompts() -> None:
    request = completion_request({"model": "m", "prompt": ["a", "b"], "n": 3, "best_of": 3, "logprobs": 2})
    assert (request.prompts, request.n, request.logprobs, request.sampling) == (["a", "b"], 3, 2, {"logprobs": 2})
    assert completion_request({"model": "m", "prompt": [1, 2, 3]}).prompts == [[1, 2, 3]]
    assert completion_request({"model": "m", "prompt": [[1], [2, 3]]}).prompts == [[1], [2, 3]]
    assert completion_request({"model": "m", "prompt": "p", "logprobs": 0}).logprobs == 0
    chat = chat_request({"model": "m", "messages": _USER, "logprobs": True, "top_logprobs": 4}, _render)
    assert (chat.logprobs, chat.sampling) == (4, {"logprobs": 4})
    assert chat_request({"model": "m", "messages": _USER, "logprobs": True}, _render).logprobs == 0
    assert chat_request({"model": "m", "messages": _USER, "logprobs": False}, _render).logprobs is None


def test_structured_output_fields_become_one_guide() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
              {"json": schema}, "response_format"),
             ({"response_format": {"type": "json_object"}}, {"json_object": True}, "response_format"),
             ({"guided_regex": "[ab]+", "guided_decoding_backend": "xgrammar"},
              {"regex": "[ab]+", "backend": "xgrammar"}, "guided_regex"),
             ({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}, "guided_choice"),
             ({"structured_outputs": {"json": schema, "whitespace_pattern": " "}},
              {"json": schema, "whitespace_pattern": " "}, "structured_outputs")]
    for fields, expected, param in cases:
        guide = chat_request({"model": "m", "messages": _USER, **fields}, _render).guide
        assert guide is not None and (guide.fields, guide.param) == (expected, param)
        assert json.loads(guide.sampling_value()) == expected
    assert chat_request({"model": "m", "messages": _USER, "response_format": {"type": "text"}}, _render).guide is None


def test_tools_and_tool_choice() -> None:
    tools = [_tool("a"), _tool("b")]
    auto = chat_request({"model": "m", "messages": _USER, "tools": tools}, _render)
    assert auto.tools is not None and auto.tools.choice == AUTO and auto.prompts == ["user:x|tools:2"]
    named = chat_request({"model": "m", "messages": _USER, "tools": tools, "parallel_tool_calls": False,
                          "tool_choice": {"type": "function", "function": {"name": "b"}}}, _render)
    assert named.tools is not None and (named.tools.choice, named.tools.function, named.tools.parallel) == \
        (NAMED, "b", False)
    assert named.tools.guide_schema() == {"type": "object", "properties": {}}
    required = chat_request({"model": "m", "messages": _USER, "tools": tools, "tool_choice": "required"}, _render)
    assert required.tools is not None and required.tools.choice == REQUIRED
    schema = required.tools.guide_schema()
    assert schema["minItems"] == 1 and "maxItems" not in schema
    assert [branch["properties"]["name"]["enum"] for branch in schema["items"]["anyOf"]] == [["a"], ["b"]]
    none = chat_request({"model": "m", "messages": _USER, "tools": tools, "tool_choice": "none"}, _render)
    assert none.tools is None and none.prompts == ["user:x"]  # not shown to the model


def test_calls_in_the_history_reach_the_template_with_object_arguments() -> None:
    seen: list[list[dict[str, Any]]] = []

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        seen.append(messages)
        return ""

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    chat_request({"model": "m", "messages": [*_USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                                             {"role": "tool", "tool_call_id": "c", "content": "2"}]}, render)
    assert seen[0][1]["tool_calls"][0]["function"]["arguments"] == {"x": 1} and seen[0][1]["content"] == ""


@pytest.mark.parametrize(("document", "param"), [
    ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": float("inf")}, "temperature"),
    ({"model": "m", "prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": "m", "prompt": "x", "stop": "s" * 1025}, "stop"),
    ({"model": "m", "prompt": "x", "logprobs": 21}, "logprobs"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "prompt": "x", "echo": 1}, "echo"),
    ({"model": "", "prompt": "x"}, "model"),
    ({"model": "m", "prompt": []}, "prompt"),
    ({"model": "m", "prompt": ["a", 1]}, "prompt"),
    ({"model": "m", "prompt": "x", "n": 0}, "n"),
    ({"model": "m", "prompt": ["x"] * 200, "n": 2}, "n"),
    ({"model": "m", "prompt": "x", "best_of": 3}, "best_of"),
    ({"model": "m", "prompt": "x", "suffix": "y"}, "suffix"),
    ({"model": "m", "prompt": "x", "response_format": {"type": "yaml"}}, "response_format"),
    ({"model": "m", "prompt": "x", "guided_json": {}, "guided_regex": "a"}, "guided_json"),
    ({"model": "m", "prompt": "x", "guided_choice": [1]}, "guided_choice"),
])
def test_completion_refusals_name_the_field(document: dict[str, object], param: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        completion_request(document)
    error = error_body(caught.value)["error"]
    assert (caught.value.status, error["param"], error["type"]) == (400, param, "invalid_request_error")


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"tools": [_tool("a")], "tool_choice": {"type": "function", "function": {"name": "b"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [_tool("a")], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [_tool("a")], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [{"name": "a"}]}, "functions"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_chat_refusals_name_the_field(fields: dict[str, object], param: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        chat_request({"model": "m", "messages": _USER, **fields}, _render)
    assert (caught.value.status, caught.value.param) == (400, param)


@pytest.mark.parametrize("body", [b"", b"[]", b"{", b'"text"', b"[" * 100_000])
def test_bodies_that_are_not_objects(body: bytes) -> None:
    with pytest.raises(OpenAIError, match="JSON"):
        parse_body(body)
