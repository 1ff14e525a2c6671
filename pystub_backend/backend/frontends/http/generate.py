"""The generate extension: `POST …/generate` and `…/generate_stream` (docs/reference/protocol.md#generate-extension).

Request: a JSON object whose members that name model inputs become those tensors, the others
request parameters (`generate_request`, Triton's rules). Compressed bodies are refused.

Response: `{"<output>": value, ..., "id", "model_name", "model_version"}` with `Content-Type:
application/json`, 1-element tensors as scalars; FP16 and BF16 outputs cannot be written as JSON
(400, Triton's text). `generate` collects the request's responses: exactly one is the answer (an
error response: 400 with its message), any other number is 200 with Triton's "exactly 1 response"
error as the body. `generate_stream` answers with server-sent events, one `data: <json>\\n\\n` per
response, `Content-Type: text/event-stream; charset=utf-8` as Triton 2.51 sends it; the status
waits for the first response, as Triton's does: 400 when that one is an error (the event still
says it), else 200; a later error is a `data: {"error": ...}` event that ends the stream.

pystub goes further than Triton here (docs/reference/protocol.md#cancellation): a client that disconnects from
`generate_stream` cancels the request (the model sees `is_cancelled()`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.generate_request import generate_request
from pystub_backend.backend.frontends.http.json_tensors import tensor_to_json
from pystub_backend.backend.frontends.http.messages import JSON_TYPE, HttpRequest, Response, StreamResponse
from pystub_backend.backend.frontends.http.request_link import http_request_link
from pystub_backend.backend.inference import FrontendCore, InferResponse
from pystub_backend.backend.response_stream import ResponseStream

__all__ = ["EVENT_STREAM", "response_object", "generate", "generate_stream"]

EVENT_STREAM = "text/event-stream; charset=utf-8"
_NOT_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                     "generates various number of responses")


def response_object(response: InferResponse) -> dict[str, Any]:
    """The generate JSON form of one response (1-element tensors as scalars), keys in Triton's
    order. Raises ServerError(INVALID_ARG) for an output JSON cannot express (FP16, BF16)."""
    document: dict[str, Any] = {}
    for tensor in response.outputs:
        if tensor.datatype in ("FP16", "BF16"):
            raise ServerError(f"sending {tensor.datatype} data via JSON is not supported. Please use the binary "
                              f"data format for output", Status.INVALID_ARG)
        values = tensor_to_json(tensor)
        document[tensor.name] = values[0] if math.prod(tensor.shape) == 1 else values
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    return document


def _dump(document: dict[str, Any]) -> bytes:
    """Compact JSON as Triton writes it: NaN and Infinity spelled so, and BYTES that are not UTF-8
    (carried as surrogate escapes) as their raw bytes."""
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogateescape")


def _answer(document: dict[str, Any], status: int = 200) -> Response:
    return Response(body=_dump(document), status=status, content_type=JSON_TYPE)


def _outcome(response: InferResponse) -> tuple[dict[str, Any], bool]:
    """The document a response becomes and whether it is an error: its own, or the reason it
    cannot be written as JSON."""
    if response.error is not None:
        return {"error": response.error.message}, True
    try:
        return response_object(response), False
    except ServerError as error:
        return {"error": error.message}, True


async def _start(core: FrontendCore, request: HttpRequest) -> ResponseStream:
    if request.headers.get("Content-Encoding", "identity").lower() not in ("", "identity"):
        raise ServerError("compressed bodies are not supported by the generate extension", Status.UNSUPPORTED)
    name = request.match_info["model"]
    version = request.match_info.get("version", "")
    infer_request = generate_request(await request.read(), core.model_metadata(name, version), name, version)
    return await core.infer_stream(infer_request)


async def generate(core: FrontendCore, request: HttpRequest) -> Response:
    stream = await _start(core, request)
    responses: list[InferResponse] = []
    try:
        async for response in stream:
            if response.flags_only:
                response.release()
            else:
                responses.append(response)
        if len(responses) != 1:  # Triton 2.51 answers 200 with the error as the body
            return _answer({"error": _NOT_ONE_RESPONSE})
        document, failed = _outcome(responses[0])
        return _answer(document, 400 if failed else 200)  # Triton: 400 for every error response
    finally:
        for response in responses:
            response.release()
        stream.cancel()


async def generate_stream(core: FrontendCore, request: HttpRequest) -> StreamResponse:
    stream = await _start(core, request)
    reply = StreamResponse(headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache"})
    try:
        with http_request_link(request) as link:  # a client that leaves while the model is quiet
            link.watch(stream, stream.cancel)
            await _write_events(request, reply, stream)
        await reply.write_eof()
    except ConnectionError:  # reset, or "Connection lost" while waiting for room: cancelled below
        pass
    finally:
        # Normal end: nothing left to cancel. Client gone (ConnectionError, CancelledError, or
        # the link's poller saw the connection drop): the model learns it through is_cancelled().
        stream.cancel()
    return reply


async def _write_events(request: HttpRequest, reply: StreamResponse, stream: ResponseStream) -> None:
    """One event per response, and one write for all the responses that queued while the last
    write was in flight (a model streaming tokens faster than one write each). `write` waits while
    the client's connection is full and the responses are released only after it, so what a stream
    holds is its unread events in the socket buffers and the stub's send window. The headers go
    with the first event: its status says whether that event is an error."""
    while (first := await stream.next()) is not None:
        batch = [first, *stream.take_ready()]
        try:
            events = _events(batch)
            if events and not reply.prepared:
                reply.status = 400 if events[0][1] else 200
                await reply.prepare(request)
            if events:
                await reply.write(b"".join(event for event, _ in events))
        finally:
            for response in batch:
                response.release()
        if events and events[-1][1]:
            break
    if not reply.prepared:  # no response at all: an empty stream
        await reply.prepare(request)


def _events(batch: list[InferResponse]) -> list[tuple[bytes, bool]]:
    """The SSE event of each response of `batch` and whether it is an error (which ends the stream)."""
    events = []
    for response in batch:
        if response.flags_only:
            continue
        document, failed = _outcome(response)
        events.append((b"data: " + _dump(document) + b"\n\n", failed))
        if failed:
            break
    return events
