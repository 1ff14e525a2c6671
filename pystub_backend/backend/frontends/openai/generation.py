"""Completions and chat completions: one inference request through the core, answered whole or
as server-sent events (`data: <chunk>\\n\\n` ... `data: [DONE]\\n\\n`).

Everything that can be refused is refused before the first event (unknown model 404, a model off
contract or a bad field 400, the core's own refusal), with OpenAI's error body and status. After
the first event an error becomes an event `{"error": {...}}`, then `[DONE]`.

A client that closes the connection cancels the request: the request's client link (as for v2
`/generate_stream`) closes when the transport goes, and cancels the response stream; the model sees
`is_cancelled()`, and what it still sends is dropped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.frontends.http.access_log import MODEL_KEY, REQUEST_ID_KEY
from pystub_backend.backend.frontends.http.request_link import http_request_link
from pystub_backend.backend.frontends.openai import documents
from pystub_backend.backend.frontends.openai.contract import llm_contract, response_text, token_counts
from pystub_backend.backend.frontends.openai.documents import Usage
from pystub_backend.backend.frontends.openai.errors import error_body, from_server_error
from pystub_backend.backend.frontends.openai.request_body import GenerationRequest
from pystub_backend.backend.inference import InferResponse, ServerCore
from pystub_backend.backend.telemetry.token_latency import TokenMetrics
from pystub_backend.backend.telemetry.tracing import RequestTrace, Tracer

__all__ = ["Endpoint", "COMPLETIONS", "CHAT", "Generation"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Endpoint:
    """What differs between the two generation endpoints: names and document shapes."""

    name: str  # the metrics label
    id_prefix: str
    chunk_object: str
    whole: Callable[[str, str, int, str, str, Usage], dict[str, Any]]
    chunk: Callable[[str, str, int, str, str | None], dict[str, Any]]
    opening: dict[str, str] | None = None  # a chat stream opens with the assistant's role


def _chat_chunk(response_id: str, model: str, created: int, text: str, finish: str | None) -> dict[str, Any]:
    return documents.chat_chunk(response_id, model, created, {"content": text} if text else {}, finish)


COMPLETIONS = Endpoint("completions", "cmpl", "text_completion", documents.completion, documents.completion_chunk)
CHAT = Endpoint("chat/completions", "chatcmpl", "chat.completion.chunk", documents.chat_completion, _chat_chunk,
                {"role": "assistant", "content": ""})


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class _Tally:
    """The text and timing of one generation as its responses arrive."""

    model: str
    metrics: TokenMetrics
    received: float  # time.monotonic() when the handler began
    pieces: list[str] = field(default_factory=list)
    last_sent: float | None = None
    # What the model reports (vLLM's outputs): the prompt's tokens with each response, and the
    # tokens of each response (a stream's are its deltas: they add up).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def take(self, response: InferResponse) -> str:
        text = response_text(response)
        prompt_tokens, completion_tokens = token_counts(response)
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if completion_tokens is not None:
            self.completion_tokens = (self.completion_tokens or 0) + completion_tokens
        if text:
            self.pieces.append(text)
        return text

    def sent(self) -> None:
        """A text chunk went to the client (a whole answer counts as one)."""
        now = time.monotonic()
        if self.last_sent is None:
            self.metrics.first_token(self.model, now - self.received)
        else:
            self.metrics.between_tokens(self.model, now - self.last_sent)
        self.last_sent = now

    def usage(self, prompt: str) -> Usage:
        prompt_tokens, completion_tokens = self.prompt_tokens, self.completion_tokens
        return Usage(documents.count_words(prompt) if prompt_tokens is None else prompt_tokens,
                     documents.count_words("".join(self.pieces)) if completion_tokens is None else completion_tokens)

    def finish_reason(self, usage: Usage, max_tokens: int | None) -> str:
        return "length" if max_tokens is not None and usage.completion_tokens >= max_tokens else "stop"


class Generation:
    """Serves one endpoint's generation requests against the core."""

    def __init__(self, core: ServerCore, tracer: Tracer, metrics: TokenMetrics) -> None:
        self._core = core
        self._tracer = tracer
        self._metrics = metrics

    async def serve(self, request: web.Request, generation: GenerationRequest, endpoint: Endpoint,
                    received: float) -> web.StreamResponse:
        """Raises OpenAIError / ServerError before the first byte of the answer."""
        contract = llm_contract(self._core, generation.model)  # 404 or 400 before anything starts
        request[MODEL_KEY] = generation.model
        response_id = request[REQUEST_ID_KEY] = documents.new_id(endpoint.id_prefix)
        infer_request = contract.request(generation, response_id)
        trace = self._start_trace(request, generation.model)
        infer_request.trace = trace
        tally = _Tally(generation.model, self._metrics, received)
        failed = True
        try:
            stream = await self._core.infer_stream(infer_request)
            with http_request_link(request) as link:
                link.watch(stream, stream.cancel)  # the client's connection drops: the model is told
                try:
                    if generation.stream:
                        reply, failed = await self._streamed(request, stream, generation, endpoint, response_id, tally)
                        return reply
                    answer = await self._whole(stream, generation, endpoint, response_id, tally)
                    failed = False
                    return answer
                finally:
                    # a no-op once the final response is in; else (an error, a client gone) the model is told
                    stream.cancel()
        finally:
            self._metrics.request(generation.model, endpoint.name, failed)
            if trace is not None:
                now = time.monotonic_ns()
                trace.sent(now, now, now)
                trace.finish()

    def _start_trace(self, request: web.Request, model: str) -> RequestTrace | None:
        if not self._tracer.active:
            return None
        trace = self._tracer.start(model, "HTTP", request.headers.get("traceparent"))
        if trace is not None:
            now = time.monotonic_ns()
            trace.received(now, now)
            trace.request_start()
        return trace

    async def _whole(self, stream: Any, generation: GenerationRequest, endpoint: Endpoint, response_id: str,
                     tally: _Tally) -> web.Response:
        async for response in stream:
            try:
                if response.error is not None:
                    raise response.error
                tally.take(response)
            finally:
                response.release()
        usage = tally.usage(generation.prompt)
        document = endpoint.whole(response_id, generation.model, int(time.time()), "".join(tally.pieces),
                                  tally.finish_reason(usage, generation.max_tokens), usage)
        tally.sent()
        return web.json_response(document)

    async def _streamed(self, request: web.Request, stream: Any, generation: GenerationRequest, endpoint: Endpoint,
                        response_id: str, tally: _Tally) -> tuple[web.StreamResponse, bool]:
        """The SSE answer, and whether it ended with an error (or the client leaving)."""
        created, model = int(time.time()), generation.model
        reply = web.StreamResponse(headers=_SSE_HEADERS)
        await reply.prepare(request)
        try:
            if endpoint.opening is not None:
                await reply.write(_event(documents.chat_chunk(response_id, model, created, endpoint.opening, None)))
            error = await self._relay(reply, stream, endpoint, response_id, model, created, tally)
            if error is None:
                usage = tally.usage(generation.prompt)
                finish = tally.finish_reason(usage, generation.max_tokens)
                await reply.write(_event(endpoint.chunk(response_id, model, created, "", finish)))
                if generation.include_usage:
                    await reply.write(_event(documents.usage_chunk(endpoint.chunk_object, response_id, model, created,
                                                                   usage)))
            else:
                await reply.write(_event(error_body(from_server_error(error))))
            await reply.write(_DONE)
            await reply.write_eof()
            return reply, error is not None
        except ConnectionResetError:
            return reply, True  # the client went away mid-stream; the caller cancels the request

    async def _relay(self, reply: web.StreamResponse, stream: Any, endpoint: Endpoint, response_id: str, model: str,
                     created: int, tally: _Tally) -> ServerError | None:
        """Each response's text as a chunk; the first error response ends the relay."""
        async for response in stream:
            try:
                if response.error is not None:
                    return response.error
                text = tally.take(response)
                if text:
                    await reply.write(_event(endpoint.chunk(response_id, model, created, text, None)))
                    tally.sent()
            finally:
                response.release()
        return None
