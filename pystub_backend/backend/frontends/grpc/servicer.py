"""The `inference.GRPCInferenceService` servicer on `grpc.aio` (docs/reference/protocol.md#grpc-service).

Every handler is a coroutine on the server's event loop: health and metadata answer from the core's
in-memory state without awaiting, and inference awaits the core, so neither blocks the other.
Methods not implemented here answer UNIMPLEMENTED, from a coroutine too (see
`_answer_unimplemented_on_the_loop`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2, service_pb2_grpc

import pystub_backend.backend.frontends.grpc.shm as grpc_shm
from pystub_backend.backend import log as backend_log
from pystub_backend.backend.delay_hooks import delay_hooks
from pystub_backend.backend.errors import ServerError, Status, forget_traceback, grpc_code, grpc_details
from pystub_backend.backend.frontends.forwarding import forward_headers
from pystub_backend.backend.frontends.grpc.codec import (
    ParsedInferRequest,
    ReceivedInferRequest,
    decode_infer_request,
    log_settings_from_proto,
    log_settings_to_proto,
    parse_infer_request,
    repository_parameters,
    serialize_infer_response,
)
from pystub_backend.backend.frontends.grpc.offload import off_loop
from pystub_backend.backend.frontends.grpc.stream import stream_infer
from pystub_backend.backend.frontends.trace_settings import grpc_trace_setting
from pystub_backend.backend.header_patterns import HeaderPattern
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.telemetry.tracing import RequestTrace, Tracer

__all__ = ["InferenceServicer", "DECOUPLED_REFUSAL"]

# Triton's answer to ModelInfer for a decoupled model (the frontend workers' core link gives it too).
DECOUPLED_REFUSAL = "ModelInfer RPC doesn't support models with decoupled transaction policy"

_log = logging.getLogger(__name__)

_Servicer = TypeVar("_Servicer")
_Response = TypeVar("_Response")
# An RPC method of the servicer: (self, request, context) -> its response proto. The request stays
# Any: each RPC takes its own proto, and the frontend workers hand ModelInfer what their own
# deserializer parsed.
_Handler = Callable[[_Servicer, Any, grpc.aio.ServicerContext], Awaitable[_Response]]


def _rpc(handler: _Handler[_Servicer, _Response]) -> _Handler[_Servicer, _Response | None]:
    """Turn a `ServerError` into its gRPC status and anything else into INTERNAL (logged).

    The status is set on the context and the handler returns nothing (grpc sends the status and
    no message) rather than calling `context.abort`: grpc.aio keeps the AbortError that raises in
    a reference cycle with the call's state and frames, which hold the request until the garbage
    collector's full pass (each failed 16 MiB request held its 16 MiB). Cancellation
    (`asyncio.CancelledError`) is not an `Exception` and passes through to grpc untouched.
    """

    # Triton's test hooks (delay_hooks): inference waits before the model, the others before answering
    hooks = delay_hooks()
    before, after = (hooks.grpc_process_s, 0.0) if handler.__name__ == "ModelInfer" else (0.0, hooks.grpc_other_s)

    @functools.wraps(handler)
    async def wrapper(self: _Servicer, request: Any, context: grpc.aio.ServicerContext) -> _Response | None:
        try:
            if before:
                await asyncio.sleep(before)
            answer = await handler(self, request, context)
            if after:
                await asyncio.sleep(after)
            return answer
        except ServerError as exc:
            code, details = grpc_code(exc.status), exc.message
            forget_traceback(exc)
        except Exception as exc:
            _log.exception("gRPC %s failed", handler.__name__)
            code, details = grpc.StatusCode.INTERNAL, str(exc) or type(exc).__name__
            forget_traceback(exc)
        context.set_code(code)
        context.set_details(grpc_details(details))
        return None

    return wrapper


_TensorMetadata = service_pb2.ModelMetadataResponse.TensorMetadata


def _tensor_metadata(items: list[dict[str, Any]]) -> list[service_pb2.ModelMetadataResponse.TensorMetadata]:
    return [_TensorMetadata(name=item["name"], datatype=item["datatype"], shape=item["shape"])
            for item in items]


async def _unimplemented(self: service_pb2_grpc.GRPCInferenceServiceServicer, request: Message,
                         context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")


def _answer_unimplemented_on_the_loop(cls: type) -> type:
    """Replace every generated method the class does not define with an async UNIMPLEMENTED.

    The generated ones are sync and raise NotImplementedError: grpc.aio would run them on a
    thread pool it starts for the purpose and log each call as an unexpected servicer error.
    """
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        if method.name not in cls.__dict__:
            setattr(cls, method.name, _unimplemented)
    return cls


@_answer_unimplemented_on_the_loop
class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers the KServe v2 gRPC service from a `FrontendCore`."""

    def __init__(self, core: FrontendCore, header_pattern: HeaderPattern | None = None,
                 tracer: Tracer | None = None) -> None:
        self._core = core
        self._header_pattern = header_pattern  # --grpc-header-forward-pattern
        self._tracer = tracer or Tracer()

    @_rpc
    async def ServerLive(self, request: service_pb2.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=self._core.is_live())

    @_rpc
    async def ServerReady(self, request: service_pb2.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> service_pb2.ServerReadyResponse:
        return service_pb2.ServerReadyResponse(ready=self._core.is_ready())

    @_rpc
    async def ModelReady(self, request: service_pb2.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> service_pb2.ModelReadyResponse:
        ready = await self._core.model_ready(request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=ready)

    @_rpc
    async def ServerMetadata(self, request: service_pb2.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> service_pb2.ServerMetadataResponse:
        core = self._core
        return service_pb2.ServerMetadataResponse(
            name=core.server_name, version=core.server_version, extensions=core.extensions)

    @_rpc
    async def ModelMetadata(self, request: service_pb2.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> service_pb2.ModelMetadataResponse:
        meta = self._core.model_metadata(request.name, request.version)
        return service_pb2.ModelMetadataResponse(
            name=meta["name"],
            versions=[str(v) for v in meta.get("versions", [])],
            platform=meta.get("platform", ""),
            inputs=_tensor_metadata(meta.get("inputs", [])),
            outputs=_tensor_metadata(meta.get("outputs", [])),
        )

    @_rpc
    async def ModelConfig(self, request: service_pb2.ModelConfigRequest,
                          context: grpc.aio.ServicerContext) -> service_pb2.ModelConfigResponse:
        config = self._core.model_config(request.name, request.version)
        return service_pb2.ModelConfigResponse(config=config)

    @_rpc
    async def ModelStatistics(self, request: service_pb2.ModelStatisticsRequest,
                              context: grpc.aio.ServicerContext) -> service_pb2.ModelStatisticsResponse:
        # The core speaks the HTTP JSON form, whose names are the proto's (durations {count, ns}).
        stats = self._core.statistics(request.name, request.version)
        return json_format.ParseDict({"model_stats": stats},
                                     service_pb2.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    @_rpc
    async def RepositoryIndex(self, request: service_pb2.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> service_pb2.RepositoryIndexResponse:
        models = self._core.repository_index(ready_only=request.ready)
        return service_pb2.RepositoryIndexResponse(models=[
            service_pb2.RepositoryIndexResponse.ModelIndex(
                name=m["name"], version=m.get("version", ""),
                state=m.get("state", ""), reason=m.get("reason", ""))
            for m in models])

    @_rpc
    async def RepositoryModelLoad(self, request: service_pb2.RepositoryModelLoadRequest,
                                  context: grpc.aio.ServicerContext) -> service_pb2.RepositoryModelLoadResponse:
        _check_repository_name(request.repository_name)
        parameters = repository_parameters(request.parameters)
        await self._core.load_model(request.model_name, parameters)
        return service_pb2.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: service_pb2.RepositoryModelUnloadRequest,
                                    context: grpc.aio.ServicerContext) -> service_pb2.RepositoryModelUnloadResponse:
        _check_repository_name(request.repository_name)
        parameters = repository_parameters(request.parameters)
        await self._core.unload_model(request.model_name, parameters)
        return service_pb2.RepositoryModelUnloadResponse()

    @_rpc
    async def LogSettings(self, request: service_pb2.LogSettingsRequest,
                          context: grpc.aio.ServicerContext) -> service_pb2.LogSettingsResponse:
        updates = log_settings_from_proto(request.settings)
        settings = backend_log.update_settings(updates) if updates else backend_log.settings.as_dict()
        return log_settings_to_proto(settings)

    @_rpc
    async def TraceSetting(self, request: service_pb2.TraceSettingRequest,
                           context: grpc.aio.ServicerContext) -> service_pb2.TraceSettingResponse:
        return await grpc_trace_setting(self._tracer, self._core, request, context)

    # -- shared memory extensions (grpc_shm) ------------------------------------------------------
    @_rpc
    async def SystemSharedMemoryStatus(
            self, request: service_pb2.SystemSharedMemoryStatusRequest,
            context: grpc.aio.ServicerContext) -> service_pb2.SystemSharedMemoryStatusResponse:
        return grpc_shm.system_status(self._core.client_shm, request)

    @_rpc
    async def SystemSharedMemoryRegister(
            self, request: service_pb2.SystemSharedMemoryRegisterRequest,
            context: grpc.aio.ServicerContext) -> service_pb2.SystemSharedMemoryRegisterResponse:
        return grpc_shm.system_register(self._core.client_shm, request)

    @_rpc
    async def SystemSharedMemoryUnregister(
            self, request: service_pb2.SystemSharedMemoryUnregisterRequest,
            context: grpc.aio.ServicerContext) -> service_pb2.SystemSharedMemoryUnregisterResponse:
        return grpc_shm.system_unregister(self._core.client_shm, request)

    @_rpc
    async def CudaSharedMemoryStatus(
            self, request: service_pb2.CudaSharedMemoryStatusRequest,
            context: grpc.aio.ServicerContext) -> service_pb2.CudaSharedMemoryStatusResponse:
        return grpc_shm.cuda_status(self._core.client_shm, request)

    @_rpc
    async def CudaSharedMemoryRegister(
            self, request: service_pb2.CudaSharedMemoryRegisterRequest,
            context: grpc.aio.ServicerContext) -> service_pb2.CudaSharedMemoryRegisterResponse:
        return grpc_shm.cuda_register(self._core.client_shm, request)

    @_rpc
    async def CudaSharedMemoryUnregister(
            self, request: service_pb2.CudaSharedMemoryUnregisterRequest,
            context: grpc.aio.ServicerContext) -> service_pb2.CudaSharedMemoryUnregisterResponse:
        return await grpc_shm.cuda_unregister(self._core.client_shm, request)

    async def ModelStreamInfer(
            self, request_iterator: AsyncIterator[service_pb2.ModelInferRequest],
            context: grpc.aio.ServicerContext) -> None:
        # A coroutine writing with context.write, not a generator: see grpc/stream.py.
        await stream_infer(self._core, request_iterator, context, self._header_pattern, self._tracer)

    @_rpc
    async def ModelInfer(self, request: ReceivedInferRequest | ParsedInferRequest,
                         context: grpc.aio.ServicerContext) -> bytes | None:
        """Takes and returns the wire form (see `listener.register`): large tensors skip protobuf, and
        a large message is parsed off the event loop."""
        parsed = request if isinstance(request, ParsedInferRequest) else await _parsed(request, context)
        if parsed is None:
            return None
        message = parsed.message
        trace = _start_trace(self._tracer, message.model_name, context) if self._tracer.active else None
        try:
            target = self._core.target(message.model_name, message.model_version)  # the one lookup of this request
            if target is not None and target.decoupled:
                raise ServerError(DECOUPLED_REFUSAL, Status.UNSUPPORTED)
            decoded = decode_infer_request(message, parsed.raw_input_contents)
            forward_headers(context.invocation_metadata() or (), decoded.parameters, self._header_pattern)
            if trace is not None:
                decoded.trace = trace
                trace.request_start()
            response = await self._core.infer(decoded, target)
            complete = time.monotonic_ns()
            try:
                return serialize_infer_response(response)
            finally:
                # Output data may view a stub's arena: hand it back whatever happened while encoding.
                response.release()
                if trace is not None:  # grpc writes the bytes after we return: SEND_END is when they are ready
                    trace.sent(complete, complete, time.monotonic_ns())
        finally:
            if trace is not None:
                trace.finish()


async def _parsed(request: ReceivedInferRequest, context: grpc.aio.ServicerContext) -> ParsedInferRequest | None:
    """The request parsed off the event loop; None, with the call's status set as grpc sets it for
    a message its deserializer cannot parse, when it does not parse."""
    if request.parsed is None:
        try:
            request.parsed = await off_loop(parse_infer_request, request.data)
        except DecodeError as exc:  # the client's fault: not logged
            context.set_code(grpc.StatusCode.UNKNOWN)
            context.set_details(f"Unexpected {type(exc)}: {exc}")
            return None
    return request.parsed


def _start_trace(tracer: Tracer, model: str, context: grpc.aio.ServicerContext) -> RequestTrace | None:
    """A trace of a unary request (or None): grpc has read the whole message before the handler
    runs, so GRPC_WAITREAD_START and _END are both the handler's start."""
    now = time.monotonic_ns()
    parent = next((value for key, value in context.invocation_metadata() or () if key == "traceparent"), None)
    trace = tracer.start(model, "GRPC", parent if isinstance(parent, str) else None)
    if trace is not None:
        trace.received(now, now)
    return trace


def _check_repository_name(name: str) -> None:
    # Triton's gRPC frontend refuses a repository name: a model is looked up in every repository.
    if name:
        raise ServerError("'repository_name' specification is not supported", Status.UNSUPPORTED)
