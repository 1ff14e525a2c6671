"""The KServe v2 HTTP routes (docs/reference/protocol.md#listeners-limits-and-errors, #http-routes,
#http-inference-and-binary-tensors, #statistics-extension, #logging-extension, #model-repository-extension).

Routes translate HTTP into `FrontendCore` calls; the inference body format lives in `codec.py`
(decode and encode), `raw.py` (raw requests) and `compression.py`. Every error leaves
as `{"error": msg}` JSON through the application (app.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pystub_backend.backend.client_link import CURRENT
from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.access import AccessPolicy
from pystub_backend.backend.frontends.forwarding import forward_headers
from pystub_backend.backend.frontends.http.app import Front, HttpApp, compact_json, error_response
from pystub_backend.backend.frontends.http.codec import (
    INFERENCE_HEADER,
    Body,
    DecodedRequest,
    EncodedResponse,
    decode_http_body,
    encode_infer_response,
)
from pystub_backend.backend.frontends.http.compression import (
    compress_body,
    decompress_body,
    is_identity,
    response_encoding,
)
from pystub_backend.backend.frontends.http.control import control_routes
from pystub_backend.backend.frontends.http.generate import generate, generate_stream
from pystub_backend.backend.frontends.http.json_body import parse_json_body
from pystub_backend.backend.frontends.http.messages import BodyTooLarge, HttpRequest, Response, StreamResponse
from pystub_backend.backend.frontends.http.raw import decode_raw_request, raw_input_spec
from pystub_backend.backend.frontends.http.router import Handler, get, post, route
from pystub_backend.backend.frontends.http.shm import shm_routes
from pystub_backend.backend.frontends.http.trace_routes import trace_routes
from pystub_backend.backend.header_patterns import HeaderPattern
from pystub_backend.backend.inference import FrontendCore, InferRequest, no_release
from pystub_backend.backend.options import Restrictions
from pystub_backend.backend.telemetry.tracing import RequestTrace, Tracer
from pystub_backend.ipc.messages.multiplex import MODEL_ID_HEADER, MODEL_ID_PARAMETER

__all__ = ["create_http_app", "create_inference_app", "DECOUPLED_REFUSAL"]

# Triton's answer to /infer for a decoupled model (the frontend workers' core link gives it too).
DECOUPLED_REFUSAL = "HTTP end point doesn't support models with decoupled transaction policy"

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

# (De)compressing more than this runs in a worker thread so the loop keeps serving health checks.
_OFFLOAD_BYTES = 1 << 20
# A compressed body with binary tensor data is not bounded by --http-max-input-size (only its JSON
# part is); this bounds what it may inflate to, so a small body cannot claim unbounded memory.
_MAX_INFLATED = 1 << 32
_MODEL = "/v2/models/{model}"
_MODEL_VERSION = "/v2/models/{model}/versions/{version:[0-9]+}"


def create_http_app(core: FrontendCore, *, max_input_size: int = 64 * 2**20,
                    restrictions: Restrictions | None = None,
                    header_forward_pattern: HeaderPattern | None = None,
                    remote_control: frozenset[str] = frozenset(),
                    tracer: Tracer | None = None, trust_internal_peer: bool = False) -> HttpApp:
    """The application serving `core` on the inference port (listener.py serves it); a JSON part
    above `max_input_size` gets 400, a request of a restricted API group without its header gets
    403, a state-changing one the access policy refuses (frontends/access.py; `remote_control`
    opens groups) gets 403, and headers matching `header_forward_pattern` become inference
    request parameters. `trust_internal_peer` (only for the core's private socket behind
    frontend workers): the `INTERNAL_PEER` header names the client's address."""
    tracer = tracer or Tracer()
    routes = _Routes(core, max_input_size, header_forward_pattern, tracer)
    # Routes under one path prefix are tried in the order they were added: inference first (the
    # route almost every request takes) saves four regular-expression matches a request.
    table = [post(prefix + "/infer", routes.infer) for prefix in (_MODEL, _MODEL_VERSION)]
    table += [get("/v2/health/live", routes.live), get("/v2/health/ready", routes.ready),
              get("/v2", routes.server_metadata),
              get("/v2/models/stats", routes.statistics)]  # before /v2/models/{model}
    for prefix in (_MODEL, _MODEL_VERSION):
        table += [get(prefix, routes.model_metadata), get(prefix + "/ready", routes.model_ready),
                  get(prefix + "/config", routes.model_config), get(prefix + "/stats", routes.statistics),
                  post(prefix + "/generate", routes.generate),
                  post(prefix + "/generate_stream", routes.generate_stream)]
    table += [post("/v2/repository/index", routes.repository_index),
              post("/v2/repository/{repository}/index", routes.repository_index)]
    table += control_routes(core)  # model control and logging
    table += trace_routes(tracer, core)  # the trace extension's settings
    if hasattr(core, "client_shm"):
        table += shm_routes(core)  # system and CUDA shared memory
    return HttpApp(table, max_input_size=max_input_size, policy=AccessPolicy.of(restrictions, remote_control),
                   trust_internal_peer=trust_internal_peer)


def create_inference_app(core: FrontendCore, fallback: Handler, front: Front, *,
                         max_input_size: int = 64 * 2**20, restrictions: Restrictions | None = None,
                         header_forward_pattern: HeaderPattern | None = None,
                         remote_control: frozenset[str] = frozenset()) -> HttpApp:
    """A frontend worker's application: the infer routes of `create_http_app`, and `fallback` for
    every other request. `front` runs first (it may hand a request to `fallback` itself)."""
    routes = _Routes(core, max_input_size, header_forward_pattern, Tracer())  # the core traces
    table = [post(prefix + "/infer", routes.infer) for prefix in (_MODEL, _MODEL_VERSION)]
    table.append(route("*", "/{tail:.*}", fallback))
    return HttpApp(table, max_input_size=max_input_size, policy=AccessPolicy.of(restrictions, remote_control),
                   front=front)


async def _offload(size: int, function: Callable[..., _T], *args: Any) -> _T:
    if size < _OFFLOAD_BYTES:
        return function(*args)
    call = functools.partial(function, *args)
    return await asyncio.get_running_loop().run_in_executor(None, call)


def _model_ref(request: HttpRequest) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


# -- routes ----------------------------------------------------------------------------------------


class _Routes:
    """The route handlers, bound to one core."""

    def __init__(self, core: FrontendCore, max_input_size: int, header_pattern: HeaderPattern | None,
                 tracer: Tracer) -> None:
        self._core = core
        self._tracer = tracer
        self._max_input_size = max_input_size
        self._header_pattern = header_pattern

    async def live(self, request: HttpRequest) -> Response:
        # Triton answers 400 with an empty body; clients look only at the status.
        return Response(status=200 if self._core.is_live() else 400)

    async def ready(self, request: HttpRequest) -> Response:
        return Response(status=200 if self._core.is_ready() else 400)

    async def server_metadata(self, request: HttpRequest) -> Response:
        core = self._core
        return compact_json({"name": core.server_name, "version": core.server_version,
                             "extensions": list(core.extensions)})

    async def model_metadata(self, request: HttpRequest) -> Response:
        return compact_json(self._core.model_metadata(*_model_ref(request)))

    async def model_ready(self, request: HttpRequest) -> Response:
        if await self._core.model_ready(*_model_ref(request)):
            return Response(status=200)
        return error_response(400, "Model version not ready")

    async def model_config(self, request: HttpRequest) -> Response:
        return compact_json(self._core.model_config_json(*_model_ref(request)))

    async def statistics(self, request: HttpRequest) -> Response:
        name = request.match_info.get("model", "")
        version = request.match_info.get("version", "")
        return compact_json({"model_stats": self._core.statistics(name, version)})

    async def repository_index(self, request: HttpRequest) -> Response:
        return compact_json(self._core.repository_index(_ready_only(await request.read())))

    async def generate(self, request: HttpRequest) -> Response:
        return await generate(self._core, request)

    async def generate_stream(self, request: HttpRequest) -> StreamResponse:
        return await generate_stream(self._core, request)

    async def infer(self, request: HttpRequest) -> Response:
        match_info = request.match_info
        model, version = match_info["model"], match_info.get("version", "")
        # Tracing off: no trace, no clock read.
        trace = self._tracer.start(model, "HTTP", request.headers.get("traceparent")) if self._tracer.active else None
        try:
            return await self._infer(request, model, version, trace)
        finally:
            if trace is not None:
                trace.finish()

    async def _infer(self, request: HttpRequest, model: str, version: str, trace: RequestTrace | None) -> Response:
        received = time.monotonic_ns() if trace is not None else 0
        target = self._core.target(model, version)  # the one lookup of this request
        if target is not None and target.decoupled:
            raise ServerError(DECOUPLED_REFUSAL, Status.UNSUPPORTED)
        headers = request.headers
        header_length = headers.get(INFERENCE_HEADER)
        body_limit = self._body_limit(request, header_length)
        # a small body came with its head, in one piece (HttpRequest.complete_body): no wait
        body: Body | None = request.chunks[0] if request.complete and len(request.chunks) == 1 \
            else request.complete_body()
        encoding = headers.get("Content-Encoding")
        if body is None or (body_limit is not None and len(body) > body_limit) \
                or (encoding is not None and not is_identity(encoding)):
            body = await self._read_body(request, body_limit)
        decoded = self._decode(body, header_length, model, version)
        request.request_id = decoded.request.id  # for the access line (frontends.access_log)
        if MODEL_ID_HEADER in headers:
            _copy_multiplexed_model_id(headers[MODEL_ID_HEADER], decoded.request)
        if self._header_pattern is not None:
            forward_headers(headers.items(), decoded.request.parameters, self._header_pattern)
        if trace is not None:
            trace.received(received, time.monotonic_ns())
            decoded.request.trace = trace
            trace.request_start()
        # A client gone mid-request cancels it (the model sees is_cancelled()) and evicts its
        # pystub sequence: the request is its own client link, and the connection cancels this
        # task when the client goes (connection.py).
        CURRENT.set(request)
        request.cancel_on_loss = True
        if request.closed:  # gone already
            raise ServerError("the client closed the connection", Status.CANCELLED)
        response = await self._core.infer(decoded.request, target)
        completed = time.monotonic_ns() if trace is not None else 0
        try:
            encoded = encode_infer_response(response, decoded.output_format)
        finally:
            if response.release is not no_release:  # (outputs that came inline have nothing to free)
                response.release()  # every output byte has been copied into `encoded`
        accepted = headers.get("Accept-Encoding")
        encoding = response_encoding(accepted) if accepted and accepted != "identity" else None
        if encoding is not None:
            encoded = await _compress(encoded, encoding)
        answer = Response(encoded.body, headers=encoded.headers)
        if trace is not None:  # sent here, not by the connection after the handler, to time HTTP_SEND
            sending = time.monotonic_ns()
            request.connection.send_response(request, answer)
            trace.sent(completed, sending, time.monotonic_ns())
        return answer

    def _decode(self, body: Body, header_length: str | None, model: str, version: str) -> DecodedRequest:
        decoded = decode_http_body(body, header_length, model, version)
        if decoded is not None:
            return decoded
        spec = raw_input_spec(
            self._core.model_metadata(model, version), self._core.model_config_json(model, version)
        )
        return decode_raw_request(body, spec, model, version)

    def _body_limit(self, request: HttpRequest, header_length: str | None) -> int | None:
        """What the body may hold (None: unbounded), refusing with 400 what its head already says
        is too large.

        `--http-max-input-size` bounds the JSON part only, as in Triton: the whole body when there
        is no `Inference-Header-Content-Length`, else the length that header declares (checked
        before reading); binary tensor data after the JSON is not counted.
        """
        limit = self._max_input_size
        if header_length is not None:
            declared = _declared_json_length(header_length)
            if declared is not None and declared > limit:
                raise _too_large(limit, "JSON part")
            return None
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(limit)
        return limit

    async def _read_body(self, request: HttpRequest, body_limit: int | None) -> bytes | bytearray:
        """The decompressed body, refused with 400 as soon as it passes `body_limit`."""
        limit = self._max_input_size
        body = request.complete_body()
        if body is None:
            try:
                body = await request.read_body(body_limit)
            except BodyTooLarge:
                raise _too_large(limit) from None
        elif body_limit is not None and len(body) > body_limit:
            raise _too_large(limit)
        encoding = request.headers.get("Content-Encoding")
        if is_identity(encoding):  # nothing to undo: no worker thread for a large plain body
            return body
        inflate_limit = body_limit if body_limit is not None else _MAX_INFLATED
        return await _offload(len(body), decompress_body, body, encoding, inflate_limit)


def _declared_json_length(value: str | None) -> int | None:
    """The header's length when it is a plain number; anything else is judged by the decoder."""
    text = (value or "").strip()
    return int(text) if text.isdigit() else None


def _copy_multiplexed_model_id(value: str, infer_request: InferRequest) -> None:
    """Model multiplexing: the header `serve_multiplexed_model_id` (Ray Serve's name) sets the
    request parameter `multiplexed_model_id`; both given and different is an error."""
    given = infer_request.parameters.get(MODEL_ID_PARAMETER)
    if given is not None and given != value:
        raise ServerError(f"the header '{MODEL_ID_HEADER}' ('{value}') and the parameter '{MODEL_ID_PARAMETER}' "
                          f"('{given}') name different models", Status.INVALID_ARG)
    infer_request.parameters[MODEL_ID_PARAMETER] = value


def _too_large(limit: int, what: str = "request body") -> ServerError:
    message = f"{what} exceeds the maximum input size of {limit} bytes (--http-max-input-size)"
    return ServerError(message, Status.INVALID_ARG)


def _ready_only(body: bytes) -> bool:
    """The `ready` flag of a repository index request body (empty means False)."""
    if not body.strip():
        return False
    document = parse_json_body(body)
    ready = document.get("ready", False) if isinstance(document, dict) else None
    if not isinstance(ready, bool):
        raise ServerError("'ready' must be a boolean", Status.INVALID_ARG)
    return ready


async def _compress(encoded: EncodedResponse, encoding: str) -> EncodedResponse:
    body = await _offload(len(encoded.body), compress_body, encoded.body, encoding)
    return EncodedResponse(body, {**encoded.headers, "Content-Encoding": encoding})
