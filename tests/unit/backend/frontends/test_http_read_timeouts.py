"""The HTTP listener's read deadlines on a kept-alive connection (TimedAppRunner, real sockets):
requests that follow each other faster than the header deadline share its timer and are all
served, and a slow head or body after them is still closed on its own deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from pystub_backend.backend.frontends.http.timeouts import ReadTimeouts, TimedAppRunner

DEADLINE = 0.6  # the header and body deadlines of the listener under test
SLACK = 3.0  # how late a close may come on a loaded machine
_WAIT = 10.0  # the most any single read of a reply may take


async def _ok(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(text="ok")


@asynccontextmanager
async def _listener() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_route("*", "/ok", _ok)
    runner = TimedAppRunner(app, read_timeouts=ReadTimeouts(DEADLINE, DEADLINE))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _WAIT)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert await asyncio.wait_for(reader.readexactly(2), _WAIT) == b"ok"


async def _closed_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, opening: bytes,
                        piece: bytes) -> float:
    """Seconds from now until the server closes the connection, while the client sends `opening`
    and then `piece` every quarter of the deadline (each gap shorter than the deadline)."""
    async def trickle() -> None:
        writer.write(opening)
        while True:
            await asyncio.sleep(DEADLINE / 4)
            writer.write(piece)

    started = time.monotonic()
    sender = asyncio.ensure_future(trickle())
    try:
        # A piece that reaches the server as it closes is unread data: its kernel then answers
        # with a reset instead of an end of stream. Either is the close.
        try:
            assert await asyncio.wait_for(reader.read(), DEADLINE + SLACK + _WAIT) == b""
        except ConnectionResetError:
            pass
    finally:
        sender.cancel()
    return time.monotonic() - started


def _run(test: Callable[[int], Awaitable[None]]) -> None:
    async def main() -> None:
        async with _listener() as port:
            await test(port)
    asyncio.run(main())


def test_requests_faster_than_the_deadline_are_all_served_on_one_connection() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        ends = time.monotonic() + 4 * DEADLINE  # past the first timer and its re-arms
        served = 0
        while time.monotonic() < ends:
            await _request(reader, writer)
            served += 1
            await asyncio.sleep(DEADLINE / 6)
        assert served >= 8
        writer.close()
    _run(test)


def test_a_slow_head_after_fast_requests_is_closed_on_its_own_deadline() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(5):
            await _request(reader, writer)
            await asyncio.sleep(DEADLINE / 4)  # the timer the first request armed fires in here
        waited = await _closed_after(reader, writer, b"GET /ok HTTP/1.1\r\n", b"X-Slow: 1\r\n")
        assert DEADLINE * 0.9 <= waited <= DEADLINE + SLACK, waited
        writer.close()
    _run(test)


def test_a_slow_body_after_fast_requests_is_closed_on_its_own_deadline() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            await _request(reader, writer)
        waited = await _closed_after(reader, writer, b"POST /ok HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n",
                                     b"0")
        assert DEADLINE * 0.9 <= waited <= DEADLINE + SLACK, waited
        writer.close()
    _run(test)
