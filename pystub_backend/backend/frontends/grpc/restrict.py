"""`--grpc-restricted-protocol`: methods of a restricted group need a metadata key=value.

The groups are Triton's. As in Triton 2.51, the metadata key is the configured key prefixed with
`triton-grpc-protocol-`, and a call without it fails with UNAVAILABLE and Triton's text.
Reflection is never restricted (it describes, it does not act).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from pystub_backend.backend.options import Restrictions

__all__ = ["RestrictionInterceptor", "method_group", "HEADER_PREFIX"]

_GROUPS = {
    "health": ("ServerLive", "ServerReady", "ModelReady", "grpc.health.v1.Health/"),
    "metadata": ("ServerMetadata", "ModelMetadata"),
    "inference": ("ModelInfer", "ModelStreamInfer"),
    "shared-memory": ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
                      "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister"),
    "model-config": ("ModelConfig",),
    "model-repository": ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
    "statistics": ("ModelStatistics",),
    "trace": ("TraceSetting",),
    "logging": ("LogSettings",),
}
_INFERENCE_SERVICE = "/inference.GRPCInferenceService/"
HEADER_PREFIX = "triton-grpc-protocol-"
_BY_METHOD = {f"{_INFERENCE_SERVICE}{name}": group for group, names in _GROUPS.items() for name in names}


def method_group(method: str) -> str | None:
    """The API group of a full method name (`/package.Service/Method`), None when it has none."""
    if method.startswith("/grpc.health.v1.Health/"):
        return "health"
    return _BY_METHOD.get(method)


_Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class RestrictionInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, restrictions: Restrictions) -> None:
        self._restrictions = restrictions

    async def intercept_service(self, continuation: _Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        group = method_group(details.method)
        restriction = self._restrictions.get(group) if group else None
        handler = await continuation(details)
        if restriction is None or handler is None:
            return handler
        expected = HEADER_PREFIX + restriction.key
        metadata = details.invocation_metadata or ()
        if any(key == expected and value == restriction.value for key, value in metadata):
            return handler
        return _refusal(handler, f"This protocol is restricted, expecting header '{expected}'")


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that fails the call without reading it."""

    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    async def streaming(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        yield b""  # pragma: no cover - abort raises; this makes the function a generator

    if handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler if handler.request_streaming \
            else grpc.unary_stream_rpc_method_handler
        return make(streaming)
    make = grpc.stream_unary_rpc_method_handler if handler.request_streaming else grpc.unary_unary_rpc_method_handler
    return make(unary)
