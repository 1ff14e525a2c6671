"""The inference port's HTTP/1.1 connection (frontends/http/connection.py) on real loopback sockets,
with raw bytes on the client side: pipelining and its order, heads and bodies split across reads,
chunked bodies, Expect: 100-continue, keep-alive and closing in HTTP/1.0 and 1.1, limits on heads,
a client that leaves mid-body or mid-request, flow control, streamed responses, and stopping.

Every wait has a deadline that names what it waited for; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from pystub_backend.backend.client_link import cancel_when_gone
from pystub_backend.backend.frontends.access import AccessPolicy
from pystub_backend.backend.frontends.http.app import HttpApp
from pystub_backend.backend.frontends.http.connection import MAX_INCOMPLETE_FIELD, MAX_QUEUED, ReadTimeouts
from pystub_backend.backend.frontends.http.listener import HttpListener
from pystub_backend.backend.frontends.http.messages import HttpRequest, Response, StreamResponse
from pystub_backend.backend.frontends.http.request_link import http_request_link
from pystub_backend.backend.frontends.http.router import get, post

WAIT = 30.0  # the most any one step may take, however loaded the machine


@dataclass
class Probe:
    """What the handlers of the test app saw, and the events a test drives them with."""

    release_slow: asyncio.Event = field(default_factory=asyncio.Event)
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    read_failed: asyncio.Event = field(default_factory=asyncio.Event)
    bodies: list[bytes] = field(default_factory=list)
    whole_at_start: list[bool] = field(default_factory=list)  # /echo: its body had all arrived when it started


def _app(probe: Probe) -> HttpApp:
    async def echo(request: HttpRequest) -> Response:
        probe.whole_at_start.append(request.complete_body() is not None)
        try:
            body = await request.read()
        except ConnectionResetError:
            probe.read_failed.set()
            raise
        probe.bodies.append(body)
        return Response(body, content_type="application/octet-stream")

    async def slow(request: HttpRequest) -> Response:
        await asyncio.wait_for(probe.release_slow.wait(), WAIT)
        return Response(b"slow")

    async def fast(request: HttpRequest) -> Response:
        return Response(b"fast")

    async def hold(request: HttpRequest) -> Response:
        with http_request_link(request) as link:
            cancel_when_gone(link)
            probe.holding.set()
            try:
                await asyncio.sleep(WAIT * 4)
            except asyncio.CancelledError:
                probe.cancelled.set()
                raise
        return Response(b"held")

    async def stream(request: HttpRequest) -> StreamResponse:
        reply = StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        for number in range(3):
            await reply.write(b"data: %d\n\n" % number)
        await reply.write_eof()
        return reply

    routes = [post("/echo", echo), post("/slow", slow), get("/fast", fast), post("/hold", hold),
              get("/stream", stream)]
    return HttpApp(routes, max_input_size=1 << 20, policy=AccessPolicy.of(None))


@asynccontextmanager
async def _server(probe: Probe, timeouts: ReadTimeouts | None = None) -> AsyncIterator[HttpListener]:
    listener = HttpListener(_app(probe), timeouts)
    await listener.start_tcp("127.0.0.1", 0)
    try:
        yield listener
    finally:
        await listener.stop(grace=WAIT)


def _run(test: Callable[[HttpListener, Probe], Awaitable[None]], timeouts: ReadTimeouts | None = None) -> None:
    async def main() -> None:
        probe = Probe()
        async with _server(probe, timeouts) as listener:
            await test(listener, probe)
    asyncio.run(main())


async def _connect(listener: HttpListener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = listener.sockets[0].getsockname()[1]
    return await asyncio.open_connection("127.0.0.1", port)


async def _response(reader: asyncio.StreamReader, what: str = "a response") -> tuple[bytes, dict[str, str], bytes]:
    """(status line, headers by lowercase name, body) of one response read off the connection."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    status, *lines = head[:-4].decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int(await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT), 16):
            body += await asyncio.wait_for(reader.readexactly(size + 2), WAIT)
            body = body[:-2]
        await asyncio.wait_for(reader.readexactly(2), WAIT)
    else:
        body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), WAIT)
    return status.encode(), headers, body


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (everything it sent before is read first)."""
    return await asyncio.wait_for(reader.read(), WAIT) == b""


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)


# -- pipelining and split reads --------------------------------------------------------------------


def test_pipelined_requests_are_answered_in_order_even_when_the_first_is_slowest() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(_post("/slow", b"") + b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n" + _post("/echo", b"third"))
        await writer.drain()
        probe.release_slow.set()
        bodies = [(await _response(reader))[2] for _ in range(3)]
        assert bodies == [b"slow", b"fast", b"third"]
        writer.close()
    _run(test)


def test_a_head_sent_byte_by_byte_and_a_body_split_across_reads() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        request = _post("/echo", b"0123456789" * 100)
        head_end = request.index(b"\r\n\r\n") + 4
        for byte in request[:head_end]:  # each byte its own segment (drain + a yield between)
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0)
        writer.write(request[head_end:head_end + 333])
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(request[head_end + 333:])
        status, _, body = await _response(reader)
        assert status == b"HTTP/1.1 200 OK" and body == b"0123456789" * 100
        writer.close()
    _run(test)


def test_a_chunked_body_across_reads_is_joined() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b"lo\r\n6\r\n world\r\n0\r\n\r\n")
        status, _, body = await _response(reader)
        assert status == b"HTTP/1.1 200 OK" and body == b"hello world"
        writer.close()
    _run(test)


def test_a_flood_of_pipelined_requests_beyond_the_queue_is_all_served_in_order() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        count = MAX_QUEUED * 3  # reading pauses at MAX_QUEUED waiting requests and resumes
        writer.write(b"".join(_post("/echo", b"%d" % number) for number in range(count)))
        bodies = [(await _response(reader))[2] for _ in range(count)]
        assert bodies == [b"%d" % number for number in range(count)]
        writer.close()
    _run(test)


def test_the_rest_of_a_refused_body_is_read_and_dropped_and_the_next_request_served() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        body = b"x" * (3 << 20)  # past the app's 1 MiB: read() refuses it before its end
        writer.write(_post("/echo", body) + b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, answer = await _response(reader)
        assert status == b"HTTP/1.1 400 Bad Request" and b"maximum input size" in answer
        assert (await _response(reader))[2] == b"fast"
        assert probe.bodies == []
        writer.close()
    _run(test)


# -- Expect, keep-alive, closing -------------------------------------------------------------------


def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"body")
        status, _, body = await _response(reader)
        assert status == b"HTTP/1.1 200 OK" and body == b"body"
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: something\r\nContent-Length: 0\r\n\r\n")
        status, _, body = await _response(reader)
        assert status == b"HTTP/1.1 417 Expectation Failed" and body == b"Unknown Expect: something"
        writer.close()
    _run(test)


def test_keep_alive_and_close_in_http_1_0_and_1_1() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        for _ in range(3):  # HTTP/1.1 keeps the connection
            writer.write(b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, _ = await _response(reader)
            assert status == b"HTTP/1.1 200 OK" and "connection" not in headers
        writer.write(b"GET /fast HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        status, headers, _ = await _response(reader)
        assert headers["connection"] == "close" and await _closed(reader)
        writer.close()

        reader, writer = await _connect(listener)
        writer.write(b"GET /fast HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, _ = await _response(reader)
        assert status == b"HTTP/1.0 200 OK" and headers["connection"] == "keep-alive"
        writer.write(b"GET /fast HTTP/1.0\r\n\r\n")
        status, headers, _ = await _response(reader)
        assert status == b"HTTP/1.0 200 OK" and "connection" not in headers and await _closed(reader)
        writer.close()
    _run(test)


def test_head_answers_the_headers_without_the_body() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(b"HEAD /fast HTTP/1.1\r\nHost: t\r\n\r\nGET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 4\r\n" in head
        assert (await _response(reader))[2] == b"fast"  # the next response follows at once: no body between
        writer.close()
    _run(test)


def test_an_upgrade_request_is_answered_as_http_1_1_and_the_connection_goes_on() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                     b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 3\r\n\r\nabc"
                     b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await _response(reader))[2] == b"abc"  # the upgrade's body is the request's
        assert (await _response(reader))[2] == b"fast"
        writer.close()
    _run(test)


# -- heads that are refused ------------------------------------------------------------------------


@pytest.mark.parametrize("head, reason", [
    (b"GET /" + b"a" * 8191 + b" HTTP/1.1\r\nHost: t\r\n\r\n", b"Got more than 8190 bytes"),  # aiohttp's limits
    (b"GET /fast HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 8190 + b"\r\n\r\n", b"Got more than 8190 bytes"),
    (b"GET /fast HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(128)) + b"\r\n",
     b"Too many headers received"),
    (b"GET /fast HTTP/1.1\r\n\r\n", b"Missing 'Host' header"),
    (b"GET /fast HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n", b"Duplicate 'Host' header"),
    (b"GET /fast HTTP/1.1\r\nHost: t\rX: 1\r\n\r\n", b"Missing expected LF"),
    (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", b"Received HTTPS traffic on an HTTP port"),
], ids=["long target", "long header", "129 headers", "no Host", "two Hosts", "bare CR", "TLS"])
def test_a_refused_head_is_answered_400_with_the_reason_and_closed(head: bytes, reason: bytes) -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        first = not head.startswith(b"GET")  # TLS is told by the connection's first bytes
        writer.write(head if first else b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n" + head)
        if not first:  # the request before it is answered first
            assert (await _response(reader))[2] == b"fast"
        status, headers, body = await _response(reader)
        assert status == b"HTTP/1.0 400 Bad Request" and headers["content-type"].startswith("text/plain")
        assert reason in body, body
        assert await _closed(reader)
        writer.close()
    _run(test)


def test_within_the_limits_128_headers_of_8190_bytes_are_served() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        value = b"v" * (8190 - len(b"X-100"))
        headers = b"Host: t\r\n" + b"".join(b"X-%d: %s\r\n" % (i, value) for i in range(100, 227))
        writer.write(b"GET /fast HTTP/1.1\r\n" + headers + b"\r\n")
        assert (await _response(reader))[2] == b"fast"
        writer.close()
    _run(test)


@pytest.mark.parametrize("line, most, reason", [
    (b"X-Filler: " + b"f" * 8000 + b"\r\n", 129 * 8012, b"Too many headers received"),
    (b"f" * 8000, MAX_INCOMPLETE_FIELD, b"a header line that does not end"),
], ids=["header lines without end", "one line without end"])
def test_a_head_that_does_not_end_is_refused_before_its_end(line: bytes, most: int, reason: bytes) -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(b"GET /fast HTTP/1.1\r\nHost: t\r\nX-Open: ")
        sent = 0
        try:
            while sent <= most:  # the server answers once it has seen this much
                writer.write(line)
                sent += len(line)
                await writer.drain()
        except ConnectionError:
            pass  # the server answered and closed while we were still sending
        status, _, body = await _response(reader)
        assert status == b"HTTP/1.0 400 Bad Request" and reason in body, body
        writer.close()
    _run(test)


# -- clients that leave ----------------------------------------------------------------------------


def test_a_client_closing_mid_body_fails_the_read_and_leaves_nothing_behind() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        # a body larger than a small one (whose handler starts only once it is in): the handler waits
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\nonly part")
        await writer.drain()
        for _ in range(100):  # until the connection has the head (and the handler waits for the rest)
            if listener.connections and any(c._active is not None for c in listener.connections):
                break
            await asyncio.sleep(0.01)
        writer.close()
        await asyncio.wait_for(probe.read_failed.wait(), WAIT)
        for _ in range(int(WAIT * 100)):
            if not listener.connections:
                break
            await asyncio.sleep(0.01)
        assert not listener.connections and probe.bodies == []
    _run(test)


def test_a_small_body_that_comes_after_its_head_is_handed_over_whole() -> None:
    """The handler of a small body starts once the body is in (no read waits for it); a large one's
    starts at its head, as every body's did (test_a_client_closing_mid_body...)."""
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12345")
        await writer.drain()
        await asyncio.sleep(0.05)  # the head and half the body are in: no handler yet
        assert probe.whole_at_start == []
        writer.write(b"67890")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert head.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.readexactly(10), WAIT) == b"1234567890"
        assert probe.whole_at_start == [True] and probe.bodies == [b"1234567890"]
        writer.close()
    _run(test)


def test_a_client_leaving_mid_request_cancels_a_linked_handler() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(_post("/hold", b""))
        await asyncio.wait_for(probe.holding.wait(), WAIT)
        writer.close()
        await asyncio.wait_for(probe.cancelled.wait(), WAIT)
    _run(test)


# -- responses written as they come, and stopping --------------------------------------------------


def test_a_stream_response_is_chunked_in_1_1_and_ends_with_the_connection_in_1_0() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        reader, writer = await _connect(listener)
        writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\nGET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
        status, headers, body = await _response(reader)
        assert headers["transfer-encoding"] == "chunked" and body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert (await _response(reader))[2] == b"fast"
        writer.close()
        reader, writer = await _connect(listener)
        writer.write(b"GET /stream HTTP/1.0\r\n\r\n")
        everything = await asyncio.wait_for(reader.read(), WAIT)
        head, _, body = everything.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 OK\r\n") and b"Transfer-Encoding" not in head, head
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        writer.close()
    _run(test)


def test_stopping_closes_idle_connections_and_lets_a_request_in_progress_finish() -> None:
    async def main() -> None:
        probe = Probe()
        listener = HttpListener(_app(probe))
        await listener.start_tcp("127.0.0.1", 0)
        idle_reader, idle_writer = await _connect(listener)
        busy_reader, busy_writer = await _connect(listener)
        busy_writer.write(_post("/slow", b""))
        await busy_writer.drain()
        for _ in range(int(WAIT * 100)):  # both connections accepted, the slow request started
            if len(listener.connections) == 2 and any(c._active is not None for c in listener.connections):
                break
            await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(listener.stop(grace=WAIT))
        assert await _closed(idle_reader)
        assert not stopping.done()
        probe.release_slow.set()
        status, _, body = await _response(busy_reader)
        assert body == b"slow" and await _closed(busy_reader)
        await asyncio.wait_for(stopping, WAIT)
        idle_writer.close()
        busy_writer.close()
    asyncio.run(main())


def test_an_idle_new_connection_and_a_slow_body_are_closed_by_their_deadlines() -> None:
    async def test(listener: HttpListener, probe: Probe) -> None:
        idle_reader, idle_writer = await _connect(listener)
        body_reader, body_writer = await _connect(listener)
        body_writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n12")  # not a small one
        assert await _closed(idle_reader) and await _closed(body_reader)  # no response: just closed
        await asyncio.wait_for(probe.read_failed.wait(), WAIT)
        idle_writer.close()
        body_writer.close()
    _run(test, ReadTimeouts(0.3, 0.3))
