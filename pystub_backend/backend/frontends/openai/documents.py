"""The JSON documents the OpenAI port answers with, in the shapes of the `openai` package's types:

    Completion            object "text_completion"         (also each chunk of a streamed completion)
    ChatCompletion        object "chat.completion"
    ChatCompletionChunk   object "chat.completion.chunk"
    CreateEmbeddingResponse, Model and the model list     object "list" / "model"

`usage` counts tokens as the model reports them (vLLM's `num_input_tokens` / `num_output_tokens`
outputs); without those, whitespace-separated words (docs/openai.md, deviations).
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["Usage", "new_id", "count_words", "completion", "chat_completion", "completion_chunk", "chat_chunk",
           "usage_chunk", "model_object", "OWNER"]

OWNER = "pystub"
_WORD = re.compile(r"\S+")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def document(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def _envelope(kind: str, response_id: str, model: str, created: int, choices: list[dict[str, Any]]
              ) -> dict[str, Any]:
    return {"id": response_id, "object": kind, "created": created, "model": model, "choices": choices,
            "system_fingerprint": None}


def completion(response_id: str, model: str, created: int, text: str, finish_reason: str, usage: Usage
               ) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return {**_envelope("text_completion", response_id, model, created, [choice]), "usage": usage.document()}


def chat_completion(response_id: str, model: str, created: int, text: str, finish_reason: str, usage: Usage
                    ) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason,
              "logprobs": None}
    return {**_envelope("chat.completion", response_id, model, created, [choice]), "usage": usage.document()}


def completion_chunk(response_id: str, model: str, created: int, text: str, finish_reason: str | None
                     ) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return _envelope("text_completion", response_id, model, created, [choice])


def chat_chunk(response_id: str, model: str, created: int, delta: dict[str, str], finish_reason: str | None
               ) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
    return _envelope("chat.completion.chunk", response_id, model, created, [choice])


def usage_chunk(kind: str, response_id: str, model: str, created: int, usage: Usage) -> dict[str, Any]:
    """The last chunk of a stream with `stream_options.include_usage`: no choices, the usage."""
    return {**_envelope(kind, response_id, model, created, []), "usage": usage.document()}


def model_object(name: str, created: int | None = None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(time.time()) if created is None else created,
            "owned_by": OWNER}
