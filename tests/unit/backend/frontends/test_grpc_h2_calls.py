"""The h2 gRPC stack's call semantics against grpcio's own client, on real sockets: deadlines,
cancellation, compression, binary metadata, abort with trailers, unknown methods, and the
backpressure of a streamed response whose client does not read."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import ngh2
import psutil
import pytest
from h2_server import RawH2Client, RunningH2Server

_SERVICE = "test.Echo"
_WAIT = 10.0  # seconds any one step may take


class _Probe:
    """The server-side view of the calls: what a handler saw, signalled across threads."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.written = 0  # bytes the streaming handler has handed to `write`
        self.metadata: tuple[Any, ...] = ()


def _handlers(probe: _Probe) -> dict[str, grpc.RpcMethodHandler]:
    async def echo(request: bytes, context: Any) -> bytes:
        probe.metadata = tuple(context.invocation_metadata())
        context.set_trailing_metadata([("echo-bin", b"\x00\xff"), ("x-echo", "yes")])
        return request

    async def sleep(request: bytes, context: Any) -> bytes:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            probe.cancelled.set()
            raise
        return b""

    async def abort(request: bytes, context: Any) -> None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no: 100%", [("why", "because")])

    async def flood(request: bytes, context: Any) -> None:
        chunk = bytes(64 << 10)
        while True:
            await context.write(chunk)
            probe.written += len(chunk)

    async def chat(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request[::-1]

    async def first(requests: AsyncIterator[bytes], context: Any) -> bytes:
        async for request in requests:  # take one message, let more arrive unread, answer
            await asyncio.sleep(0.05)
            return request[:1]
        return b""

    return {"First": grpc.stream_unary_rpc_method_handler(first), "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Sleep": grpc.unary_unary_rpc_method_handler(sleep),
            "Abort": grpc.unary_unary_rpc_method_handler(abort),
            "Flood": grpc.unary_stream_rpc_method_handler(flood),
            "Chat": grpc.stream_stream_rpc_method_handler(chat)}


@pytest.fixture
def probe() -> _Probe:
    return _Probe()


@pytest.fixture
def server(probe: _Probe) -> Iterator[RunningH2Server]:
    running = RunningH2Server({"grpc.max_receive_message_length": -1}, {_SERVICE: _handlers(probe)})
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def channel(server: RunningH2Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}",
                               options=[("grpc.max_receive_message_length", -1)]) as opened:
        yield opened


def _unary(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(f"/{_SERVICE}/{method}")


def test_echo_with_binary_metadata_both_ways(channel: grpc.Channel, probe: _Probe) -> None:
    reply, call = _unary(channel, "Echo").with_call(b"hello", metadata=[("x-in", "1"), ("blob-bin", b"\x01\x02")],
                                                     timeout=_WAIT)
    assert reply == b"hello" and call.code() == grpc.StatusCode.OK
    assert ("x-in", "1") in probe.metadata and ("blob-bin", b"\x01\x02") in probe.metadata
    assert ("echo-bin", b"\x00\xff") in call.trailing_metadata() and ("x-echo", "yes") in call.trailing_metadata()


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_compressed_requests(channel: grpc.Channel, compression: grpc.Compression) -> None:
    payload = b"squeeze me " * 10_000
    assert _unary(channel, "Echo")(payload, compression=compression, timeout=_WAIT) == payload


def test_large_message_crosses_many_windows(channel: grpc.Channel) -> None:
    payload = bytes(range(256)) * (24 << 12)  # 24 MiB: more than the stream's and the connection's window
    assert _unary(channel, "Echo")(payload, timeout=60) == payload


def test_deadline_cancels_the_handler(channel: grpc.Channel, probe: _Probe) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _unary(channel, "Sleep")(b"", timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert probe.cancelled.wait(_WAIT), "the handler was not cancelled at its deadline"


def test_client_cancel_cancels_the_handler(channel: grpc.Channel, probe: _Probe) -> None:
    future = _unary(channel, "Sleep").future(b"", timeout=60)
    with pytest.raises(grpc.FutureTimeoutError):
        future.result(timeout=0.3)  # the call is running on the server
    future.cancel()
    assert probe.cancelled.wait(_WAIT), "RST_STREAM did not cancel the handler"


def test_abort_sends_status_details_and_trailers(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _unary(channel, "Abort")(b"", timeout=_WAIT)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == "no: 100%"
    assert ("why", "because") in info.value.trailing_metadata()


def test_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _unary(channel, "Nope")(b"", timeout=_WAIT)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_bidirectional_stream(channel: grpc.Channel) -> None:
    chat = channel.stream_stream(f"/{_SERVICE}/Chat")
    assert list(chat(iter([b"abc", b"", b"xy"]), timeout=_WAIT)) == [b"cba", b"", b"yx"]


def _written_once_held(probe: _Probe) -> int:
    """What the Flood handler had written when it stopped (nothing more for half a second); how
    far the client's windows let it go first depends on grpcio's BDP estimate, not on us."""
    deadline = time.monotonic() + 30
    written = probe.written
    while True:
        threading.Event().wait(0.5)
        if probe.written == written:
            return written
        assert time.monotonic() < deadline, f"the writer of an unread stream never stopped ({probe.written} bytes)"
        written = probe.written


def test_unread_stream_stops_its_writer(channel: grpc.Channel, probe: _Probe) -> None:
    """A client that reads nothing holds the handler's writes to the windows plus the high water;
    reading again lets the writer go on."""
    flood = channel.unary_stream(f"/{_SERVICE}/Flood")(b"", timeout=60)
    next(flood)  # the stream runs
    # Unheld, the writer would queue hundreds of MiB a second and never stop; held, it stops at the
    # client's windows (grpcio grows them with its BDP estimate: 8-40 MiB seen) plus our high water.
    held = _written_once_held(probe)
    assert held < 128 << 20, held
    for _ in range(400):  # 25 MiB read: the writer must have been let go to produce them
        next(flood)
    assert probe.written > held
    flood.cancel()


def test_calls_that_stop_reading_give_the_window_back(channel: grpc.Channel) -> None:
    """Bytes held back from a handler that stopped reading return to the connection's window when
    its call ends: 40 such calls hold far more than the connection's 16 MiB, and it still carries."""
    first = channel.stream_unary(f"/{_SERVICE}/First")
    chunk = bytes(256 << 10)
    for _ in range(40):
        assert first(iter([b"x" + chunk] * 8), timeout=_WAIT) == b"x"
    payload = bytes(4 << 20)
    assert _unary(channel, "Echo")(payload, timeout=_WAIT) == payload


def _flood_unread(port: int) -> RawH2Client:
    """A raw HTTP/2 client with wide windows that has asked for Flood and reads nothing."""
    client = RawH2Client(port, settings={ngh2.Setting.INITIAL_WINDOW_SIZE: (1 << 31) - 1})
    client.h2.set_local_window_size((1 << 31) - 1)
    stream = client.h2.send_request([(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"test"),
                                     (b":path", f"/{_SERVICE}/Flood".encode()),
                                     (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    client.h2.send_data(stream, bytes(5), end_stream=True)  # one empty, uncompressed message
    client.flush()
    return client


def test_stop_releases_a_connection_whose_client_reads_nothing(probe: _Probe) -> None:
    """A client that reads nothing keeps the server's socket buffer full, so the connection's close
    never finishes flushing; stop drops it rather than leave its socket open past the server."""
    running = RunningH2Server({}, {_SERVICE: _handlers(probe)})
    client = _flood_unread(running.port)
    try:
        async def backed_up() -> None:  # the socket's buffer is over its high water
            deadline = time.monotonic() + _WAIT
            while not any(connection._paused for connection in running.server._state.connections):
                assert time.monotonic() < deadline, "timed out waiting for the unread stream to fill the socket"
                await asyncio.sleep(0.01)

        running.run(backed_up())
    finally:
        running.close()
    try:
        left = [held for held in psutil.Process().net_connections("tcp") if held.laddr.port == running.port]
        assert not left, f"stop left the server's side of the connection open: {left}"
    finally:
        client.close()


def test_a_client_that_pings_as_it_reads_a_long_answer_keeps_its_connection(server: RunningH2Server) -> None:
    """grpc clients ping as data arrives (BDP probes), far more often than the 5 minutes the ping
    policy allows: as in grpc core, the server's DATA and window updates clear the strikes, so a
    large call both ways ends OK rather than in GOAWAY too_many_pings."""
    client = RawH2Client(server.port)
    stream = client.h2.send_request([(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"test"),
                                     (b":path", f"/{_SERVICE}/Echo".encode()),
                                     (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    body = bytes(range(256)) * (32 << 10)  # 8 MiB: many windows each way
    client.h2.send_data(stream, b"\0" + len(body).to_bytes(4, "big") + body, end_stream=True)
    received, pings, trailers = 0, 0, None
    deadline = time.monotonic() + 60
    try:
        while trailers is None:
            assert time.monotonic() < deadline, f"timed out reading the echo ({received} bytes, {pings} pings)"
            client.h2.ping()  # one ping per read, as a client probing its bandwidth
            pings += 1
            client.flush()
            data = client.sock.recv(1 << 20)
            assert data, f"the server closed the connection after {received} bytes and {pings} pings"
            client.h2.receive_data(data)
            for event in client.h2.events():
                assert not isinstance(event, ngh2.GoAwayReceived), (event, received, pings)
                if isinstance(event, ngh2.DataReceived):
                    received += len(event.data)
                elif isinstance(event, ngh2.TrailersReceived):
                    trailers = dict(event.headers)
    finally:
        client.close()
    assert trailers.get(b"grpc-status") == b"0", trailers
    assert received == len(body) + 5 and pings > 10
