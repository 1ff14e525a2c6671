"""Bare-frontend ceilings: servers that speak KServe v2 for identity_fp32 and do nothing else.

What pystub's frontends could serve with no model, no stub and no core behind them: each parses
the request as a real frontend must and echoes INPUT0 as OUTPUT0 (compare/bare_messages.py). Run
by the harness (`servers.start_bare`), one process group per candidate:

    bare-http               aiohttp (pystub's HTTP stack): binary tensors and JSON tensors (orjson)
    bare-grpc-aio           grpc.aio server, every call through the asyncio layer (pystub's gRPC stack)
    bare-grpc-sync          grpc's threaded server (ThreadPoolExecutor, 8 workers): no asyncio layer
    bare-grpc-sync-hop      the threaded server whose handler hands each call to an asyncio loop in
                            another thread and waits for it (what pystub's asyncio core would add)
    bare-grpc-reuse4        4 grpc.aio processes sharing one port (SO_REUSEPORT); the kernel spreads
                            connections (not calls) over them
    bare-grpc-native-sync   pygrpc-native's drop-in for grpc.server (HTTP/2 and gRPC in Rust, outside the
                            GIL; handlers as grpcio's, 8 worker threads)
    bare-grpc-native-aio    pygrpc-native's drop-in for grpc.aio.server (handlers on the event loop)
    bare-grpc-native-front, bare-grpclib, bare-grpc-hypercorn, bare-grpc-h2corn, bare-grpc-ngh2
                            HTTP/2 servers from PyPI other than grpcio (compare/bare_h2.py)

The candidates that need packages the project does not depend on (pygrpc-native and those of
bare_h2.py) run under the candidates' own venv (compare/environment.py), the others under the
project's Python.

Each answers what perf_analyzer asks first (model metadata and config); the gRPC candidates also
serve readiness over HTTP on their HTTP port from a side thread, so the harness waits for all the
same way.

    python tools/compare/bare.py MODE HTTP_PORT GRPC_PORT
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import bare_h2
import grpc
import orjson
from aiohttp import web
from bare_messages import CONFIG, METADATA, METHODS, MODEL, Handler
from google.protobuf.message import Message

GRPCIO_MODES = ("bare-grpc-aio", "bare-grpc-sync", "bare-grpc-sync-hop", "bare-grpc-reuse4")
MODES = ("bare-http", *GRPCIO_MODES, "bare-grpc-native-sync", "bare-grpc-native-aio", *bare_h2.MODES)
_SERVICE_NAME = "inference.GRPCInferenceService"
_BIND_TIMEOUT = 120.0  # s; for the gRPC port to accept connections before readiness is answered
_HOP_TIMEOUT = 30.0  # s; the loop thread only echoes, so a call this late means it is wedged
_MAX_MESSAGE = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


# ---- HTTP ----------------------------------------------------------------------------------

async def _http_infer(request: web.Request) -> web.Response:
    body = await request.read()
    length = request.headers.get("Inference-Header-Content-Length")
    header = orjson.loads(body if length is None else body[: int(length)])
    tensor = header["inputs"][0]
    out: dict[str, Any] = {"name": "OUTPUT0", "datatype": "FP32", "shape": tensor["shape"]}
    document: dict[str, Any] = {"model_name": MODEL, "model_version": "1", "outputs": [out]}
    if "data" in tensor:  # JSON tensors: the values go back as they came
        out["data"] = tensor["data"]
        return web.Response(body=orjson.dumps(document), content_type="application/json")
    data = memoryview(body)[int(length or 0):]
    out["parameters"] = {"binary_data_size": len(data)}
    head = orjson.dumps(document)
    return web.Response(body=head + data, content_type="application/octet-stream",
                             headers={"Inference-Header-Content-Length": str(len(head))})


async def _ok(request: web.Request) -> web.Response:
    return web.Response()


def run_http(port: int) -> None:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post(f"/v2/models/{MODEL}/infer", _http_infer)
    app.router.add_post(f"/v2/models/{MODEL}/versions/1/infer", _http_infer)
    app.router.add_get(f"/v2/models/{MODEL}", lambda r: _json(METADATA))
    app.router.add_get(f"/v2/models/{MODEL}/config", lambda r: _json(CONFIG))
    app.router.add_get("/v2", lambda r: _json({"name": "bare", "version": "0", "extensions": []}))
    app.router.add_get("/v2/health/{what}", _ok)
    app.router.add_get("/v2/models/{name}/ready", _ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def _json(value: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(value), content_type="application/json")


class _Readiness(BaseHTTPRequestHandler):
    """200 to every GET: lets the harness wait for a gRPC candidate as for any server."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b'{"extensions": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


# ---- gRPC ----------------------------------------------------------------------------------

def _add_service(server: grpc.Server | grpc.aio.Server, wrap: Callable[[Handler], Callable[..., Any]]) -> None:
    """Register every method of bare_messages.METHODS as the generated code would (`wrap` makes
    the handler sync, async or hopping)."""
    handlers = {name: grpc.unary_unary_rpc_method_handler(wrap(handler), request_deserializer=request.FromString,
                                                                response_serializer=response.SerializeToString)
                for name, (request, handler, response) in METHODS.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(_SERVICE_NAME, handlers)


def _sync(handler: Handler) -> Callable[[Message, grpc.ServicerContext], Message]:
    return lambda request, context: handler(request)


def _async(handler: Handler) -> Callable[[Message, grpc.aio.ServicerContext], Awaitable[Message]]:
    async def call(request: Message, context: grpc.aio.ServicerContext) -> Message:
        return handler(request)
    return call


async def _serve_aio(port: int, native: bool = False) -> None:
    if native:
        # the candidates' venv only; `from pygrpc_native import aio` recurses in its __getattr__ (0.5.0)
        import pygrpc_native.aio

        server = pygrpc_native.aio.server(options=_MAX_MESSAGE)
    else:
        server = grpc.aio.server(options=[*_MAX_MESSAGE, ("grpc.so_reuseport", 1)])
    _add_service(server, _async)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def run_grpc_sync(port: int, wrap: Callable[[Handler], Callable[..., Any]] = _sync, native: bool = False) -> None:
    if native:
        import pygrpc_native  # the candidates' venv only

        server = pygrpc_native.server(futures.ThreadPoolExecutor(max_workers=8), options=_MAX_MESSAGE)
    else:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=_MAX_MESSAGE)
    _add_service(server, wrap)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def run_grpc_sync_hop(port: int) -> None:
    """The threaded server whose handlers hand each call to an event loop in another thread and
    wait for its answer: what pystub's asyncio core would cost behind grpc's threaded server."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="core-loop", daemon=True).start()

    def hop(handler: Handler) -> Callable[[Message, grpc.ServicerContext], Message]:
        async def on_loop(request: Message) -> Message:
            return handler(request)

        def call(request: Message, context: grpc.ServicerContext) -> Message:
            return asyncio.run_coroutine_threadsafe(on_loop(request), loop).result(_HOP_TIMEOUT)
        return call
    run_grpc_sync(port, hop)


def run_grpc_reuse(port: int, processes: int, http_port: int) -> None:
    """`processes` grpc.aio servers on one port; the parent only waits (it is the group leader)."""
    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            asyncio.run(_serve_aio(port))
            os._exit(0)
        children.append(pid)
    _serve_readiness(http_port, port)
    def stop_children(*_: object) -> None:
        for child in children:
            os.kill(child, signal.SIGKILL)
    signal.signal(signal.SIGTERM, stop_children)
    for child in children:
        os.waitpid(child, 0)


def main(argv: list[str]) -> int:
    mode, http_port, grpc_port = argv[0], int(argv[1]), int(argv[2])
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {', '.join(MODES)}")
    if mode == "bare-http":
        run_http(http_port)
    elif mode == "bare-grpc-reuse4":
        run_grpc_reuse(grpc_port, 4, http_port)  # forks before any thread exists
    else:
        _serve_readiness(http_port, grpc_port)
        if mode == "bare-grpc-sync":
            run_grpc_sync(grpc_port)
        elif mode == "bare-grpc-sync-hop":
            run_grpc_sync_hop(grpc_port)
        elif mode == "bare-grpc-native-sync":
            run_grpc_sync(grpc_port, native=True)
        elif mode in ("bare-grpc-aio", "bare-grpc-native-aio"):
            asyncio.run(_serve_aio(grpc_port, native=mode == "bare-grpc-native-aio"))
        else:
            bare_h2.run(mode, grpc_port)
    return 0


def _serve_readiness(port: int, grpc_port: int) -> None:
    """Answer readiness on `port` once `grpc_port` accepts connections (from a side thread): the
    harness must not measure a candidate that is still binding."""
    readiness = ThreadingHTTPServer(("127.0.0.1", port), _Readiness)

    def serve() -> None:
        deadline = time.monotonic() + _BIND_TIMEOUT
        while not _accepts(grpc_port):
            if time.monotonic() > deadline:  # never ready: the harness times out naming this server
                return
            time.sleep(0.05)
        readiness.serve_forever()
    threading.Thread(target=serve, daemon=True).start()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
