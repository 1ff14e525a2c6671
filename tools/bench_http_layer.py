#!/usr/bin/env python3
"""What the HTTP layer of the inference port costs per small inference, measured with `wrk` (a C
load generator, so the client's own cost stays small) posting one 16 B KServe v2 binary request.

    bare      servers that read the request and answer 23 bytes, nothing else:
                aiohttp          a bare aiohttp app (the stack that served the port before)
                aiohttp-parser   a bare asyncio protocol on aiohttp's C parser
                httptools        a bare asyncio protocol on httptools (llhttp), answering in the
                                 parser's callback
                httptools-task   the same answering from a task per request (what a coroutine
                                 handler needs: the least any server awaiting a model pays)
                listener         pystub's listener (frontends/http/listener.py) and one route
    frontend  pystub's whole HTTP frontend (create_http_app: routing, checks, decoding, encoding)
              over an in-process core that answers at once, from this checkout and from
              `--baseline` (another checkout: the before); the server process's CPU
    backend   pystub-backend on examples/models identity_fp32 from this checkout and from
              `--baseline`; CPU of the backend process and of its stubs apart

CPU is user + system time from /proc over the wrk window, per completed request. Rounds alternate
the candidates (each sees the same load), the table gives medians and each row's ratio to the
first candidate. `uptime` is printed beside it. Linux only. Exits 0.

    .venv/bin/python tools/bench_http_layer.py bare
    .venv/bin/python tools/bench_http_layer.py frontend backend --baseline /tmp/pystub-before
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import cpu, servers  # noqa: E402

HEADER = (b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}],'
          b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}')
ANSWER = b'{"x":1}' + bytes(16)
_LUA = f"""wrk.method = "POST"
wrk.body = '{HEADER.decode()}' .. string.rep("\\0", 16)
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = "{len(HEADER)}"
"""
_PATH = "/v2/models/identity_fp32/infer"
_START_SECONDS = 60.0


# -- the servers (run by this file itself: `--serve KIND PORT`) ------------------------------------


def _serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, headers={"Inference-Header-Content-Length": "7"})

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nInference-Header-Content-Length: 7\r\n\r\n" % len(ANSWER)


class _HttptoolsProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import httptools
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.body = []
        self.transport.write(_HEAD + ANSWER)  # type: ignore[attr-defined]


class _HttptoolsTaskProtocol(_HttptoolsProtocol):
    def on_message_complete(self) -> None:
        body, self.body = self.body, []
        asyncio.get_running_loop().create_task(self._answer(body))

    async def _answer(self, body: list[bytes]) -> None:
        self.transport.write(_HEAD + ANSWER)  # type: ignore[attr-defined]


class _AiohttpParserProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        from aiohttp._http_parser import HttpRequestParser  # type: ignore[import-not-found]
        self.transport = transport
        self.parser = HttpRequestParser(self, asyncio.get_running_loop(), 2**16, auto_decompress=False)

    def data_received(self, data: bytes) -> None:
        messages, _, _ = self.parser.feed_data(data)
        for _message, _payload in messages:
            self.transport.write(_HEAD + ANSWER)  # type: ignore[attr-defined]

    def pause_reading(self) -> None:  # what aiohttp's StreamReader asks of its protocol
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


async def _serve_protocol(factory: type[asyncio.Protocol], port: int) -> None:
    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", port)
    await server.serve_forever()


async def _serve_listener(port: int) -> None:
    from pystub_backend.backend.frontends.access import AccessPolicy
    from pystub_backend.backend.frontends.http.app import HttpApp
    from pystub_backend.backend.frontends.http.listener import HttpListener
    from pystub_backend.backend.frontends.http.messages import HttpRequest, Response
    from pystub_backend.backend.frontends.http.router import post

    async def infer(request: HttpRequest) -> Response:
        request.complete_body() or await request.read()
        return Response(ANSWER, headers={"Inference-Header-Content-Length": "7"})

    app = HttpApp([post("/v2/models/{model}/infer", infer)], max_input_size=1 << 26, policy=AccessPolicy.of(None))
    await HttpListener(app).start_tcp("127.0.0.1", port)
    await asyncio.Event().wait()


class _InstantCore:
    """The `FrontendCore` members the infer route uses, answering each request with its inputs."""

    def target(self, name: str, version: str = "") -> None:
        return None

    async def infer(self, request: object, target: object = None) -> object:
        from pystub_backend.backend.inference import InferResponse, Tensor
        tensors = [Tensor("OUTPUT0", t.datatype, t.shape, t.data) for t in request.inputs]  # type: ignore[attr-defined]
        return InferResponse(request.model_name, "1", request.id, tensors, {})  # type: ignore[attr-defined]


async def _serve_frontend(port: int) -> None:
    """create_http_app over `_InstantCore`, served the way the checkout on sys.path serves it."""
    from pystub_backend.backend.frontends.http.server import create_http_app
    app = create_http_app(_InstantCore())  # type: ignore[arg-type]
    try:
        from pystub_backend.backend.frontends.http.listener import HttpListener
    except ImportError:  # a checkout that served the port with aiohttp
        from aiohttp import web

        from pystub_backend.backend.frontends.http.timeouts import ReadTimeouts, TimedAppRunner
        runner = TimedAppRunner(app, read_timeouts=ReadTimeouts())  # type: ignore[arg-type]
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    else:
        await HttpListener(app).start_tcp("127.0.0.1", port)
    await asyncio.Event().wait()


def _serve(kind: str, port: int) -> None:
    if kind == "aiohttp":
        _serve_aiohttp(port)
    elif kind == "httptools":
        asyncio.run(_serve_protocol(_HttptoolsProtocol, port))
    elif kind == "httptools-task":
        asyncio.run(_serve_protocol(_HttptoolsTaskProtocol, port))
    elif kind == "aiohttp-parser":
        asyncio.run(_serve_protocol(_AiohttpParserProtocol, port))
    elif kind == "listener":
        asyncio.run(_serve_listener(port))
    elif kind == "frontend":
        asyncio.run(_serve_frontend(port))
    else:
        raise SystemExit(f"unknown server {kind!r}")


# -- measuring -------------------------------------------------------------------------------------


def _wrk(port: int, connections: int, seconds: float, script: Path) -> tuple[int, float]:
    """(requests completed, requests/s) of one wrk window; raises RuntimeError if wrk failed."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script),
               f"http://127.0.0.1:{port}{_PATH}"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60).stdout
    done = re.search(r"(\d+) requests in", out)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if done is None or rate is None or errors is not None:
        raise RuntimeError(f"wrk failed against port {port}:\n{out}")
    return int(done.group(1)), float(rate.group(1))


def _measure(pid: int, port: int, args: argparse.Namespace, script: Path) -> tuple[float, float, float]:
    """(server us/req, its descendants' us/req, requests/s) after a one-second warm-up."""
    _wrk(port, args.connections, 1.0, script)
    before = (cpu.process_seconds(pid), sum(cpu.process_seconds(c) for c in cpu.descendants(pid)))
    done, rate = _wrk(port, args.connections, args.seconds, script)
    after = (cpu.process_seconds(pid), sum(cpu.process_seconds(c) for c in cpu.descendants(pid)))
    return (after[0] - before[0]) / done * 1e6, (after[1] - before[1]) / done * 1e6, rate


def _wait_answering(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _START_SECONDS
    request = urllib.request.Request(f"http://127.0.0.1:{port}{_PATH}", data=HEADER + bytes(16),
                                     headers={"Inference-Header-Content-Length": str(len(HEADER))})
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                response.read()
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the server on port {port} did not answer within {_START_SECONDS:.0f} s")


def _round_server(kind: str, root: Path, args: argparse.Namespace, script: Path) -> tuple[float, float, float]:
    (port,) = servers.free_ports(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p))
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", kind, str(port)],
                               env=env, cwd=str(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_answering(port, process)
        return _measure(process.pid, port, args, script)
    finally:
        process.terminate()
        process.wait(30)


def _round_backend(root: Path, args: argparse.Namespace, script: Path) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory(prefix="pystub-http-layer-") as tmp:
        workdir = Path(tmp)
        server = servers.start_pystub(servers.write_repositories(workdir), workdir, client_shm=False, root=root,
                                      extra=["--allow-grpc=false", "--allow-metrics=false"])
        try:
            servers.wait_ready([server])
            return _measure(server.process.pid, server.http_port, args, script)
        finally:
            servers.stop(server)


def _table(title: str, results: dict[str, list[tuple[float, float, float]]], children: bool) -> None:
    medians = {name: [statistics.median(column) for column in zip(*rows, strict=True)]
               for name, rows in results.items()}
    first = next(iter(medians.values()))
    print(f"\n{title}")
    columns = "server us/req  stubs us/req  total us/req" if children else "server us/req"
    print(f"  {'candidate':22} {columns}   requests/s   x first (CPU, rate)")
    for name, (own, below, rate) in medians.items():
        cells = f"{own:13.1f} {below:13.1f} {own + below:13.1f}" if children else f"{own:13.1f}"
        ratio = (own + below) / (first[0] + first[1])
        print(f"  {name:22} {cells}   {rate:10.0f}   {ratio:5.2f}, {rate / first[2]:5.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="*", default=["bare"], help="bare, frontend, backend")
    parser.add_argument("--baseline", type=Path, help="the checkout to compare with (frontend, backend)")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]))
        return 0
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    if {"frontend", "backend"} & set(args.steps) and args.baseline is None:
        raise SystemExit("frontend and backend compare with --baseline DIR (a checkout of the before)")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(_LUA)
    script = Path(lua.name)
    print(f"wrk -t1 -c{args.connections}, {args.seconds:g} s x {args.rounds} rounds, medians; 16 B binary infer")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    try:
        for step in args.steps:
            checkouts = {"before": args.baseline.resolve(), "this": ROOT} if args.baseline else {"this": ROOT}
            if step == "bare":
                candidates = {kind: ROOT for kind in ("aiohttp", "aiohttp-parser", "httptools", "httptools-task",
                                                      "listener")}
            else:
                candidates = dict(checkouts)
            results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in candidates}
            for _ in range(args.rounds):
                for name, root in candidates.items():
                    if step == "backend":
                        results[name].append(_round_backend(root, args, script))
                    else:
                        results[name].append(_round_server(name if step == "bare" else "frontend", root, args,
                                                           script))
            _table(f"{step}:", results, children=step == "backend")
    finally:
        script.unlink()
    print("\nuptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
