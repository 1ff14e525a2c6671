"""The frontends give a closed connection's freed memory back: one trim per burst of closes of
connections that carried much, none for small ones; on real sockets, with grpcio's client for the
h2 stack and aiohttp's for the HTTP listeners (aiohttp's TimedAppRunner and the inference port's
HttpListener)."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable, Iterator

import aiohttp
import grpc
import pytest
from aiohttp import web
from h2_server import RunningH2Server
from test_grpc_h2_calls import _SERVICE, _handlers, _Probe

from pystub_backend.backend.frontends.access import AccessPolicy
from pystub_backend.backend.frontends.heap_trim import TRIM_AFTER_BYTES, HeapTrimmer
from pystub_backend.backend.frontends.http.app import HttpApp
from pystub_backend.backend.frontends.http.listener import HttpListener
from pystub_backend.backend.frontends.http.messages import HttpRequest, Response
from pystub_backend.backend.frontends.http.router import post
from pystub_backend.backend.frontends.http.timeouts import ReadTimeouts, TimedAppRunner

_WAIT = 10.0


def test_closes_in_one_burst_ask_for_one_trim() -> None:
    trims: list[float] = []

    async def burst() -> None:
        trimmer = HeapTrimmer(lambda: trims.append(time.monotonic()))
        for _ in range(5):
            trimmer.released()
        deadline = time.monotonic() + _WAIT
        while not trims and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        trimmer.released()  # within the interval: waits for it, then one more
        while len(trims) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        trimmer.cancel()

    asyncio.run(burst())
    assert len(trims) == 2, trims
    assert trims[1] - trims[0] >= 0.9, "a second trim came sooner than the interval"


@pytest.fixture
def server() -> Iterator[RunningH2Server]:
    running = RunningH2Server({"grpc.max_receive_message_length": -1}, {_SERVICE: _handlers(_Probe())})
    try:
        yield running
    finally:
        running.close()


def _trims_after(server: RunningH2Server, payload: bytes) -> int:
    """Trims counted after one connection echoes `payload` and closes (waits for the one it causes)."""
    options = [("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:
        assert channel.unary_unary(f"/{_SERVICE}/Echo")(payload, timeout=_WAIT) == payload
    heap = server.server._state.heap
    deadline = time.monotonic() + 3.0  # settle (0.1 s) and the loop's turn; a small connection never trims
    while time.monotonic() < deadline and heap.trims == 0:
        time.sleep(0.05)
    return heap.trims


def test_a_connection_that_carried_much_trims_when_it_closes(server: RunningH2Server) -> None:
    assert _trims_after(server, bytes(TRIM_AFTER_BYTES)) == 1


def test_a_small_connection_does_not_trim(server: RunningH2Server) -> None:
    assert _trims_after(server, b"small") == 0


async def _http_trims_after(body: bytes, listener: str) -> int:
    """Trims counted after one HTTP connection posts `body` and closes, on aiohttp's listener (the
    metrics and OpenAI ports) or on the inference port's."""
    async def echo_size(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    async def echo_size_here(request: HttpRequest) -> Response:
        return Response(str(len(await request.read())).encode())

    stop: Callable[[], Awaitable[None]]
    if listener == "aiohttp":
        app = web.Application(client_max_size=2 * TRIM_AFTER_BYTES)
        app.router.add_post("/", echo_size)
        runner = TimedAppRunner(app, read_timeouts=ReadTimeouts())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port, heap, stop = runner.addresses[0][1], runner.heap, runner.cleanup
    else:
        inference = HttpListener(HttpApp([post("/", echo_size_here)], max_input_size=2 * TRIM_AFTER_BYTES,
                                         policy=AccessPolicy.of(None)))
        port, heap, stop = await inference.start_tcp("127.0.0.1", 0), inference.heap, inference.stop
    try:
        timeout = aiohttp.ClientTimeout(total=_WAIT)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(f"http://127.0.0.1:{port}/",
                                                                                   data=io.BytesIO(body)) as reply:
            assert await reply.text() == str(len(body))
        deadline = time.monotonic() + 3.0  # the close, the settle (0.1 s); a small connection never trims
        while time.monotonic() < deadline and heap.trims == 0:
            await asyncio.sleep(0.05)
        return heap.trims
    finally:
        await stop()


@pytest.mark.parametrize("listener", ["aiohttp", "inference"])
def test_an_http_connection_that_carried_much_trims_when_it_closes(listener: str) -> None:
    assert asyncio.run(_http_trims_after(bytes(TRIM_AFTER_BYTES), listener)) == 1


@pytest.mark.parametrize("listener", ["aiohttp", "inference"])
def test_a_small_http_connection_does_not_trim(listener: str) -> None:
    assert asyncio.run(_http_trims_after(b"small", listener)) == 0
