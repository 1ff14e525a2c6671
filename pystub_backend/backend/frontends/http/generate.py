"""The generate extension: `POST …/generate` and `…/generate_stream` (docs/reference/protocol.md#generate-extension).

Request: a JSON object whose top-level keys that name model inputs become those tensors (a scalar
or a 1-D list; type and shape from the model's metadata, batch dimension 1 for batching models);
other top-level keys and the members of `parameters` become request parameters. Compressed
bodies are refused.

Response: `{"id", "model_name", "model_version", "<output>": value, ...}`, 1-element tensors as
scalars. `generate` answers with one such object; `generate_stream` with server-sent events, one
`data: <json>\\n\\n` per response; an error before the first event is a normal JSON error, after
it a `data: {"error": ...}` event that ends the stream.

pystub goes further than Triton here (docs/reference/protocol.md#cancellation): a client that disconnects from
`generate_stream` cancels the request (the model sees `is_cancelled()`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.json_body import parse_json_body
from pystub_backend.backend.frontends.http.json_tensors import json_to_tensor_bytes, tensor_to_json
from pystub_backend.backend.frontends.http.request import HttpRequest
from pystub_backend.backend.frontends.http.request_link import http_request_link
from pystub_backend.backend.frontends.http.response import Response, StreamResponse, json_response
from pystub_backend.backend.inference import InferRequest, InferResponse, ServerCore, Tensor
from pystub_backend.backend.response_stream import ResponseStream

__all__ = ["generate_request", "response_object", "generate", "generate_stream"]


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


def _input_tensor(spec: dict[str, Any], value: Any, batching: bool) -> Tensor:
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, list) for v in values):
        raise _invalid(f"generate input '{spec['name']}' must be a scalar or a 1-D list")
    shape: tuple[int, ...] = (1, len(values)) if batching and len(spec["shape"]) > 1 else (len(values),)
    if not batching and len(spec["shape"]) == 0:
        shape = ()
    data = json_to_tensor_bytes(spec["name"], spec["datatype"], shape, values)
    return Tensor(spec["name"], spec["datatype"], shape, data)


def generate_request(body: bytes, metadata: dict[str, Any], batching: bool, model_name: str,
                     model_version: str) -> InferRequest:
    """The InferRequest for a generate body. Raises ServerError(INVALID_ARG)."""
    document = parse_json_body(body or b"{}")
    if not isinstance(document, dict):
        raise _invalid("the generate request must be a JSON object")
    inputs = {spec["name"]: spec for spec in metadata["inputs"]}
    parameters = document.pop("parameters", {}) or {}
    if not isinstance(parameters, dict):
        raise _invalid("'parameters' must be a JSON object")
    request_id = document.pop("id", "")
    tensors = []
    for key, value in document.items():
        if key in inputs:
            tensors.append(_input_tensor(inputs[key], value, batching))
        elif isinstance(value, (bool, int, float, str)):
            parameters[key] = value
        else:
            raise _invalid(f"generate parameter '{key}' must be a bool, number or string")
    for key, value in parameters.items():
        if not isinstance(value, (bool, int, float, str)):
            raise _invalid(f"generate parameter '{key}' must be a bool, number or string")
    return InferRequest(model_name, model_version, str(request_id), tensors, [], parameters)


def response_object(response: InferResponse) -> dict[str, Any]:
    """The generate JSON form of one response (1-element tensors as scalars)."""
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    for tensor in response.outputs:
        values = tensor_to_json(tensor)
        document[tensor.name] = values[0] if math.prod(tensor.shape) == 1 else values
    return document


async def _start(core: ServerCore, request: HttpRequest) -> tuple[Any, InferRequest]:
    if request.headers.get("Content-Encoding", "identity").lower() not in ("", "identity"):
        raise ServerError("compressed bodies are not supported by the generate extension", Status.UNSUPPORTED)
    name = request.match_info["model"]
    version = request.match_info.get("version", "")
    metadata = core.model_metadata(name, version)
    batching = core.model_config(name, version).max_batch_size > 0
    infer_request = generate_request(await request.read(), metadata, batching, name, version)
    return await core.infer_stream(infer_request), infer_request


async def generate(core: ServerCore, request: HttpRequest) -> Response:
    stream, _ = await _start(core, request)
    documents: list[dict[str, Any]] = []
    try:
        async for response in stream:
            try:
                if response.error is not None:
                    raise response.error
                if not response.flags_only:
                    documents.append(response_object(response))
            finally:
                response.release()
    finally:
        stream.cancel()
    if len(documents) > 1:  # Triton 2.51 answers 200 with the error as the body
        return json_response({"error": _NOT_ONE_RESPONSE})
    if not documents:
        raise ServerError(_NOT_ONE_RESPONSE, Status.UNSUPPORTED)
    return json_response(documents[0])


_NOT_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                     "generates various number of responses")


async def generate_stream(core: ServerCore, request: HttpRequest) -> StreamResponse:
    stream, _ = await _start(core, request)
    reply = StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                        "Cache-Control": "no-cache"})
    try:
        await reply.prepare(request)
        with http_request_link(request) as link:  # a client that leaves while the model is quiet
            link.watch(stream, stream.cancel)
            await _write_events(reply, stream)
        await reply.write_eof()
    except ConnectionError:  # reset, or "Connection lost" while waiting for room: cancelled below
        pass
    finally:
        # Normal end: nothing left to cancel. Client gone (ConnectionError, CancelledError, or
        # the link's poller saw the connection drop): the model learns it through is_cancelled().
        stream.cancel()
    return reply


async def _write_events(reply: StreamResponse, stream: ResponseStream) -> None:
    """One event per response, and one write for all the responses that queued while the last
    write was in flight (a model streaming tokens faster than one write each). `write` waits while
    the client's connection is full and the responses are released only after it, so what a stream
    holds is its unread events in the socket buffers and the stub's send window."""
    while (first := await stream.next()) is not None:
        batch = [first, *stream.take_ready()]
        try:
            events, ended = _events(batch)
            if events:
                await reply.write(events)
        finally:
            for response in batch:
                response.release()
        if ended:
            break


def _events(batch: list[InferResponse]) -> tuple[bytes, bool]:
    """The SSE bytes of `batch` and whether it ended the stream (an error event is the last)."""
    events = []
    for response in batch:
        if response.error is not None:
            events.append(_event({"error": response.error.message}))
            return b"".join(events), True
        if not response.flags_only:
            events.append(_event(response_object(response)))
    return b"".join(events), False


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"
