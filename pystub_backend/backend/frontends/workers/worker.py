"""A frontend worker process: serves the public HTTP and gRPC ports beside its siblings
(SO_REUSEPORT) and hands the work to the core process.

    python -m pystub_backend.backend.frontends.workers.worker --directory DIR --index I -- ARGV...

ARGV is the server's own command line (with the ports the core resolved appended), parsed by the
same parser, so a worker sees exactly the options the core saw; `--directory` (the core's private
socket directory) and `--index` exist only here, not on the public command line.

Inference (`/infer`, `ModelInfer`) runs the in-process handlers with a `RemoteCore`; everything else
goes through the proxies. SIGINT is ignored (a Ctrl-C reaches the whole process group; the core
then stops the workers); SIGTERM stops accepting, lets in-flight requests finish, and exits. A
worker whose core link closes exits too.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from pystub_backend.backend import event_loop
from pystub_backend.backend.arguments import parse_args
from pystub_backend.backend.frontends.access import AccessPolicy
from pystub_backend.backend.frontends.grpc.access_log import GrpcAccessInterceptor
from pystub_backend.backend.frontends.grpc.codec import receive_infer_request
from pystub_backend.backend.frontends.grpc.listener import (
    INFERENCE_SERVICE,
    bind_listener,
    channel_arguments,
    new_server,
)
from pystub_backend.backend.frontends.grpc.restrict import RestrictionInterceptor
from pystub_backend.backend.frontends.grpc.servicer import InferenceServicer
from pystub_backend.backend.frontends.http.app import Front
from pystub_backend.backend.frontends.http.codec import INFERENCE_HEADER
from pystub_backend.backend.frontends.http.connection import ReadTimeouts
from pystub_backend.backend.frontends.http.listener import HttpListener
from pystub_backend.backend.frontends.http.messages import Answer, HttpRequest
from pystub_backend.backend.frontends.http.router import Handler
from pystub_backend.backend.frontends.http.server import create_inference_app
from pystub_backend.backend.frontends.workers.paths import CORE_SOCKET, GRPC_SOCKET, HTTP_SOCKET
from pystub_backend.backend.frontends.workers.proxy_grpc import GrpcProxy
from pystub_backend.backend.frontends.workers.proxy_http import HttpProxy
from pystub_backend.backend.frontends.workers.remote_core import CALL, CallContext, RemoteCore
from pystub_backend.backend.log import configure_logging
from pystub_backend.backend.options import ServerOptions
from pystub_backend.backend.telemetry.tracing import Tracer
from pystub_backend.ipc.heap import raise_malloc_thresholds

__all__ = ["main"]

log = logging.getLogger("pystub.workers")
_CONNECT_SECONDS = 30.0
_MODEL_INFER = f"/{INFERENCE_SERVICE}/ModelInfer"
_Stop = Callable[[], Awaitable[object]]


def _is_raw(value: str | None) -> bool:
    """Whether `Inference-Header-Content-Length` announces a raw body (0), which the proxy takes."""
    text = (value or "").strip()
    return text.isdigit() and int(text) == 0


def _front(proxy: HttpProxy) -> Front:
    async def front(request: HttpRequest, handler: Handler) -> Answer:
        if request.method == "POST" and request.path.endswith("/infer"):
            if _is_raw(request.headers.get(INFERENCE_HEADER)):
                return await proxy.handle(request)  # a raw body needs the model's metadata: the core's
            CALL.set(CallContext("HTTP", time.monotonic_ns(), request.headers.get("traceparent"), request))
        return await handler(request)

    return front


async def _serve_http(options: ServerOptions, remote: RemoteCore, directory: Path) -> _Stop:
    proxy = HttpProxy(str(directory / HTTP_SOCKET))
    app = create_inference_app(remote.as_server_core(), proxy.handle, _front(proxy),
                               max_input_size=options.http_max_input_size, restrictions=options.http_restrictions,
                               header_forward_pattern=options.http_header_forward_pattern,
                               remote_control=options.remote_control)
    timeouts = ReadTimeouts(options.http_header_timeout_secs, options.http_body_timeout_secs)
    listener = HttpListener(app, timeouts)
    await listener.start_tcp(options.http_address, options.http_port, reuse_port=True)

    async def stop() -> None:
        await listener.stop(options.settings.exit_timeout_seconds)
        await proxy.close()

    return stop


class _InferenceAccessLog(GrpcAccessInterceptor):
    """Access lines of the fast path only: the core logs what the proxy brings it."""

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method != _MODEL_INFER:
            return await continuation(details)
        return await super().intercept_service(continuation, details)


async def _serve_grpc(options: ServerOptions, remote: RemoteCore, directory: Path) -> _Stop:
    grpc_options = options.grpc
    policy = AccessPolicy.of(grpc_options.restrictions, grpc_options.remote_control)
    server = new_server(grpc_options.stack, channel_arguments(grpc_options, reuse_port=True),
                        [_InferenceAccessLog(), RestrictionInterceptor(policy)])
    # The core starts traces (core_side.py): the worker's own tracer stays off.
    servicer = InferenceServicer(remote.as_server_core(), grpc_options.header_forward_pattern, Tracer())

    async def model_infer(request: object, context: grpc.aio.ServicerContext) -> object:
        parent = next((value for key, value in context.invocation_metadata() or () if key == "traceparent"), None)
        CALL.set(CallContext("GRPC", time.monotonic_ns(), parent if isinstance(parent, str) else None))
        return await servicer.ModelInfer(request, context)

    fast = grpc.unary_unary_rpc_method_handler(model_infer, request_deserializer=receive_infer_request,
                                               response_serializer=None)
    proxy = GrpcProxy(str(directory / GRPC_SOCKET))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(INFERENCE_SERVICE, {"ModelInfer": fast}),
                                     proxy))
    bind_listener(server, options.grpc_address, options.grpc_port, grpc_options.tls)
    await server.start()

    async def stop() -> None:
        await server.stop(options.settings.exit_timeout_seconds)
        await proxy.close()

    return stop


async def _run(options: ServerOptions, directory: Path, index: int) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    remote = RemoteCore(str(directory / CORE_SOCKET))
    await remote.connect(_CONNECT_SECONDS)
    stoppers: list[_Stop] = []
    try:
        if options.allow_http:
            stoppers.append(await _serve_http(options, remote, directory))
        if options.allow_grpc:
            stoppers.append(await _serve_grpc(options, remote, directory))
        remote.hello(index, os.getpid())
        log.info("frontend worker %d (pid %d) serves HTTP %s:%d, gRPC %s:%d", index, os.getpid(),
                 options.http_address, options.http_port, options.grpc_address, options.grpc_port)
        lost = asyncio.ensure_future(remote.closed.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((lost, stopped), return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        stopped.cancel()
        return 0 if stop.is_set() else 1
    finally:  # both listeners drain at once: each is bounded by --exit-timeout-secs
        await asyncio.gather(*(stopper() for stopper in stoppers))
        await remote.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="pystub frontend worker")
    parser.add_argument("--directory", required=True, type=Path)
    parser.add_argument("--index", required=True, type=int)
    parser.add_argument("server_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    server_argv = args.server_argv[1:] if args.server_argv[:1] == ["--"] else args.server_argv
    options = parse_args(server_argv)
    configure_logging(options.log)
    raise_malloc_thresholds()  # as in the backend: request buffers are reused, not faulted in
    sys.exit(event_loop.run(_run(options, args.directory, args.index)))


if __name__ == "__main__":
    main()
