"""`--grpc-restricted-protocol`: methods of a restricted group need a metadata key=value.

The groups are Triton's. As in Triton 2.51, the metadata key is the configured key prefixed with
`triton-grpc-protocol-`, and a call without it fails with UNAVAILABLE and Triton's text.
Reflection is never restricted (it describes, it does not act).

State-changing methods also follow the access policy (frontends/access.py): from a peer that is
not loopback, in a group neither restricted nor opened, they fail with PERMISSION_DENIED. Load,
unload, register and unregister always change state; LogSettings and TraceSetting only when the
request carries settings (an empty one reads them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from pystub_backend.backend.frontends.access import INTERNAL_PEER, AccessPolicy

__all__ = ["RestrictionInterceptor", "method_group", "HEADER_PREFIX", "STATE_CHANGING", "UPDATING", "peer_of"]

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
# Methods that always change state, and those that do when their request carries `settings`.
STATE_CHANGING = frozenset(_INFERENCE_SERVICE + name for name in (
    "RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister"))
UPDATING = frozenset(_INFERENCE_SERVICE + name for name in ("LogSettings", "TraceSetting"))


def method_group(method: str) -> str | None:
    """The API group of a full method name (`/package.Service/Method`), None when it has none."""
    if method.startswith("/grpc.health.v1.Health/"):
        return "health"
    return _BY_METHOD.get(method)


_Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class RestrictionInterceptor(grpc.aio.ServerInterceptor):
    """Restricted groups (key check) and the access policy of state-changing methods."""

    def __init__(self, policy: AccessPolicy, trust_internal_peer: bool = False) -> None:
        self._policy = policy
        self._trusted = trust_internal_peer  # only on the core's private socket behind frontend workers

    async def intercept_service(self, continuation: _Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        group = method_group(details.method)
        restriction = self._policy.restrictions.get(group) if group else None
        handler = await continuation(details)
        if handler is None or group is None:
            return handler
        if restriction is not None:
            expected = HEADER_PREFIX + restriction.key
            metadata = details.invocation_metadata or ()
            if not any(key == expected and value == restriction.value for key, value in metadata):
                return _refusal(handler, f"This protocol is restricted, expecting header '{expected}'")
        if details.method in STATE_CHANGING or details.method in UPDATING:
            return _guarded(handler, self._policy, group, details.method in UPDATING, self._trusted)
        return handler


def _guarded(handler: grpc.RpcMethodHandler, policy: AccessPolicy, group: str, updating: bool,
             trusted: bool = False) -> grpc.RpcMethodHandler:
    """`handler` (unary-unary) that first asks the access policy about the caller's peer.

    The refusal sets the status and returns nothing rather than aborting (as the servicer's `_rpc`
    does, for the same reason: an abort's exception keeps the call's state alive in a cycle)."""
    behaviour = handler.unary_unary
    if behaviour is None:  # every state-changing method is unary-unary; anything else passes as is
        return handler

    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not updating or len(getattr(request, "settings", ())) > 0:
            refusal = policy.refusal(group, peer_of(context, trusted))
            if refusal is not None:
                context.set_code(grpc.StatusCode.PERMISSION_DENIED)
                context.set_details(refusal)
                return None
        return await behaviour(request, context)

    return grpc.unary_unary_rpc_method_handler(checked, request_deserializer=handler.request_deserializer,
                                               response_serializer=handler.response_serializer)


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


def peer_of(context: grpc.aio.ServicerContext, trusted: bool) -> str:
    """The caller's address: the frontend worker's INTERNAL_PEER metadata when `trusted`."""
    if trusted:
        for key, value in context.invocation_metadata() or ():
            if key == INTERNAL_PEER and isinstance(value, str):
                return value
    return context.peer() or ""
