"""Completions and chat completions: `n` choices for each prompt, each one inference request
through the core, answered whole or as server-sent events (`data: <chunk>\\n\\n` ...
`data: [DONE]\\n\\n`).

Everything that can be refused is refused before the first event (unknown model 404, a model off
contract or a bad field 400, plan.py's checks, the core's own refusal), with OpenAI's error body
and status. After the first event an error becomes an event `{"error": {...}}`, then `[DONE]`.

A choice whose text reached a stop string is cancelled in the model at once. A client that closes
the connection cancels every choice: the request's client link (as for v2 `/generate_stream`)
closes when the transport goes, and cancels the response streams; the model sees `is_cancelled()`,
and what it still sends is dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

import pystub_backend.backend.frontends.openai.documents as documents
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.frontends.http.access_log import MODEL_KEY, REQUEST_ID_KEY
from pystub_backend.backend.frontends.http.request_link import http_request_link
from pystub_backend.backend.frontends.openai.choice import Choice, Step
from pystub_backend.backend.frontends.openai.contract import llm_contract
from pystub_backend.backend.frontends.openai.errors import error_body, from_server_error
from pystub_backend.backend.frontends.openai.logprobs import chat_logprobs, completion_logprobs
from pystub_backend.backend.frontends.openai.plan import Plan, plan
from pystub_backend.backend.frontends.openai.request_body import GenerationRequest
from pystub_backend.backend.frontends.openai.responses import ChoiceResponses
from pystub_backend.backend.frontends.openai.serving import OpenAIServing
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.response_stream import ResponseStream
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
    kind: str  # the whole answer's object
    chunk_kind: str
    chat: bool

    def delta(self, choice: Choice, step: Step, finish_reason: str | None = None) -> dict[str, Any]:
        pieces, entries = step
        if self.chat:
            logprobs = chat_logprobs(entries) if choice.trail is not None and entries else None
            return documents.chat_delta(choice.index, pieces, finish_reason, logprobs)
        logprobs = completion_logprobs(entries, choice.trail) if choice.trail is not None and entries else None
        return documents.completion_delta(choice.index, pieces, finish_reason, logprobs)

    def whole_choice(self, choice: Choice, finish_reason: str) -> dict[str, Any]:
        if self.chat:
            logprobs = chat_logprobs(choice.logprobs) if choice.trail is not None else None
            return documents.chat_choice(choice.index, choice.assembled, finish_reason, logprobs)
        logprobs = completion_logprobs(choice.logprobs, choice.trail) if choice.trail is not None else None
        return documents.completion_choice(choice.index, choice.assembled.content, finish_reason, logprobs)


COMPLETIONS = Endpoint("completions", "cmpl", "text_completion", "text_completion", chat=False)
CHAT = Endpoint("chat/completions", "chatcmpl", "chat.completion", "chat.completion.chunk", chat=True)


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"


class _Timing:
    """When text went out: time to first token and between chunks, for the per-model histograms."""

    def __init__(self, model: str, metrics: TokenMetrics, received: float) -> None:
        self._model = model
        self._metrics = metrics
        self._received = received  # time.monotonic() when the handler began
        self._last: float | None = None

    def sent(self) -> None:
        now = time.monotonic()
        if self._last is None:
            self._metrics.first_token(self._model, now - self._received)
        else:
            self._metrics.between_tokens(self._model, now - self._last)
        self._last = now


class Generation:
    """Serves one endpoint's generation requests against the core."""

    def __init__(self, core: FrontendCore, tracer: Tracer, metrics: TokenMetrics, serving: OpenAIServing) -> None:
        self._core = core
        self._tracer = tracer
        self._metrics = metrics
        self._serving = serving

    async def serve(self, request: web.Request, generation: GenerationRequest, endpoint: Endpoint,
                    received: float) -> web.StreamResponse:
        """Raises OpenAIError / ServerError before the first byte of the answer."""
        contract = llm_contract(self._core, generation.model)  # 404 or 400 before anything starts
        serving = self._serving
        request[MODEL_KEY] = generation.model
        response_id = request[REQUEST_ID_KEY] = documents.new_id(endpoint.id_prefix)
        failed = True
        try:
            how = await plan(contract, generation, serving.counter, serving.tool_call_parser, serving.max_model_len)
            trace = self._start_trace(request, generation.model)
            streams: list[ResponseStream] = []
            try:
                for index in range(how.size):
                    infer_request = how.request(index, response_id)
                    infer_request.trace = trace if index == 0 else None
                    streams.append(await self._core.infer_stream(infer_request))
                with http_request_link(request) as link:
                    for stream in streams:
                        link.watch(stream, stream.cancel)  # the client's connection drops: the model is told
                    timing = _Timing(generation.model, self._metrics, received)
                    if generation.stream:
                        reply, failed = await self._streamed(request, how, streams, endpoint, response_id, timing)
                        return reply
                    answer = await self._whole(how, streams, endpoint, response_id, timing)
                    failed = False
                    return answer
            finally:
                for stream in streams:
                    stream.cancel()  # a no-op once the final response is in; else the model is told
                self._end_trace(trace)
        finally:
            self._metrics.request(generation.model, endpoint.name, failed)

    def _start_trace(self, request: web.Request, model: str) -> RequestTrace | None:
        if not self._tracer.active:
            return None
        trace = self._tracer.start(model, "HTTP", request.headers.get("traceparent"))
        if trace is not None:
            now = time.monotonic_ns()
            trace.received(now, now)
            trace.request_start()
        return trace

    @staticmethod
    def _end_trace(trace: RequestTrace | None) -> None:
        if trace is not None:
            now = time.monotonic_ns()
            trace.sent(now, now, now)
            trace.finish()

    async def _whole(self, how: Plan, streams: list[ResponseStream], endpoint: Endpoint, response_id: str,
                     timing: _Timing) -> web.Response:
        choices = [how.choice(index) for index in range(how.size)]
        responses = ChoiceResponses(streams)
        try:
            while (item := await responses.next()) is not None:
                index, response = item
                if response is None:
                    continue
                try:
                    if response.error is not None:
                        raise response.error
                    choices[index].take(response)
                finally:
                    response.release()
                if choices[index].stopped:
                    streams[index].cancel()
                    responses.end(index)
        finally:
            responses.close()
        finished = []
        for choice in choices:
            choice.finish()
            finished.append(endpoint.whole_choice(choice, await how.finish_reason(choice)))
        document = documents.whole(endpoint.kind, response_id, how.generation.model, int(time.time()), finished,
                                   await how.usage(choices))
        timing.sent()
        return web.json_response(document, dumps=lambda value: orjson.dumps(value).decode())

    async def _streamed(self, request: web.Request, how: Plan, streams: list[ResponseStream], endpoint: Endpoint,
                        response_id: str, timing: _Timing) -> tuple[web.StreamResponse, bool]:
        """The SSE answer, and whether it ended with an error (or the client leaving)."""
        reply = web.StreamResponse(headers=_SSE_HEADERS)
        await reply.prepare(request)
        relay = _Relay(reply, how, endpoint, response_id, timing)
        try:
            error = await relay.run(streams)
            if error is None:
                if how.generation.include_usage:
                    usage = await how.usage(relay.choices)
                    await reply.write(_event(documents.usage_chunk(endpoint.chunk_kind, response_id,
                                                                   how.generation.model, relay.created, usage)))
            else:
                await reply.write(_event(error_body(from_server_error(error))))
            await reply.write(_DONE)
            await reply.write_eof()
            return reply, error is not None
        except ConnectionResetError:
            return reply, True  # the client went away mid-stream; the caller cancels the request


class _Relay:
    """One streamed answer: each response of each choice as a chunk, then each choice's finish."""

    def __init__(self, reply: web.StreamResponse, how: Plan, endpoint: Endpoint, response_id: str,
                 timing: _Timing) -> None:
        self._reply = reply
        self._how = how
        self._endpoint = endpoint
        self._response_id = response_id
        self._timing = timing
        self.created = int(time.time())
        self.choices = [how.choice(index) for index in range(how.size)]

    async def run(self, streams: list[ResponseStream]) -> ServerError | None:
        """Relays until every choice has finished; the first error response ends it."""
        if self._endpoint.chat:  # a chat stream opens with the assistant's role, per choice
            for choice in self.choices:
                await self._write(documents.chat_delta(choice.index, [], None, None, opening=True))
        responses = ChoiceResponses(streams)
        try:
            while (item := await responses.next()) is not None:
                index, response = item
                choice = self.choices[index]
                if response is None:
                    await self._finish(choice)
                    continue
                try:
                    if response.error is not None:
                        return response.error
                    step = choice.take(response)
                finally:
                    response.release()
                await self._step(choice, step)
                if choice.stopped:
                    streams[index].cancel()
                    responses.end(index)
                    await self._finish(choice)
            return None
        finally:
            responses.close()

    async def _step(self, choice: Choice, step: Step) -> None:
        pieces, entries = step
        if pieces or entries:
            await self._write(self._endpoint.delta(choice, step))
            self._timing.sent()

    async def _finish(self, choice: Choice) -> None:
        await self._step(choice, choice.finish())
        await self._write(self._endpoint.delta(choice, ([], []), await self._how.finish_reason(choice)))

    async def _write(self, choice_document: dict[str, Any]) -> None:
        document = documents.chunk(self._endpoint.chunk_kind, self._response_id, self._how.generation.model,
                                   self.created, choice_document, self._how.generation.include_usage)
        await self._reply.write(_event(document))
