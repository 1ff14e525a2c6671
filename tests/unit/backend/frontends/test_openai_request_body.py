"""The OpenAI port's request bodies: what becomes the model's sampling parameters, and the 400s
naming the field."""

from __future__ import annotations

import pytest

from pystub_backend.backend.frontends.openai.errors import OpenAIError, error_body
from pystub_backend.backend.frontends.openai.request_body import chat_request, completion_request, parse_body


def _render(messages: list[dict[str, object]]) -> str:
    return "|".join(f"{m['role']}:{m['content']}" for m in messages)


def test_completion_fields_become_sampling_parameters() -> None:
    request = completion_request({"model": "m", "prompt": ["p"], "max_tokens": 5, "temperature": 0,
                                  "top_p": 1, "stop": "x", "seed": 9, "stream": True,
                                  "stream_options": {"include_usage": True}, "user": "ignored"})
    assert (request.model, request.prompt, request.stream, request.include_usage) == ("m", "p", True, True)
    assert request.sampling == {"temperature": 0, "top_p": 1, "seed": 9, "stop": ["x"], "max_tokens": 5}
    assert request.max_tokens == 5 and not request.echo


def test_chat_renders_text_parts_and_takes_max_completion_tokens() -> None:
    document = {"model": "m", "max_completion_tokens": 3, "messages": [
        {"role": "developer", "content": "d"}, {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                            {"type": "text", "text": "b"}]}]}
    request = chat_request(document, _render)
    assert request.prompt == "developer:d|user:ab" and request.max_tokens == 3


def test_a_template_failure_is_the_request_s_400() -> None:
    def refuse(messages: list[dict[str, object]]) -> str:
        raise ValueError("roles must alternate")

    with pytest.raises(OpenAIError, match="roles must alternate") as caught:
        chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}]}, refuse)
    assert caught.value.status == 400


@pytest.mark.parametrize(("document", "param"), [
    ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": float("inf")}, "temperature"),
    ({"model": "m", "prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": "m", "prompt": "x", "logprobs": 2}, "logprobs"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "prompt": "x", "echo": 1}, "echo"),
    ({"model": "", "prompt": "x"}, "model"),
    ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
])
def test_completion_refusals_name_the_field(document: dict[str, object], param: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        completion_request(document)
    error = error_body(caught.value)["error"]
    assert (caught.value.status, error["param"], error["type"]) == (400, param, "invalid_request_error")


@pytest.mark.parametrize("body", [b"", b"[]", b"{", b'"text"', b"[" * 100_000])
def test_bodies_that_are_not_objects(body: bytes) -> None:
    with pytest.raises(OpenAIError, match="JSON"):
        parse_body(body)
