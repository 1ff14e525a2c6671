"""The gRPC listener: a server with the inference service, health and reflection.

The server is the h2 stack (`grpc/h2`: libnghttp2 on pystub's event loop) or grpc.aio
(`--grpc-server=aio`); both host the same servicers, interceptors and handlers. What the command
line decides arrives as `GrpcOptions`: grpc core channel arguments (keepalive, HTTP/2 ping policy,
connection age, compression level), SO_REUSEPORT, TLS (server-only or mutual) and the restricted
protocol groups.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from tritonclient.grpc import service_pb2_grpc

from pystub_backend.backend.frontends.access import AccessPolicy
from pystub_backend.backend.frontends.grpc.access_log import GrpcAccessInterceptor
from pystub_backend.backend.frontends.grpc.codec import receive_infer_request
from pystub_backend.backend.frontends.grpc.h2 import H2Server, tls_context
from pystub_backend.backend.frontends.grpc.health import SERVICE_NAME as HEALTH_SERVICE
from pystub_backend.backend.frontends.grpc.health import HealthService
from pystub_backend.backend.frontends.grpc.restrict import RestrictionInterceptor
from pystub_backend.backend.frontends.grpc.servicer import InferenceServicer
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.options import GrpcOptions, TlsFiles
from pystub_backend.backend.telemetry.tracing import Tracer

__all__ = ["GrpcListener", "create_grpc_listener", "create_grpc_server", "INFERENCE_SERVICE", "bind_listener",
           "channel_arguments", "GrpcServer", "new_server", "enable_reflection"]

GrpcServer: TypeAlias = grpc.aio.Server | H2Server

INFERENCE_SERVICE = "inference.GRPCInferenceService"

_BASE_CHANNEL_ARGS: dict[str, int] = {
    # grpc caps messages at 4 MiB; Triton at INT32_MAX, and perf_analyzer sends large batches. The
    # limit holds after decompression (docs/hostile-input.md).
    "grpc.max_receive_message_length": 2**31 - 1,
    "grpc.max_send_message_length": -1,
    # A call's header list: grpc core's hard limit, and its soft limit (where grpc core refuses a
    # growing share of calls at random) set to the same, as the h2 stack has no soft limit.
    "grpc.absolute_max_metadata_size": 16 << 10,
    "grpc.max_metadata_size": 16 << 10,
    # gRPC sets SO_REUSEPORT by default, which lets a second server bind a busy port and
    # silently take half the connections; a busy port must be an error unless asked for.
    "grpc.so_reuseport": 0,
    # A connection that never completes its handshake, or stays without calls, must not hold a
    # descriptor forever (grpc core's defaults: 120 s, and no idle limit). Flags override both.
    "grpc.server_handshake_timeout_ms": 30_000,
    "grpc.max_connection_idle_ms": 300_000,
}


class _HandlerCapture:
    """Stands in for a server to catch the method handlers the generated code registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # the same handlers also come through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers = dict(handlers)


def register(servicer: InferenceServicer, server: GrpcServer) -> None:
    """The generated registration, except that ModelInfer parses and serializes its own messages
    (`codec.receive_infer_request` / `serialize_infer_response`): protobuf's bytes fields cost
    50-130 ms per 16 MiB tensor."""
    capture = _HandlerCapture()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, capture)
    handlers = capture.handlers
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer, request_deserializer=receive_infer_request, response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(INFERENCE_SERVICE, handlers),))
    server.add_registered_method_handlers(INFERENCE_SERVICE, handlers)


@dataclass
class GrpcListener:
    server: GrpcServer
    port: int
    health: HealthService

    async def start(self) -> None:
        await self.server.start()

    async def stop(self, grace: float) -> None:
        """NOT_SERVING to health watchers (their streams end), then stop within `grace` seconds."""
        self.health.close()
        await self.health.watchers_told(min(grace, 2.0))
        await self.server.stop(grace)


def _credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Raises OSError when a PEM file cannot be read."""
    pair = (Path(tls.server_key).read_bytes(), Path(tls.server_cert).read_bytes())
    root = Path(tls.root_cert).read_bytes() if tls.root_cert else None
    return grpc.ssl_server_credentials([pair], root_certificates=root, require_client_auth=tls.mutual)


def _add_port(server: GrpcServer, target: str, tls: TlsFiles | None) -> int:
    if tls is None:
        return server.add_insecure_port(target)
    if isinstance(server, H2Server):
        try:
            context = tls_context(tls.server_key, tls.server_cert, tls.root_cert or None, tls.mutual)
        except ssl.SSLError as exc:
            raise OSError(f"cannot use the TLS files of the gRPC listener: {exc}") from exc
        return server.add_secure_port(target, context)
    return server.add_secure_port(target, _credentials(tls))


def bind_listener(server: GrpcServer, address: str, port: int, tls: TlsFiles | None) -> int:
    """Bind `server` to address:port (or a `unix:` address); the bound port. Raises OSError."""
    if address.startswith("unix:"):  # the core's private socket behind frontend workers
        target = address
    else:
        host = f"[{address}]" if ":" in address and not address.startswith("[") else address
        target = f"{host}:{port}"
    try:
        bound = _add_port(server, target, tls)
    except (RuntimeError, OSError) as exc:  # grpcio reports a failed bind as RuntimeError
        raise OSError(f"cannot bind gRPC listener to {target}: {exc}") from exc
    if bound == 0:  # older grpcio returned 0 instead of raising
        raise OSError(f"cannot bind gRPC listener to {target}")
    return bound


def create_grpc_listener(core: FrontendCore, address: str, port: int,
                         options: GrpcOptions | None = None, tracer: Tracer | None = None) -> GrpcListener:
    """The gRPC listener for `core`, bound but not started.

    Call it on the event loop that will run the server, then `await listener.start()`. Port 0 binds
    an ephemeral port. Raises OSError when the address cannot be bound or a TLS file read.
    """
    options = options or GrpcOptions()
    channel_args = channel_arguments(options)
    # The access line first, so a refused call is logged too; the access policy is always installed:
    # state-changing methods follow it even with no restriction configured.
    interceptors: list[grpc.aio.ServerInterceptor] = [
        GrpcAccessInterceptor(options.trust_internal_peer),  # access lines at --log-verbose 1
        RestrictionInterceptor(AccessPolicy.of(options.restrictions, options.remote_control),
                               options.trust_internal_peer),
    ]
    server = new_server(options.stack, channel_args, interceptors)
    register(InferenceServicer(core, options.header_forward_pattern, tracer), server)
    health = HealthService(core)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    enable_reflection((INFERENCE_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server)
    return GrpcListener(server, bind_listener(server, address, port, options.tls), health)


def new_server(stack: str, channel_args: dict[str, int],
               interceptors: list[grpc.aio.ServerInterceptor]) -> GrpcServer:
    """An unbound server of `stack` ("h2" or "aio", `--grpc-server`). Arguments named `pystub.*`
    are the h2 stack's own."""
    if stack == "aio":
        options = [(name, value) for name, value in channel_args.items() if not name.startswith("pystub.")]
        return grpc.aio.server(options=options, interceptors=interceptors)
    return H2Server(channel_args, interceptors)


def enable_reflection(service_names: tuple[str, ...], server: GrpcServer) -> None:
    """The reflection service, its asyncio servicer on either stack."""
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(service_names), server)


def channel_arguments(options: GrpcOptions, reuse_port: bool = False) -> dict[str, int]:
    """The server's channel arguments: pystub's base, SO_REUSEPORT, then the flags' values."""
    reuse = int(options.reuse_port or reuse_port)
    return {**_BASE_CHANNEL_ARGS, "grpc.so_reuseport": reuse, **options.channel_args}


def create_grpc_server(core: FrontendCore, address: str, port: int,
                       options: GrpcOptions | None = None) -> tuple[GrpcServer, int]:
    """`create_grpc_listener` for callers that stop the server themselves: (server, bound port)."""
    listener = create_grpc_listener(core, address, port, options)
    return listener.server, listener.port
