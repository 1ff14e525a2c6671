"""The request's sampling fields, passed to the model's `sampling_parameters` under vLLM's names
and unchanged (vLLM's `SamplingParams` and the extras its OpenAI server takes). Each is checked
for its type (and OpenAI's range where OpenAI has the field), so that a wrong value is a 400
naming it rather than a model that fails; a field that is none of these, nor one the endpoint
reads, is ignored, as OpenAI ignores what it does not know.

`stop`, `max_tokens`, `logprobs`, `n` and the structured-output fields are read by the request
parser (request_body.py, structured.py), which adds what reaches the model of them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from pystub_backend.backend.frontends.openai.errors import invalid

__all__ = ["SAMPLING_FIELDS", "sampling_fields", "number", "integer", "boolean", "text_list"]

_Check = Callable[[str, object], Any]


def _shown(value: object) -> str:
    return json.dumps(value, default=str)[:200]


def number(low: float = -math.inf, high: float = math.inf) -> _Check:
    def check(name: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise invalid(f"'{name}' must be a number, got {_shown(value)}", name)
        if not low <= value <= high:
            raise invalid(f"'{name}' must be between {low:g} and {high:g}, got {value}", name)
        return value
    return check


def integer(low: int = -(2**63)) -> _Check:
    def check(name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(f"'{name}' must be an integer, got {_shown(value)}", name)
        if value < low:
            raise invalid(f"'{name}' must be at least {low}, got {value}", name)
        return value
    return check


def boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean, got {_shown(value)}", name)
    return value


def text_list(name: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid(f"'{name}' must be a list of strings", name)
    return value


def _integers(name: str, value: object) -> list[int]:
    if not isinstance(value, list) or any(isinstance(item, bool) or not isinstance(item, int) for item in value):
        raise invalid(f"'{name}' must be a list of integers (token ids)", name)
    return value


def _object(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"'{name}' must be an object", name)
    return value


# vLLM's names; OpenAI's ranges for the fields OpenAI has.
SAMPLING_FIELDS: dict[str, _Check] = {
    "temperature": number(0, 2), "top_p": number(0, 1), "presence_penalty": number(-2, 2),
    "frequency_penalty": number(-2, 2), "seed": integer(),
    "repetition_penalty": number(0), "length_penalty": number(), "top_k": integer(-1), "min_p": number(0, 1),
    "min_tokens": integer(0), "ignore_eos": boolean, "stop_token_ids": _integers,
    "include_stop_str_in_output": boolean, "bad_words": text_list, "allowed_token_ids": _integers,
    "logit_bias": _object, "prompt_logprobs": integer(-1), "detokenize": boolean, "skip_special_tokens": boolean,
    "spaces_between_special_tokens": boolean, "truncate_prompt_tokens": integer(-1), "use_beam_search": boolean,
    "extra_args": _object,
}


def sampling_fields(document: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields the request sets (null ones are unset), checked. Raises OpenAIError(400)."""
    return {name: check(name, document[name]) for name, check in SAMPLING_FIELDS.items()
            if document.get(name) is not None}
