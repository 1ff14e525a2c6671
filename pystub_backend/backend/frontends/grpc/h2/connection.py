"""One client connection of the h2 stack: an asyncio protocol around libnghttp2 (ngh2, sans-I/O).

Bytes from the socket go into ngh2; its events open calls (RequestReceived), feed them (DataReceived,
TrailersReceived), cancel them (StreamReset, StreamClosed before the status) and wake writers
(WindowUpdated). What the calls queue goes out in one flush per batch: while the events of one
`data_received` are handled the writes wait for its end, and a call's task flushes its own.
The socket's own backpressure (pause_writing) stops taking bytes out of ngh2, which then holds the
streams' data, which makes their writers wait (call.py). Bytes leave ngh2 `_WRITE_CHUNK` at a time
and only while the socket is not paused, so the transport's buffer stays near its high water
instead of taking all the client's windows allow (megabytes a stream once grpc clients grow them).
A connection that carried much asks for the freed heap back when it closes (frontends/heap_trim.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc
import ngh2

from pystub_backend.backend.frontends.grpc.h2.call import ServerCall
from pystub_backend.backend.frontends.grpc.h2.dispatch import serve_call
from pystub_backend.backend.frontends.grpc.h2.policy import PingJudge
from pystub_backend.backend.frontends.grpc.h2.timers import ConnectionTimers
from pystub_backend.backend.frontends.grpc.h2.wire import (
    SUPPORTED_ENCODINGS,
    Header,
    MessageReader,
    WireError,
    metadata_of,
    parse_timeout,
    response_encoding,
    status_headers,
)
from pystub_backend.backend.frontends.heap_trim import TRIM_AFTER_BYTES

if TYPE_CHECKING:
    from pystub_backend.backend.frontends.grpc.h2.server import ServerState

__all__ = ["H2Connection"]

log = logging.getLogger("pystub.grpc")
_CONFIG = ngh2.Configuration(auto_window_update=False)
# What one stream may send before the server reads it: a message of 1 MiB and more fits, so the
# client does not stop mid-message for a WINDOW_UPDATE's round trip (as it did with 1 MiB).
_STREAM_WINDOW = 4 << 20
_CONNECTION_WINDOW = 16 << 20
# The largest DATA frame a client may send (SETTINGS_MAX_FRAME_SIZE). Each frame is one event
# handled in Python: at the protocol's default of 16 KiB a 16 MiB request was 1,024 of them and
# cost twice grpc.aio's CPU; 1 MiB frames made it 16.
_MAX_FRAME = 1 << 20
# Bytes taken from ngh2 per transport write: at most this much sits in the transport's buffer
# past its high water. 256 KiB chunks were mmapped and page-faulted afresh under glibc's default
# thresholds (1.7x the CPU of 64 KiB ones on a 1 MiB echo); with the heap keeping them
# (pystub_backend/ipc/heap.py) they take 10-35 % less server CPU per 1 MiB call than 64 KiB ones.
_WRITE_CHUNK = 256 << 10


def peer_name(transport: asyncio.BaseTransport) -> str:
    """grpc's form of the peer address: ipv4:host:port, ipv6:[host]:port, unix:path."""
    address = transport.get_extra_info("peername")
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{address or ''}"


class H2Connection(asyncio.Protocol):
    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._h2 = ngh2.Connection(ngh2.Role.SERVER, _CONFIG)
        self._transport: asyncio.Transport | None = None
        self._peer = ""
        self.calls: dict[int, ServerCall] = {}
        self._batching = False
        self._flush_pending = False
        self._paused = False
        self._writers: dict[int, asyncio.Future[None]] = {}
        self._pings = PingJudge(state.policy)
        self.timers = ConnectionTimers(self, state.policy)
        self.closing = False
        self._carried = 0  # bytes received and sent

    # -- the socket --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        self._peer = peer_name(transport)
        self._state.connections.add(self)
        self._h2.initiate_connection({ngh2.Setting.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
                                      ngh2.Setting.MAX_CONCURRENT_STREAMS: self._state.max_streams,
                                      ngh2.Setting.MAX_FRAME_SIZE: _MAX_FRAME})
        self._h2.set_local_window_size(_CONNECTION_WINDOW)
        self.timers.start()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._state.connections.discard(self)
        self._state.connection_lost.set()
        self.timers.stop()
        for call in list(self.calls.values()):
            call.cancel()
        self.calls.clear()
        self._wake_writers()
        self._transport = None
        if self._carried >= TRIM_AFTER_BYTES:
            self._state.heap.released()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self.flush()

    def data_received(self, data: bytes) -> None:
        self._batching = True
        self._carried += len(data)
        try:
            self._h2.receive_data(data)
            for event in self._h2.events():
                self._handle(event)
        except ngh2.NGH2Error as exc:
            log.debug("gRPC connection from %s: %s", self._peer, exc)
            self.close()
        finally:
            self._batching = False
        self.flush()

    def flush(self) -> None:
        """Hand what ngh2 has queued to the socket (unless inside a batch or paused)."""
        if self._batching or self._transport is None:
            return
        sent = 0
        while not self._paused:  # a write over the transport's high water pauses it at once
            data = self._h2.data_to_send(_WRITE_CHUNK)
            if not data:
                break
            self._transport.write(data)
            sent += len(data)
        if sent:
            self._carried += sent
            self._pings.data_sent()
        if self._writers:
            self._wake_writers()
        if self.closing and not self.calls and not self._h2.want_write:
            self.close()

    def close(self) -> None:
        if self._transport is not None:
            data = self._h2.data_to_send()
            if data:
                self._transport.write(data)
            self._transport.close()

    def abort(self) -> None:
        """Drop the socket now, with whatever it still had to send: a client that stopped reading
        would otherwise keep a closed connection's buffer, and its socket, forever."""
        if self._transport is not None:
            self._transport.abort()

    # -- events --------------------------------------------------------------------------------------
    def _handle(self, event: ngh2.Event) -> None:
        if isinstance(event, ngh2.DataReceived):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.feed(event.data, event.end_stream)
            elif event.data:  # a stream that already has its answer: give the window back
                self.acknowledge(event.stream_id, len(event.data))
        elif isinstance(event, ngh2.RequestReceived):
            self._open(event.stream_id, event.headers, event.end_stream)
        elif isinstance(event, ngh2.TrailersReceived):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.feed(b"", True)
        elif isinstance(event, (ngh2.StreamReset, ngh2.StreamClosed)):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.cancel()
            self._wake_writers()
        elif isinstance(event, ngh2.WindowUpdated):
            self._wake_writers()
        elif isinstance(event, ngh2.PingReceived):
            if self._pings.too_many(time.monotonic(), bool(self.calls)):
                self.goaway(ngh2.ErrorCode.ENHANCE_YOUR_CALM, b"too_many_pings", close=True)
        elif isinstance(event, ngh2.PingAcknowledged):
            self.timers.ping_acknowledged()
        elif isinstance(event, ngh2.SettingsReceived):
            self.timers.handshake_done()
        elif isinstance(event, ngh2.ConnectionClosed):
            self.close()

    def _open(self, stream_id: int, headers: tuple[ngh2.Header, ...], end: bool) -> None:
        fields = {name: value for name, value in headers}
        refusal = _refusal(fields)
        if refusal is not None:
            status, code, details = refusal
            self._h2.send_response(stream_id, [(b":status", status), (b"content-type", b"application/grpc"),
                                               *status_headers(code, details, ())], end_stream=True)
            return
        try:
            metadata = metadata_of(headers)
        except WireError as error:
            self._h2.send_response(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc"),
                                               *status_headers(error.code, error.details, ())], end_stream=True)
            return
        timeout = parse_timeout(fields[b"grpc-timeout"]) if b"grpc-timeout" in fields else None
        deadline = None if timeout is None else time.monotonic() + timeout
        encoding = fields.get(b"grpc-encoding", b"identity").decode("ascii", "replace")
        policy = self._state.policy
        call = ServerCall(self, stream_id, fields[b":path"].decode("ascii", "replace"), metadata, self._peer,
                          deadline, MessageReader(encoding, policy.max_receive),
                          response_encoding(policy.compression_level, fields.get(b"grpc-accept-encoding")))
        call.max_send = policy.max_send
        self.calls[stream_id] = call
        self.timers.call_started()
        if end:
            call.feed(b"", True)
        call.task = asyncio.ensure_future(serve_call(call, self._state.lookup))
        if timeout is not None:
            call.deadline_timer = asyncio.get_running_loop().call_later(timeout, call.expire)

    # -- the calls' Link ------------------------------------------------------------------------------
    def submit_headers(self, stream_id: int, headers: list[Header], end: bool) -> None:
        self._h2.send_response(stream_id, headers, end_stream=end)
        self._flush_soon()

    def submit_message(self, stream_id: int, prefix: bytes, body: bytes) -> None:
        self._h2.send_data(stream_id, prefix)
        self._h2.send_data(stream_id, body)
        self._flush_soon()

    def submit_trailers(self, stream_id: int, headers: list[Header]) -> None:
        self._h2.send_trailers(stream_id, headers)
        self._flush_soon()

    def acknowledge(self, stream_id: int, amount: int) -> None:
        try:
            self._h2.acknowledge_received_data(amount, stream_id)
        except ngh2.NGH2Error:  # the stream is gone: the connection's window still needs the bytes back
            self._h2.acknowledge_received_data(amount, 0)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """One flush for everything queued in this turn of the loop: a unary answer's headers,
        message and trailers go out in one write."""
        if not self._flush_pending and not self._batching:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_pending = False
        self.flush()

    def queued(self, stream_id: int) -> int:
        try:
            return self._h2.queued_body_size(stream_id)
        except ngh2.NGH2Error:
            return 0

    async def writable(self, stream_id: int) -> None:
        waiter = self._writers.get(stream_id)
        if waiter is None:
            waiter = self._writers[stream_id] = asyncio.get_running_loop().create_future()
        await waiter

    def _wake_writers(self) -> None:
        """Every waiting writer looks again at its stream's queue (call.send_message)."""
        writers, self._writers = self._writers, {}
        for waiter in writers.values():
            if not waiter.done():
                waiter.set_result(None)

    def call_ended(self, call: ServerCall) -> None:
        if call.deadline_timer is not None:
            call.deadline_timer.cancel()
        self.calls.pop(call.stream_id, None)
        self.timers.call_ended(bool(self.calls))
        self._state.call_ended.set()
        self._flush_soon()

    # -- connection limits (timers.py) ------------------------------------------------------------
    def ping(self) -> None:
        self._h2.ping()
        self._flush_soon()

    def goaway(self, code: int = 0, debug: bytes = b"", close: bool = False) -> None:
        """Tell the client to open no new call here; `close`: now, else once the open calls end."""
        if self._transport is None:
            return
        self.closing = True
        try:
            self._h2.send_goaway(code, debug_data=debug)
        except ngh2.NGH2Error:
            pass
        if close or not self.calls:
            self.close()
        else:
            self.flush()

    def cancel_calls(self) -> None:
        for call in list(self.calls.values()):
            call.cancel()


def _refusal(fields: dict[bytes, bytes]) -> tuple[bytes, grpc.StatusCode, str] | None:
    """(HTTP status, gRPC status, details) for a request that is not a gRPC call, as grpc core."""
    if fields.get(b":method") != b"POST":
        return b"405", grpc.StatusCode.INTERNAL, "gRPC requires the POST method"
    if not fields.get(b"content-type", b"").startswith(b"application/grpc"):
        return b"415", grpc.StatusCode.INTERNAL, "Content-Type is not application/grpc"
    encoding = fields.get(b"grpc-encoding", b"identity").decode("ascii", "replace")
    if encoding not in SUPPORTED_ENCODINGS:
        return b"200", grpc.StatusCode.UNIMPLEMENTED, f"Compression algorithm '{encoding}' is disabled."
    if b":path" not in fields:
        return b"400", grpc.StatusCode.INTERNAL, "no :path"
    return None
