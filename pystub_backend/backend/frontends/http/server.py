"""The KServe v2 HTTP frontend on aiohttp (docs/reference/protocol.md#listeners-limits-and-errors, #http-routes,
#http-inference-and-binary-tensors, #statistics-extension, #logging-extension, #model-repository-extension).

Routes translate HTTP into `ServerCore` calls; the inference body format lives in `http_codec`
(decode), `http_raw` (raw requests), `http_encode` (responses) and `http_compression`. Every error
leaves as `{"error": msg}` JSON through `_error_middleware`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from pystub_backend.backend.client_link import cancel_when_gone, http_request_link
from pystub_backend.backend.errors import ServerError, Status, forget_traceback, http_status
from pystub_backend.backend.frontends.access import INTERNAL_PEER, AccessPolicy
from pystub_backend.backend.frontends.forwarding import forward_headers
from pystub_backend.backend.frontends.http.access_log import PEER_KEY, REQUEST_ID_KEY
from pystub_backend.backend.frontends.http.codec import (
    INFERENCE_HEADER,
    Body,
    DecodedRequest,
    decode_infer_request,
    parse_header_length,
)
from pystub_backend.backend.frontends.http.compression import (
    compress_body,
    decompress_body,
    is_identity,
    response_encoding,
)
from pystub_backend.backend.frontends.http.control import control_routes
from pystub_backend.backend.frontends.http.encode import EncodedResponse, encode_infer_response
from pystub_backend.backend.frontends.http.generate import generate, generate_stream
from pystub_backend.backend.frontends.http.json_body import parse_json_body
from pystub_backend.backend.frontends.http.raw import decode_raw_request, raw_input_spec
from pystub_backend.backend.frontends.http.restrict import restriction_middleware
from pystub_backend.backend.frontends.http.shm import shm_routes
from pystub_backend.backend.frontends.json_reply import json_reply
from pystub_backend.backend.frontends.trace_settings import trace_routes
from pystub_backend.backend.header_patterns import HeaderPattern
from pystub_backend.backend.inference import InferRequest, ServerCore
from pystub_backend.backend.options import Restrictions
from pystub_backend.backend.telemetry.tracing import RequestTrace, Tracer
from pystub_backend.ipc.messages.multiplex import MODEL_ID_HEADER, MODEL_ID_PARAMETER

__all__ = ["create_http_app", "create_inference_app", "DECOUPLED_REFUSAL"]

# Triton's answer to /infer for a decoupled model (the frontend workers' core link gives it too).
DECOUPLED_REFUSAL = "HTTP end point doesn't support models with decoupled transaction policy"

_log = logging.getLogger(__name__)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_T = TypeVar("_T")

# (De)compressing more than this runs in a worker thread so the loop keeps serving health checks.
_OFFLOAD_BYTES = 1 << 20
# A compressed body with binary tensor data is not bounded by --http-max-input-size (only its JSON
# part is); this bounds what it may inflate to, so a small body cannot claim unbounded memory.
_MAX_INFLATED = 1 << 32
_MODEL = "/v2/models/{model}"
_MODEL_VERSION = "/v2/models/{model}/versions/{version:[0-9]+}"


def create_http_app(core: ServerCore, *, max_input_size: int = 64 * 2**20,
                    restrictions: Restrictions | None = None,
                    header_forward_pattern: HeaderPattern | None = None,
                    remote_control: frozenset[str] = frozenset(),
                    tracer: Tracer | None = None, trust_internal_peer: bool = False) -> web.Application:
    """The aiohttp application serving `core`; a JSON part above `max_input_size` gets 400, a
    request of a restricted API group without its header gets 403, a state-changing one the
    access policy refuses (frontends/access.py; `remote_control` opens groups) gets 403, and
    headers matching `header_forward_pattern` become inference request parameters.
    `trust_internal_peer` (only for the core's private socket behind frontend workers): the
    `INTERNAL_PEER` header names the client's address."""
    front: list[Middleware] = [_internal_peer_middleware] if trust_internal_peer else []
    app = _application(max_input_size, front, AccessPolicy.of(restrictions, remote_control))
    tracer = tracer or Tracer()
    routes = _Routes(core, max_input_size, header_forward_pattern, tracer)
    router = app.router
    # aiohttp tries the routes under one path prefix in the order they were added: inference first
    # (the route almost every request takes) saves four regular-expression matches a request.
    for prefix in (_MODEL, _MODEL_VERSION):
        router.add_post(prefix + "/infer", routes.infer)
    router.add_get("/v2/health/live", routes.live)
    router.add_get("/v2/health/ready", routes.ready)
    router.add_get("/v2", routes.server_metadata)
    router.add_get("/v2/models/stats", routes.statistics)  # before /v2/models/{model}
    for prefix in (_MODEL, _MODEL_VERSION):
        router.add_get(prefix, routes.model_metadata)
        router.add_get(prefix + "/ready", routes.model_ready)
        router.add_get(prefix + "/config", routes.model_config)
        router.add_get(prefix + "/stats", routes.statistics)
        router.add_post(prefix + "/generate", routes.generate)
        router.add_post(prefix + "/generate_stream", routes.generate_stream)
    router.add_post("/v2/repository/index", routes.repository_index)
    router.add_post("/v2/repository/{repository}/index", routes.repository_index)
    app.add_routes(control_routes(core))  # model control and logging
    app.add_routes(trace_routes(tracer, core))  # the trace extension's settings
    if hasattr(core, "client_shm"):
        app.add_routes(shm_routes(core))  # system and CUDA shared memory
    return app


def create_inference_app(core: ServerCore, fallback: _Handler, front: Middleware, *,
                         max_input_size: int = 64 * 2**20, restrictions: Restrictions | None = None,
                         header_forward_pattern: HeaderPattern | None = None,
                         remote_control: frozenset[str] = frozenset()) -> web.Application:
    """A frontend worker's application: the infer routes of `create_http_app`, and `fallback` for
    every other request. `front` runs first (it may hand a request to `fallback` itself)."""
    app = _application(max_input_size, [front], AccessPolicy.of(restrictions, remote_control))
    routes = _Routes(core, max_input_size, header_forward_pattern, Tracer())  # the core traces
    for prefix in (_MODEL, _MODEL_VERSION):
        app.router.add_post(prefix + "/infer", routes.infer)
    app.router.add_route("*", "/{tail:.*}", fallback)
    return app


def _application(max_input_size: int, front: list[Middleware], policy: AccessPolicy) -> web.Application:
    middlewares: list[Middleware] = [*front, _error_middleware, restriction_middleware(policy)]
    return web.Application(
        client_max_size=max_input_size,
        middlewares=middlewares,
        # Request bodies are decompressed here, under the size limit, not by aiohttp's parser.
        handler_args={"auto_decompress": False},
    )


@web.middleware
async def _internal_peer_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """The client's address as the frontend worker saw it (the access policy and log use it)."""
    peer = request.headers.get(INTERNAL_PEER)
    if peer is None:
        return await handler(request)
    request[PEER_KEY] = peer  # for the access line, which gets the original request
    return await handler(request.clone(remote=peer))


# -- responses and errors --------------------------------------------------------------------------


def _json(value: Any, status: int = 200) -> web.Response:
    return json_reply(value, status)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_reply({"error": message}, status, headers)


@web.middleware
async def _error_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServerError as err:
        forget_traceback(err)  # it may live on in a response or stream its frames hold: a cycle
        return _error(http_status(err.status), err.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_exception_error(exc)
    except ConnectionResetError:  # the client left, or was closed for reading too slowly: nobody to answer
        _log.debug("HTTP %s %s: the connection closed before the request was read", request.method, request.path)
        return _error(400, "the connection closed before the request was read")
    except Exception as exc:  # noqa: BLE001 - any failure must still answer in JSON
        _log.exception("HTTP %s %s failed", request.method, request.path)
        forget_traceback(exc)
        return _error(500, str(exc) or type(exc).__name__)


def _http_exception_error(exc: web.HTTPException) -> web.Response:
    if exc.status == 404:
        return _error(404, "Not Found")
    if exc.status == 405:
        return _error(405, "Method Not Allowed", {"Allow": exc.headers.get("Allow", "")})
    if exc.status == 413:  # aiohttp's client_max_size, from request.read()
        return _error(400, "request body exceeds the maximum input size")
    return _error(exc.status, exc.reason)


async def _offload(size: int, function: Callable[..., _T], *args: Any) -> _T:
    if size < _OFFLOAD_BYTES:
        return function(*args)
    call = functools.partial(function, *args)
    return await asyncio.get_running_loop().run_in_executor(None, call)


def _model_ref(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


# -- routes ----------------------------------------------------------------------------------------


class _Routes:
    """The route handlers, bound to one core."""

    def __init__(self, core: ServerCore, max_input_size: int, header_pattern: HeaderPattern | None,
                 tracer: Tracer) -> None:
        self._core = core
        self._tracer = tracer
        self._max_input_size = max_input_size
        self._header_pattern = header_pattern

    async def live(self, request: web.Request) -> web.Response:
        # Triton answers 400 with an empty body; clients look only at the status.
        return web.Response(status=200 if self._core.is_live() else 400)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._core.is_ready() else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        core = self._core
        return _json({"name": core.server_name, "version": core.server_version,
                      "extensions": list(core.extensions)})

    async def model_metadata(self, request: web.Request) -> web.Response:
        return _json(self._core.model_metadata(*_model_ref(request)))

    async def model_ready(self, request: web.Request) -> web.Response:
        if await self._core.model_ready(*_model_ref(request)):
            return web.Response(status=200)
        return _error(400, "Model version not ready")

    async def model_config(self, request: web.Request) -> web.Response:
        return _json(self._core.model_config_json(*_model_ref(request)))

    async def statistics(self, request: web.Request) -> web.Response:
        name = request.match_info.get("model", "")
        version = request.match_info.get("version", "")
        return _json({"model_stats": self._core.statistics(name, version)})

    async def repository_index(self, request: web.Request) -> web.Response:
        return _json(self._core.repository_index(_ready_only(await request.read())))

    async def generate(self, request: web.Request) -> web.Response:
        return await generate(self._core, request)

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        return await generate_stream(self._core, request)

    async def infer(self, request: web.Request) -> web.StreamResponse:
        if not self._tracer.active:
            return await self._infer(request, None)
        trace = self._tracer.start(request.match_info["model"], "HTTP", request.headers.get("traceparent"))
        if trace is None:
            return await self._infer(request, None)
        try:
            return await self._infer(request, trace)
        finally:
            trace.finish()

    async def _infer(self, request: web.Request, trace: RequestTrace | None) -> web.StreamResponse:
        received = time.monotonic_ns()
        model, version = _model_ref(request)
        target = self._core.target(model, version)  # the one lookup of this request
        if target is not None and target.decoupled:
            raise ServerError(DECOUPLED_REFUSAL, Status.UNSUPPORTED)
        body = await self._read_body(request)
        decoded = self._decode(body, request, model, version)
        request[REQUEST_ID_KEY] = decoded.request.id  # for the access line (frontends.access_log)
        _copy_multiplexed_model_id(request, decoded.request)
        forward_headers(request.headers.items(), decoded.request.parameters, self._header_pattern)
        if trace is not None:
            trace.received(received, time.monotonic_ns())
            decoded.request.trace = trace
            trace.request_start()
        # A client gone mid-request cancels it (the model sees is_cancelled()) and evicts its
        # pystub sequence.
        with http_request_link(request) as link:
            cancel_when_gone(link)
            response = await self._core.infer(decoded.request, target)
        completed = time.monotonic_ns()
        try:
            encoded = encode_infer_response(response, decoded.output_format)
        finally:
            response.release()  # every output byte has been copied into `encoded`
        encoding = response_encoding(request.headers.get("Accept-Encoding"))
        if encoding is not None:
            encoded = await _compress(encoded, encoding)
        answer = web.Response(body=encoded.body, headers=encoded.headers)
        if trace is not None:  # sent here, not by aiohttp after the handler, to time HTTP_SEND
            sending = time.monotonic_ns()
            await answer.prepare(request)
            await answer.write_eof()
            trace.sent(completed, sending, time.monotonic_ns())
        return answer

    def _decode(self, body: Body, request: web.Request, model: str, version: str) -> DecodedRequest:
        length = parse_header_length(request.headers.get(INFERENCE_HEADER), len(body))
        if length != 0:
            return decode_infer_request(body, length, model, version)
        spec = raw_input_spec(
            self._core.model_metadata(model, version), self._core.model_config_json(model, version)
        )
        return decode_raw_request(body, spec, model, version)

    async def _read_body(self, request: web.Request) -> bytes | bytearray:
        """The decompressed body, refused with 400 as soon as its JSON part passes the size limit.

        `--http-max-input-size` bounds the JSON part only, as in Triton: the whole body when there
        is no `Inference-Header-Content-Length`, else the length that header declares (checked
        before reading); binary tensor data after the JSON is not counted.
        """
        limit = self._max_input_size
        declared = _declared_json_length(request.headers.get(INFERENCE_HEADER))
        if declared is not None and declared > limit:
            raise _too_large(limit, "JSON part")
        body_limit = limit if INFERENCE_HEADER not in request.headers else None
        if body_limit is not None and request.content_length is not None and request.content_length > body_limit:
            raise _too_large(limit)
        # Joined once at the end (a single chunk is returned as it is): growing one buffer chunk
        # by chunk reallocates and copies it over and over (about 0.5 ms of CPU for a 1 MiB body).
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.readany():
            chunks.append(chunk)
            size += len(chunk)
            if body_limit is not None and size > body_limit:
                raise _too_large(limit)
        body = b"".join(chunks)
        encoding = request.headers.get("Content-Encoding")
        if is_identity(encoding):  # nothing to undo: no worker thread for a large plain body
            return body
        inflate_limit = body_limit if body_limit is not None else _MAX_INFLATED
        return await _offload(size, decompress_body, body, encoding, inflate_limit)


def _declared_json_length(value: str | None) -> int | None:
    """The header's length when it is a plain number; anything else is judged by the decoder."""
    text = (value or "").strip()
    return int(text) if text.isdigit() else None


def _copy_multiplexed_model_id(request: web.Request, infer_request: InferRequest) -> None:
    """Model multiplexing: the header `serve_multiplexed_model_id` (Ray Serve's name) sets the
    request parameter `multiplexed_model_id`; both given and different is an error."""
    value = request.headers.get(MODEL_ID_HEADER)
    if value is None:
        return
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
