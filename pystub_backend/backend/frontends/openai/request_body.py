"""The bodies of `/v1/completions` and `/v1/chat/completions`, checked field by field.

A field of the wrong type or out of OpenAI's range is a 400 naming it (`param`); sampling fields
become vLLM's `sampling_parameters` (JSON) and must be finite JSON numbers. Fields pystub does not
act on (`user`, `logit_bias`, `metadata`, ...) are accepted and ignored, as by OpenAI's own
compatible servers; those it cannot honour (`n` > 1, `logprobs`, `suffix`, tools) are refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pystub_backend.backend.frontends.openai.errors import invalid

__all__ = ["GenerationRequest", "parse_body", "completion_request", "chat_request", "chat_messages", "CHAT_ROLES"]

# "function" is deprecated by OpenAI and still accepted there
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

# (field, lowest, highest) of the sampling fields vLLM takes under the same names.
_RANGES = (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0), ("presence_penalty", -2.0, 2.0),
           ("frequency_penalty", -2.0, 2.0))
_UNSUPPORTED = ("logprobs", "top_logprobs", "suffix", "tools", "tool_choice", "functions", "function_call",
                "best_of")


@dataclass
class GenerationRequest:
    """What both generation endpoints ask of an LLM model."""

    model: str
    prompt: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    echo: bool = False  # completions: the prompt is part of the text (exclude_input_in_output false)
    sampling: dict[str, Any] = field(default_factory=dict)  # vLLM's sampling_parameters, max_tokens included


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body or b"null")
    except (ValueError, RecursionError):
        raise invalid("the request body is not valid JSON") from None
    if not isinstance(document, dict):
        raise invalid("the request body must be a JSON object")
    return document


def _model(document: dict[str, Any]) -> str:
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: the name of a served model", "model")
    return model


def _number(document: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = document.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"'{name}' must be a number, got {json.dumps(value, default=str)}", name)
    if not low <= value <= high:
        raise invalid(f"'{name}' must be between {low:g} and {high:g}, got {value}", name)
    return value


def _integer(document: dict[str, Any], name: str, low: int) -> int | None:
    value = document.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{name}' must be an integer, got {json.dumps(value, default=str)}", name)
    if value < low:
        raise invalid(f"'{name}' must be at least {low}, got {value}", name)
    return value


def _stop(document: dict[str, Any]) -> list[str] | None:
    stop = document.get("stop")
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > 4:
        raise invalid("'stop' must be a string or a list of at most 4 strings", "stop")
    return stops


def _sampling(document: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    for name, low, high in _RANGES:
        value = _number(document, name, low, high)
        if value is not None:
            sampling[name] = value
    seed = _integer(document, "seed", -(2**63))
    if seed is not None:
        sampling["seed"] = seed
    stop = _stop(document)
    if stop is not None:
        sampling["stop"] = stop
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    return sampling


def _refuse_unsupported(document: dict[str, Any]) -> None:
    for name in _UNSUPPORTED:
        if document.get(name) not in (None, False, [], 0):
            raise invalid(f"'{name}' is not supported by this server", name)
    n = _integer(document, "n", 1)
    if n is not None and n != 1:
        raise invalid("'n' must be 1: this server returns one choice per request", "n")


def _common(document: dict[str, Any], prompt: str, max_tokens_field: str) -> GenerationRequest:
    _refuse_unsupported(document)
    stream = document.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise invalid("'stream' must be a boolean", "stream")
    options = document.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise invalid("'stream_options' must be an object, and is allowed only with 'stream': true",
                      "stream_options")
    include_usage = bool(options.get("include_usage", False)) if options else False
    max_tokens = _integer(document, max_tokens_field, 1)
    if max_tokens is None and max_tokens_field != "max_tokens":
        max_tokens = _integer(document, "max_tokens", 1)  # chat: the deprecated spelling
    return GenerationRequest(_model(document), prompt, bool(stream), include_usage, max_tokens,
                             sampling=_sampling(document, max_tokens))


def completion_request(document: dict[str, Any]) -> GenerationRequest:
    """Raises OpenAIError(400) for a missing prompt or a malformed field."""
    prompt = document.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if prompt is None:
        raise invalid("'prompt' is required", "prompt")
    if not isinstance(prompt, str):
        raise invalid("'prompt' must be a string (or a list of one string; token ids are not supported)",
                      "prompt")
    request = _common(document, prompt, "max_tokens")
    echo = document.get("echo", False)
    if not isinstance(echo, bool) and echo is not None:
        raise invalid("'echo' must be a boolean", "echo")
    request.echo = bool(echo)
    return request


def chat_messages(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages, each with a known role and its content as text. Raises OpenAIError(400)."""
    messages = document.get("messages")
    if messages is None:
        raise invalid("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list", "messages")
    return [_message(message, index) for index, message in enumerate(messages)]


def _message(message: Any, index: int) -> dict[str, Any]:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(f"{param} must be an object", param)
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise invalid(f"{param}.role {json.dumps(role, default=str)} is not one of "
                      f"{', '.join(sorted(CHAT_ROLES))}", f"{param}.role")
    return {**message, "content": _content_text(message.get("content"), param)}


def _content_text(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in content):
            raise invalid(f"{param}.content: only text parts are supported", f"{param}.content")
        return "".join(part["text"] for part in content)
    raise invalid(f"{param}.content must be a string or a list of text parts", f"{param}.content")


def chat_request(document: dict[str, Any], render: Callable[[list[dict[str, Any]]], str]) -> GenerationRequest:
    """`render(messages)` turns the checked messages into the prompt (chat_template.py).
    Raises OpenAIError(400)."""
    messages = chat_messages(document)
    request = _common(document, "", "max_completion_tokens")
    try:
        request.prompt = render(messages)
    except Exception as exc:  # noqa: BLE001 - a template error is the request's (raise_exception) or the template's
        raise invalid(f"the chat template failed on these messages: {exc}", "messages") from None
    return request
