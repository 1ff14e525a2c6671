"""Bare-frontend ceilings: servers that speak KServe v2 for identity_fp32 and do nothing else.

What pystub's frontends could serve with no model, no stub and no core behind them: each parses
the request as a real frontend must and echoes INPUT0 as OUTPUT0. Run by the harness
(`servers.start_bare`) with the project's Python, one process group per candidate:

    bare-http          aiohttp (pystub's HTTP stack): binary tensors and JSON tensors (orjson)
    bare-grpc-aio      grpc.aio server, every call through the asyncio layer (pystub's gRPC stack)
    bare-grpc-sync     grpc's threaded server (ThreadPoolExecutor, 8 workers): no asyncio layer
    bare-grpc-reuse4   4 grpc.aio processes sharing one port (SO_REUSEPORT); the kernel spreads
                       connections (not calls) over them

Each answers what perf_analyzer asks first (model metadata and config); the gRPC candidates also
serve readiness over HTTP on their HTTP port from a side thread, so the harness waits for all the
same way.

    python tools/compare/bare.py MODE HTTP_PORT GRPC_PORT
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import orjson
from aiohttp import web
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

MODES = ("bare-http", "bare-grpc-aio", "bare-grpc-sync", "bare-grpc-reuse4")
MODEL = "identity_fp32"
METADATA = {"name": MODEL, "versions": ["1"], "platform": "python",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}]}
CONFIG = {"name": MODEL, "backend": "python", "max_batch_size": 8,
          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
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

def _infer(request: service_pb2.ModelInferRequest) -> service_pb2.ModelInferResponse:
    tensor = request.inputs[0]
    response = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1")
    response.outputs.add(name="OUTPUT0", datatype="FP32", shape=tensor.shape)
    response.raw_output_contents.append(request.raw_input_contents[0])
    return response


def _metadata() -> service_pb2.ModelMetadataResponse:
    tensors = {k: [service_pb2.ModelMetadataResponse.TensorMetadata(**t) for t in METADATA[k]]
               for k in ("inputs", "outputs")}
    return service_pb2.ModelMetadataResponse(name=MODEL, versions=["1"], platform="python", **tensors)


def _config() -> service_pb2.ModelConfigResponse:
    io = {k: [model_config_pb2.ModelInput(name=t["name"], data_type=model_config_pb2.TYPE_FP32, dims=[-1])
              if k == "input" else model_config_pb2.ModelOutput(name=t["name"], data_type=model_config_pb2.TYPE_FP32,
                                                                 dims=[-1]) for t in CONFIG[k]]
          for k in ("input", "output")}
    config = model_config_pb2.ModelConfig(name=MODEL, backend="python", max_batch_size=8, **io)
    return service_pb2.ModelConfigResponse(config=config)


class _SyncServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ModelInfer(self, request, context):  # noqa: ANN001, ANN201, N802 - generated API
        return _infer(request)

    def ModelMetadata(self, request, context):  # noqa: ANN001, ANN201, N802
        return _metadata()

    def ModelConfig(self, request, context):  # noqa: ANN001, ANN201, N802
        return _config()

    def ServerLive(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ServerLiveResponse(live=True)

    def ServerMetadata(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ServerMetadataResponse(name="bare", version="0")

    def ServerReady(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ModelReadyResponse(ready=True)


class _AioServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):  # noqa: ANN001, ANN201, N802 - generated API
        return _infer(request)

    async def ModelMetadata(self, request, context):  # noqa: ANN001, ANN201, N802
        return _metadata()

    async def ModelConfig(self, request, context):  # noqa: ANN001, ANN201, N802
        return _config()

    async def ServerLive(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerMetadata(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ServerMetadataResponse(name="bare", version="0")

    async def ServerReady(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):  # noqa: ANN001, ANN201, N802
        return service_pb2.ModelReadyResponse(ready=True)


async def _serve_aio(port: int) -> None:
    server = grpc.aio.server(options=[*_MAX_MESSAGE, ("grpc.so_reuseport", 1)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_AioServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def run_grpc_sync(port: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=_MAX_MESSAGE)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_SyncServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def run_grpc_reuse(port: int, processes: int, http_port: int) -> None:
    """`processes` grpc.aio servers on one port; the parent only waits (it is the group leader)."""
    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            asyncio.run(_serve_aio(port))
            os._exit(0)
        children.append(pid)
    _serve_readiness(http_port)
    signal.signal(signal.SIGTERM, lambda *_: [os.kill(child, signal.SIGKILL) for child in children])
    for child in children:
        os.waitpid(child, 0)


def main(argv: list[str]) -> int:
    mode, http_port, grpc_port = argv[0], int(argv[1]), int(argv[2])
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {', '.join(MODES)}")
    if mode == "bare-http":
        run_http(http_port)
        return 0
    if mode == "bare-grpc-reuse4":
        run_grpc_reuse(grpc_port, 4, http_port)  # forks before any thread exists
    elif mode == "bare-grpc-sync":
        _serve_readiness(http_port)
        run_grpc_sync(grpc_port)
    else:
        _serve_readiness(http_port)
        asyncio.run(_serve_aio(grpc_port))
    return 0


def _serve_readiness(port: int) -> None:
    readiness = ThreadingHTTPServer(("127.0.0.1", port), _Readiness)
    threading.Thread(target=readiness.serve_forever, daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
