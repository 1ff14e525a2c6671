"""A gRPC server interceptor: one line per call at `--log-verbose 1` (frontends.access_log).

Unary calls are logged with the model and request id of their message; a stream once, when it
ends. Server-streaming calls (health watches) are long-lived and not logged.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from pystub_backend.backend.frontends.access_log import access_line
from pystub_backend.backend.frontends.grpc.restrict import peer_of
from pystub_backend.backend.log import verbose

__all__ = ["GrpcAccessInterceptor"]

_Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


def _infer_fields(request: object) -> tuple[str, str]:
    """(model, request id) of a ModelInfer request (parsed: `.message`) or a message naming a model."""
    message = getattr(request, "message", request)
    model = getattr(message, "model_name", "") or getattr(message, "name", "")
    return (model if isinstance(model, str) else ""), str(getattr(message, "id", "") or "")


def _status(context: grpc.aio.ServicerContext, failed: bool) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "UNKNOWN" if failed else "OK"


class GrpcAccessInterceptor(grpc.aio.ServerInterceptor):
    """Wraps each call's handler, when verbose logging is on, to log it once it ends.
    `trust_internal_peer`: the core's private socket behind frontend workers (restrict.peer_of)."""

    def __init__(self, trust_internal_peer: bool = False) -> None:
        self._trusted = trust_internal_peer

    async def intercept_service(self, continuation: _Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or not verbose(1):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(handler.unary_unary, method, self._trusted), request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _streaming(handler.stream_stream, method, self._trusted),
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        return handler  # server-streaming health watches: long-lived, not requests


def _unary(behavior: Callable[..., Awaitable[object]], method: str, trusted: bool
           ) -> Callable[..., Awaitable[object]]:
    async def logged(request: object, context: grpc.aio.ServicerContext) -> object:
        started, failed = time.perf_counter(), True
        try:
            result = await behavior(request, context)
            failed = False
            return result
        finally:
            model, request_id = _infer_fields(request)
            access_line("gRPC", method, _status(context, failed), time.perf_counter() - started,
                        peer_of(context, trusted), model, request_id)
    return logged


def _streaming(behavior: Callable[..., Any], method: str, trusted: bool) -> Callable[..., Any]:
    if not inspect.isasyncgenfunction(behavior):  # writes with context.write (ModelStreamInfer)
        async def logged_writer(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> None:
            started, failed = time.perf_counter(), True
            try:
                await behavior(requests, context)
                failed = False
            finally:
                _stream_line(context, method, failed, started, trusted)
        return logged_writer

    async def logged(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        started, failed = time.perf_counter(), True
        try:
            async for response in behavior(requests, context):
                yield response
            failed = False
        finally:
            _stream_line(context, method, failed, started, trusted)
    return logged


def _stream_line(context: grpc.aio.ServicerContext, method: str, failed: bool, started: float, trusted: bool) -> None:
    access_line("gRPC", method, _status(context, failed), time.perf_counter() - started, peer_of(context, trusted),
                "", "")
