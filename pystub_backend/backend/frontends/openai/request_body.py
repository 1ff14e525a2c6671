"""The bodies of `/v1/completions` and `/v1/chat/completions`, checked field by field.

A field of the wrong type or out of OpenAI's range is a 400 naming it (`param`). What reaches the
model: sampling.py (vLLM's sampling fields, unchanged), structured.py (response_format and guided
decoding), tools.py (tools and tool_choice). `stop` is also enforced by the server (stop.py); `n`
choices are `n` requests to the model. Fields pystub does not act on (`user`, `metadata`,
`store`, ...) are accepted and ignored, as OpenAI ignores what it does not know; `suffix`,
`best_of` above `n`, `functions` and non-text content parts are refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pystub_backend.backend.frontends.openai.errors import invalid
from pystub_backend.backend.frontends.openai.sampling import boolean, integer, sampling_fields
from pystub_backend.backend.frontends.openai.structured import Guide, guide_of
from pystub_backend.backend.frontends.openai.tools import ToolRequest, tool_request

__all__ = ["GenerationRequest", "Prompt", "parse_body", "completion_request", "chat_request", "chat_messages",
           "CHAT_ROLES", "MAX_CHOICES"]

# "function" is deprecated by OpenAI and still accepted there
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_CHOICES = 256  # n times the prompts of one request: each is a request to the model
_MAX_STOPS, _MAX_LOGPROBS = 4, 20
_MAX_STOP_CHARACTERS = 1024  # a longer one would make the server's look-ahead for it costly per response

Prompt = str | list[int]  # text, or token ids (decoded with the tokenizer)
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]


@dataclass
class GenerationRequest:
    """What both generation endpoints ask of an LLM model."""

    model: str
    prompts: list[Prompt]  # completions: one or more; chat: the rendered conversation
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    echo: bool = False  # completions: the prompt is part of the text (exclude_input_in_output false)
    sampling: dict[str, Any] = field(default_factory=dict)  # vLLM's sampling_parameters, max_tokens included
    n: int = 1
    stop: list[str] = field(default_factory=list)
    include_stop: bool = False  # vLLM's include_stop_str_in_output
    logprobs: int | None = None  # alternatives a token asked for; None: no logprobs
    guide: Guide | None = None
    tools: ToolRequest | None = None
    chat: bool = False
    counted_text: str | None = None  # chat: what words are counted of without a tokenizer (not the markers)


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


def _optional(document: dict[str, Any], name: str, check: Callable[[str, Any], Any]) -> Any:
    value = document.get(name)
    return None if value is None else check(name, value)


def _stop(document: dict[str, Any]) -> list[str]:
    stop = document.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > _MAX_STOPS:
        raise invalid(f"'stop' must be a string or a list of at most {_MAX_STOPS} strings", "stop")
    if any(len(stop) > _MAX_STOP_CHARACTERS for stop in stops):
        raise invalid(f"a stop string may have at most {_MAX_STOP_CHARACTERS} characters", "stop")
    return stops


def _logprobs(document: dict[str, Any], chat: bool) -> int | None:
    """Alternatives a token asked for: chat's logprobs (bool) and top_logprobs, completions' logprobs (int)."""
    name = "top_logprobs" if chat else "logprobs"
    asked = _optional(document, name, integer(0)) if document.get(name) is not False else None
    if asked is not None and asked > _MAX_LOGPROBS:
        raise invalid(f"'{name}' must be at most {_MAX_LOGPROBS}, got {asked}", name)
    if not chat:
        return asked
    if not _optional(document, "logprobs", boolean):
        if asked:
            raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return asked or 0


def _choices(document: dict[str, Any], prompts: int) -> int:
    n = _optional(document, "n", integer(1)) or 1
    best_of = _optional(document, "best_of", integer(1))
    if best_of is not None and best_of not in (1, n):
        raise invalid("'best_of' is not supported: ask for 'n' choices and choose among them", "best_of")
    if n * prompts > MAX_CHOICES:
        raise invalid(f"'n' times the prompts is {n * prompts}, at most {MAX_CHOICES} are served at once", "n")
    return n


def _common(document: dict[str, Any], prompts: list[Prompt], chat: bool) -> GenerationRequest:
    if document.get("suffix") is not None:
        raise invalid("'suffix' is not supported by this server", "suffix")
    stream = _optional(document, "stream", boolean) or False
    options = document.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise invalid("'stream_options' must be an object, and is allowed only with 'stream': true",
                      "stream_options")
    max_tokens = _optional(document, "max_completion_tokens" if chat else "max_tokens", integer(1))
    if max_tokens is None and chat:
        max_tokens = _optional(document, "max_tokens", integer(1))  # chat: the deprecated spelling
    request = GenerationRequest(_model(document), prompts, stream, bool(options and options.get("include_usage")),
                                max_tokens, n=_choices(document, len(prompts)), stop=_stop(document),
                                logprobs=_logprobs(document, chat), guide=guide_of(document), chat=chat)
    request.sampling = sampling_fields(document)
    request.include_stop = bool(request.sampling.get("include_stop_str_in_output"))
    if request.stop:
        request.sampling["stop"] = request.stop
    if max_tokens is not None:
        request.sampling["max_tokens"] = max_tokens
    if request.logprobs is not None:
        request.sampling["logprobs"] = request.logprobs
    return request


def _prompts(document: dict[str, Any]) -> list[Prompt]:
    """A string, a list of strings, token ids, or a list of token-id lists."""
    prompt = document.get("prompt")
    if prompt is None:
        raise invalid("'prompt' is required", "prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
            return [prompt]
        if all(isinstance(item, str) for item in prompt):
            return list(prompt)
        if all(isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
               for item in prompt):
            return list(prompt)
    raise invalid("'prompt' must be a string, a non-empty list of strings, token ids, or a list of token-id lists",
                  "prompt")


def completion_request(document: dict[str, Any]) -> GenerationRequest:
    """Raises OpenAIError(400) for a missing prompt or a malformed field."""
    request = _common(document, _prompts(document), chat=False)
    request.echo = _optional(document, "echo", boolean) or False
    return request


def chat_messages(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages, each with a known role and its content as text. Raises OpenAIError(400)."""
    messages = document.get("messages")
    if messages is None:
        raise invalid("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list", "messages")
    return [_message(message, index) for index, message in enumerate(messages)]


def _message(message: object, index: int) -> dict[str, Any]:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(f"{param} must be an object", param)
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise invalid(f"{param}.role {json.dumps(role, default=str)} is not one of "
                      f"{', '.join(sorted(CHAT_ROLES))}", f"{param}.role")
    checked = {**message, "content": _content_text(message.get("content"), param)}
    if isinstance(message.get("tool_calls"), list):
        checked["tool_calls"] = [_templated_call(call) for call in message["tool_calls"]]
    return checked


def _templated_call(call: object) -> object:
    """A call of the history as chat templates read it: its arguments an object, not JSON text
    (Hugging Face's convention; vLLM converts them the same way)."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict) or \
            not isinstance(call["function"].get("arguments"), str):
        return call
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}} if isinstance(arguments, dict) else call


def _content_text(content: object, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in content):
            raise invalid(f"{param}.content: only text parts are supported", f"{param}.content")
        return "".join(part["text"] for part in content)
    raise invalid(f"{param}.content must be a string or a list of text parts", f"{param}.content")


def chat_request(document: dict[str, Any], render: Render) -> GenerationRequest:
    """`render(messages, tools)` turns the checked messages into the prompt (chat_template.py).
    Raises OpenAIError(400)."""
    messages = chat_messages(document)
    tools = tool_request(document)
    request = _common(document, [""], chat=True)
    request.tools = tools
    try:
        request.prompts = [render(messages, tools.tools if tools is not None else None)]
    except Exception as exc:  # noqa: BLE001 - a template error is the request's (raise_exception) or the template's
        raise invalid(f"the chat template failed on these messages: {exc}", "messages") from None
    request.counted_text = "\n".join(message["content"] for message in messages)
    return request
