"""The h2 gRPC stack against clients that misbehave, seen through a raw HTTP/2 client on real
sockets: every limit ends the call (or the connection) it should and nothing else, with the status
grpc gives, and a misbehaving connection costs one log line at most. Counts, not durations: each
wait has a generous deadline that names what it waits for."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import ngh2
import pytest
from h2_server import (
    DATA,
    END_HEADERS,
    HEADERS,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    RawH2Client,
    RunningH2Server,
    frame,
    grpc_request_block,
    hpack_indexed,
    hpack_literal,
)

from pystub_backend.backend.frontends.grpc import offload
from pystub_backend.backend.frontends.grpc.h2.wire import header_list_size

_SERVICE = "test.Echo"
_WAIT = 10.0


def _handlers() -> dict[str, grpc.RpcMethodHandler]:
    async def echo(request: bytes, context: Any) -> bytes:
        return request

    async def chat(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    async def sizes(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield len(request).to_bytes(8, "big")

    return {"Echo": grpc.unary_unary_rpc_method_handler(echo), "Chat": grpc.stream_stream_rpc_method_handler(chat),
            "Sizes": grpc.stream_stream_rpc_method_handler(sizes)}


def _serve(started: list[RunningH2Server], **options: int) -> RunningH2Server:
    running = RunningH2Server(dict(options), {_SERVICE: _handlers()})
    started.append(running)
    return running


def _message(payload: bytes, compressed: bool = False) -> bytes:
    return (b"\x01" if compressed else b"\x00") + len(payload).to_bytes(4, "big") + payload


class _Calls:
    """Calls on one raw client connection, and how each ended (grpc-status and message, or RST)."""

    def __init__(self, port: int, wide_windows: bool = False) -> None:
        """`wide_windows`: the client lets the server send 16 MiB a stream before it reads (as grpc
        clients grow their windows), so what it does not read fills the sockets' buffers."""
        self.client = RawH2Client(port, settings={ngh2.Setting.INITIAL_WINDOW_SIZE: 16 << 20} if wide_windows else None)
        if wide_windows:
            self.client.h2.set_local_window_size(256 << 20)
            self.client.flush()
        self.ends: dict[int, tuple[str, str]] = {}
        self.data: dict[int, bytes] = {}
        self.goaway: ngh2.GoAwayReceived | None = None
        self.closed = False

    def open(self, method: str = "Echo", extra: list[tuple[bytes, bytes]] | None = None,
             content_type: bytes = b"application/grpc") -> int:
        stream = self.client.h2.send_request(
            [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"test"),
             (b":path", f"/{_SERVICE}/{method}".encode()), (b"content-type", content_type),
             (b"te", b"trailers"), *(extra or [])], end_stream=False)
        self.client.flush()
        return stream

    def send(self, stream: int, data: bytes, end: bool = True) -> None:
        self.client.h2.send_data(stream, data, end_stream=end)
        self.client.flush()

    def call(self, payload: bytes, **kwargs: Any) -> int:
        stream = self.open(**kwargs)
        self.send(stream, _message(payload))
        return stream

    def wait(self, *streams: int, what: str = "the calls' ends") -> None:
        deadline = time.monotonic() + _WAIT
        self.client.sock.settimeout(0.2)
        while not all(stream in self.ends for stream in streams) and not self.closed:
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            try:
                data = self.client.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            self.client.h2.receive_data(data)
            for event in self.client.h2.events():
                self._note(event)
            self.client.flush()

    def _note(self, event: ngh2.Event) -> None:
        if isinstance(event, (ngh2.ResponseReceived, ngh2.TrailersReceived)):
            fields = dict(event.headers)
            if b"grpc-status" in fields:
                self.ends[event.stream_id] = (fields[b"grpc-status"].decode(),
                                              fields.get(b"grpc-message", b"").decode())
        elif isinstance(event, ngh2.DataReceived):
            self.data[event.stream_id] = self.data.get(event.stream_id, b"") + event.data
        elif isinstance(event, ngh2.StreamReset):
            self.ends.setdefault(event.stream_id, ("RST", str(event.error_code)))
        elif isinstance(event, ngh2.GoAwayReceived):
            self.goaway = event

    def take_windows(self) -> None:
        """Read until the server's connection window has arrived (it is larger than HTTP/2's 64 KiB)."""
        deadline = time.monotonic() + _WAIT
        while True:
            assert time.monotonic() < deadline, "timed out waiting for the server's WINDOW_UPDATE"
            self.client.h2.receive_data(self.client.sock.recv(1 << 16))
            if any(isinstance(event, ngh2.WindowUpdated) and event.stream_id == 0 for event in self.client.h2.events()):
                return

    def ping_until_acknowledged(self) -> None:
        """One ping, and read until its ack (or the server's GOAWAY, or its close)."""
        self.client.h2.ping()
        self.client.flush()
        deadline = time.monotonic() + _WAIT
        while self.goaway is None and not self.closed:
            assert time.monotonic() < deadline, "timed out waiting for a ping's ack"
            data = self.client.sock.recv(1 << 16)
            if not data:
                self.closed = True
                return
            self.client.h2.receive_data(data)
            events = self.client.h2.events()
            for event in events:
                self._note(event)
            if any(isinstance(event, ngh2.PingAcknowledged) for event in events):
                return

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def calls(started: list[RunningH2Server]) -> Iterator[_Calls]:
    opened = _Calls(_serve(started, **{"pystub.request_read_timeout_ms": 300}).port)
    try:
        yield opened
    finally:
        opened.close()


_OK = ("0", "")


def test_a_header_list_over_the_limit_fails_that_call_alone(calls: _Calls) -> None:
    """16 KiB by default, counted as HTTP/2 and grpc count it; the connection's other calls go on."""
    big = calls.call(b"x", extra=[(b"x-big", b"v" * 20_000)])
    many = calls.call(b"x", extra=[(b"x-%d" % i, b"v") for i in range(1100)])  # ngh2's own limit was 1,024
    fine = calls.call(b"fine")
    calls.wait(big, many, fine)
    size = header_list_size([(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"test"),
                             (b":path", b"/test.Echo/Echo"), (b"content-type", b"application/grpc"),
                             (b"te", b"trailers"), (b"x-big", b"v" * 20_000)])
    assert calls.ends[big] == ("8", f"received metadata size exceeds hard limit ({size} vs. 16384)")
    assert calls.ends[many][0] == "8" and calls.ends[fine] == _OK and calls.data[fine][5:] == b"fine"


def test_a_header_list_of_hpack_references_is_counted_as_decoded(started: list[RunningH2Server]) -> None:
    """One 4 KiB HPACK entry referenced 15 times: 70 bytes on the wire, 60 KiB of header list."""
    running = _serve(started)
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=_WAIT)
    try:
        block = grpc_request_block(f"/{_SERVICE}/Echo".encode()) + hpack_literal(b"x-pad", b"v" * 4000, indexed=True)
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, block + hpack_indexed(62) * 14)
                     + frame(HEADERS, END_HEADERS, 3, grpc_request_block(f"/{_SERVICE}/Echo".encode())
                             + hpack_indexed(62) * 15))
        ended = _ended_streams(sock, {1, 3})
    finally:
        sock.close()
    assert ended == {1, 3}  # both refused at once (trailers-only HEADERS with END_STREAM), not held open


def _ended_streams(sock: socket.socket, wanted: set[int]) -> set[int]:
    """The streams the server ends with a HEADERS frame carrying END_STREAM, until `wanted` are."""
    ended: set[int] = set()
    buffer, deadline = b"", time.monotonic() + _WAIT
    while not wanted <= ended:
        assert time.monotonic() < deadline, f"timed out waiting for the server to end streams {wanted - ended}"
        data = sock.recv(1 << 16)
        assert data, "the server closed the connection"
        buffer += data
        while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
            length, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
            if kind == HEADERS and flags & 1:
                ended.add(int.from_bytes(buffer[5:9], "big"))
            buffer = buffer[9 + length:]
    return ended


@pytest.mark.parametrize("value", [b"-1S", b"1.5S", b"abc"])
def test_a_malformed_grpc_timeout_is_refused_as_grpc_aio_does(calls: _Calls, value: bytes) -> None:
    stream = calls.call(b"x", extra=[(b"grpc-timeout", value)])
    calls.wait(stream)
    assert calls.ends[stream] == ("13", "Error parsing 'grpc-timeout' metadata")


@pytest.mark.parametrize("content_type", [b"application/grpcfoo", b"application/grpc-web", b"text/plain"])
def test_the_content_type_is_checked_exactly(calls: _Calls, content_type: bytes) -> None:
    stream = calls.call(b"x", content_type=content_type)
    plus = calls.call(b"x", content_type=b"application/grpc+proto")
    calls.wait(stream, plus)
    assert calls.ends[stream] == ("13", "Content-Type is not application/grpc") and calls.ends[plus] == _OK


def test_a_unary_call_with_two_messages_is_refused(calls: _Calls) -> None:
    together = calls.open()
    calls.send(together, _message(b"one") + _message(b"two"))
    later = calls.open()  # the second message after the handler has taken the first
    calls.send(later, _message(b"one"), end=False)
    calls.send(later, _message(b"two"))
    calls.wait(together, later)
    assert calls.ends[together] == ("13", "Too many requests")
    assert calls.ends[later] in (("13", "Too many requests"), _OK)  # the handler may have answered already
    none = calls.open()
    calls.send(none, b"")
    calls.wait(none)
    assert calls.ends[none] == ("13", "a unary call without its request message")


def test_a_call_that_never_sends_its_message_ends_at_the_read_timeout(calls: _Calls) -> None:
    silent = calls.open()
    half = calls.open()
    calls.send(half, _message(b"x" * 100)[:50], end=False)  # a message begun, never finished
    stream = calls.open("Chat")  # a stream's handler waits for its client's next request unbounded
    calls.wait(silent, half, what="the read timeout to end the silent calls")
    assert calls.ends[silent] == calls.ends[half] == ("4", "the request message did not arrive within 0.3 s")
    calls.send(stream, _message(b"late"))
    calls.wait(stream, what="the stream's answer")
    assert calls.ends[stream] == _OK and calls.data[stream][5:] == b"late"


def test_the_connection_memory_limit_fails_the_call_over_it(started: list[RunningH2Server]) -> None:
    calls = _Calls(_serve(started, **{"pystub.max_connection_memory": 1 << 20}).port)
    try:
        calls.take_windows()
        big = calls.call(bytes(2 << 20))
        calls.wait(big)
        fine = calls.call(b"fine")
        calls.wait(fine)
    finally:
        calls.close()
    assert calls.ends[big] == ("8", f"the connection holds more than its limit of {1 << 20} bytes of requests")
    assert calls.ends[fine] == _OK


def test_a_gzip_bomb_stops_at_the_receive_limit(started: list[RunningH2Server]) -> None:
    calls = _Calls(_serve(started, **{"grpc.max_receive_message_length": 8 << 20}).port)
    try:
        bomb = gzip.compress(bytes(256 << 20), 9)  # 250 KiB that would be 256 MiB
        stream = calls.open(extra=[(b"grpc-encoding", b"gzip")])
        calls.send(stream, _message(bomb, compressed=True))
        calls.wait(stream)
    finally:
        calls.close()
    assert calls.ends[stream] == ("8", f"Received message larger than max ({9 << 20} vs. {8 << 20})")


def test_other_calls_are_answered_while_a_message_inflates(started: list[RunningH2Server]) -> None:
    """Inflating past the first MiB happens on the parsing threads: with both held busy, a bomb
    waits there while the loop answers another call; freed, the bomb is refused."""
    running = _serve(started, **{"grpc.max_receive_message_length": 8 << 20})
    release = threading.Event()

    async def occupy() -> list[asyncio.Future[bool]]:
        return [asyncio.ensure_future(offload.off_loop(release.wait, _WAIT)) for _ in range(2)]

    busy = running.run(occupy())
    calls = _Calls(running.port)
    try:
        bomb = calls.open(extra=[(b"grpc-encoding", b"gzip")])
        calls.send(bomb, _message(gzip.compress(bytes(64 << 20), 9), compressed=True))
        echo = calls.call(b"meanwhile")
        calls.wait(echo, what="the echo while the bomb waits for a parsing thread")
        assert bomb not in calls.ends
    finally:
        release.set()
    calls.wait(bomb)
    calls.close()
    assert calls.ends[echo] == _OK and calls.ends[bomb][0] == "8"
    assert len(busy) == 2


def _until_closed(sock: socket.socket, what: str) -> bytes:
    """Everything the server sends until it closes the connection."""
    received, deadline = b"", time.monotonic() + _WAIT
    sock.settimeout(0.5)
    while True:
        assert time.monotonic() < deadline, f"timed out waiting for the server to close the connection ({what})"
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received
        if not data:
            return received
        received += data


def _goaway_code(received: bytes) -> int | None:
    """The error code of the GOAWAY among the frames `received`, if any."""
    while len(received) >= 9:
        length, kind = int.from_bytes(received[:3], "big"), received[3]
        if kind == 0x7 and len(received) >= 9 + length:
            return int.from_bytes(received[13:17], "big")
        received = received[9 + length:]
    return None


_BLOCK = grpc_request_block(f"/{_SERVICE}/Echo".encode())
_FLOODS = {
    "WINDOW_UPDATE +1": lambda i: frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")),
    "HEADERS+RST_STREAM (Rapid Reset)": lambda i: (frame(HEADERS, END_HEADERS, 2 * i + 3, _BLOCK)
                                                   + frame(RST_STREAM, 0, 2 * i + 3, (8).to_bytes(4, "big"))),
    "DATA on a closed stream": lambda i: frame(DATA, 0, 1, b"x"),
}


@pytest.mark.parametrize("flood", _FLOODS.values(), ids=_FLOODS.keys())
def test_a_flood_of_frames_that_carry_nothing_gets_goaway(started: list[RunningH2Server], flood: Any,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """6,000 such frames: more than the 2,000 a client may send at once (before: all answered,
    WINDOW_UPDATEs acknowledged for each DATA frame)."""
    running = _serve(started)
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=_WAIT)
    try:
        # stream 1: a call the server answers while the client keeps its side open (DATA may follow)
        opening = PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, _BLOCK) + frame(DATA, 0, 1, bytes(5))
        sock.sendall(opening)
        time.sleep(0.2)  # the answer goes first (the flood is judged however it interleaves)
        sock.sendall(b"".join(flood(i) for i in range(6000)))
        received = _until_closed(sock, "a flood")
    except (BrokenPipeError, ConnectionResetError):
        received = b""
    finally:
        sock.close()
    assert _goaway_code(received) == ngh2.ErrorCode.ENHANCE_YOUR_CALM
    lines = [record for record in caplog.records if record.name == "pystub.grpc"]
    assert len(lines) == 1 and not lines[0].exc_info, [record.getMessage() for record in lines]


def test_protocol_errors_cost_one_line_each_and_no_traceback(started: list[RunningH2Server],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """20 connections that open with a bad client magic: five lines (the rest summarised when the
    server stops), none with a traceback; before, each wrote a traceback of 22 lines."""
    running = _serve(started)
    caplog.set_level(logging.WARNING)
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", running.port), timeout=_WAIT)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        _until_closed(sock, "a bad client magic")
        sock.close()
    running.close()
    started.clear()
    lines = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert not any(record.exc_info for record in lines)
    texts = [record.getMessage() for record in lines]
    assert len(texts) == 6 and "closed: it broke the HTTP/2 protocol" in texts[0], texts
    assert texts[-1].startswith("gRPC: 15 more in the last 10 s"), texts


def test_paced_pings_strike_out(started: list[RunningH2Server]) -> None:
    """A ping sent as each ack arrives, with a call open: the ack is no data, so the strikes add up
    (grpc core: GOAWAY too_many_pings after max_ping_strikes); before, each ack forgave them."""
    calls = _Calls(_serve(started, **{"grpc.http2.max_ping_strikes": 2}).port)
    try:
        calls.open("Chat")  # open, no message: a call is in progress
        for _ in range(6):
            calls.ping_until_acknowledged()
            if calls.goaway is not None or calls.closed:
                break
    finally:
        calls.close()
    assert calls.goaway is not None and calls.goaway.debug_data == b"too_many_pings"


def test_the_idle_limit_drops_a_connection_whose_client_stopped_reading(started: list[RunningH2Server]) -> None:
    """Answers that fill the sockets' buffers, never read: once the calls are done the idle limit
    closes the connection, and as it never drains it is dropped with what it held."""
    running = _serve(started, **{"grpc.max_connection_idle_ms": 300})
    calls = _Calls(running.port, wide_windows=True)
    calls.take_windows()
    for _ in range(12):
        calls.call(bytes(1 << 20))

    async def dropped() -> None:
        deadline = time.monotonic() + _WAIT - 1
        while running.server._state.connections:
            assert time.monotonic() < deadline, "timed out waiting for the unread connection to be dropped"
            await asyncio.sleep(0.05)

    try:
        running.run(dropped())
    finally:
        calls.close()


def test_a_stream_of_compressed_messages_gives_back_what_it_took(started: list[RunningH2Server]) -> None:
    """Each message of a stream leaves the budget when its handler takes it, inflated size and
    all: 40 compressed messages of 1 MiB on a connection allowed 4 MiB are all answered."""
    calls = _Calls(_serve(started, **{"pystub.max_connection_memory": 4 << 20}).port)
    try:
        calls.take_windows()
        stream = calls.open("Sizes", extra=[(b"grpc-encoding", b"gzip")])
        packed = _message(gzip.compress(bytes(1 << 20)), compressed=True)
        for _ in range(40):
            calls.send(stream, packed, end=False)
        calls.send(stream, b"")
        calls.wait(stream, what="the stream's 40 answers")
    finally:
        calls.close()
    answer = _message((1 << 20).to_bytes(8, "big"))
    assert calls.ends[stream] == _OK and calls.data[stream] == answer * 40


def test_a_busy_grpc_client_is_no_flood(started: list[RunningH2Server]) -> None:
    """grpcio's client sends a small WINDOW_UPDATE for what it reads, and more of them than the
    flood judge lets through at once: they are explained by the messages sent, and 4,000 calls on
    one connection from 8 threads all succeed (counted by size alone, they drew GOAWAY)."""
    running = _serve(started)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        echo = channel.unary_unary(f"/{_SERVICE}/Echo")
        failures: list[BaseException] = []

        def run() -> None:
            try:
                for _ in range(500):
                    echo(b"x" * 16, timeout=_WAIT)
            except grpc.RpcError as error:
                failures.append(error)

        threads = [threading.Thread(target=run) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(6 * _WAIT)
    assert not failures, failures[0]
