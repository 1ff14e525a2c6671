"""The JSON documents the OpenAI port answers with, in the shapes of the `openai` package's types:

    Completion            object "text_completion"         (also each chunk of a streamed completion)
    ChatCompletion        object "chat.completion"
    ChatCompletionChunk   object "chat.completion.chunk"
    CreateEmbeddingResponse, Model and the model list     object "list" / "model"

A chat message or delta carries `tool_calls` when the tool-call parser found calls; a chunk
carries `"usage": null` when the stream will end with a usage chunk (`stream_options.include_usage`),
as OpenAI's chunks do.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from pystub_backend.backend.frontends.openai.tool_calls import Assembled, CallDelta, Content, Piece

__all__ = ["Usage", "new_id", "envelope", "completion_choice", "chat_choice", "completion_delta", "chat_delta",
           "chunk", "whole", "usage_chunk", "model_object", "OWNER"]

OWNER = "pystub"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def document(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def envelope(kind: str, response_id: str, model: str, created: int, choices: list[dict[str, Any]]
             ) -> dict[str, Any]:
    return {"id": response_id, "object": kind, "created": created, "model": model, "choices": choices,
            "system_fingerprint": None}


def _calls(assembled: Assembled) -> list[dict[str, Any]]:
    return [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in assembled.calls]


def completion_choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None
                      ) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}


def chat_choice(index: int, assembled: Assembled, finish_reason: str, logprobs: dict[str, Any] | None
                ) -> dict[str, Any]:
    content = assembled.content
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not assembled.calls else None,
                               "refusal": None}
    if assembled.calls:
        message["tool_calls"] = _calls(assembled)
    return {"index": index, "message": message, "finish_reason": finish_reason, "logprobs": logprobs}


def completion_delta(index: int, pieces: list[Piece], finish_reason: str | None, logprobs: dict[str, Any] | None
                     ) -> dict[str, Any]:
    return completion_choice(index, "".join(p.text for p in pieces if isinstance(p, Content)), finish_reason,
                             logprobs)


def chat_delta(index: int, pieces: list[Piece], finish_reason: str | None, logprobs: dict[str, Any] | None,
               opening: bool = False) -> dict[str, Any]:
    """A chunk's choice: the pieces' content and call fragments (merged per call)."""
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if opening else {}
    text = "".join(p.text for p in pieces if isinstance(p, Content))
    if text:
        delta["content"] = text
    calls: dict[int, dict[str, Any]] = {}
    for piece in pieces:
        if isinstance(piece, CallDelta):
            call = calls.setdefault(piece.index, {"index": piece.index, "function": {"arguments": ""}})
            if piece.id is not None:
                call.update(id=piece.id, type="function")
                call["function"]["name"] = piece.name
            call["function"]["arguments"] += piece.arguments
    if calls:
        delta["tool_calls"] = list(calls.values())
    return {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}


def chunk(kind: str, response_id: str, model: str, created: int, choice: dict[str, Any], with_usage: bool
          ) -> dict[str, Any]:
    document = envelope(kind, response_id, model, created, [choice])
    if with_usage:
        document["usage"] = None
    return document


def whole(kind: str, response_id: str, model: str, created: int, choices: list[dict[str, Any]], usage: Usage
          ) -> dict[str, Any]:
    return {**envelope(kind, response_id, model, created, choices), "usage": usage.document()}


def usage_chunk(kind: str, response_id: str, model: str, created: int, usage: Usage) -> dict[str, Any]:
    """The last chunk of a stream with `stream_options.include_usage`: no choices, the usage."""
    return {**envelope(kind, response_id, model, created, []), "usage": usage.document()}


def model_object(name: str, created: int | None = None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(time.time()) if created is None else created,
            "owned_by": OWNER}
