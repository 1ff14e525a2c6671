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

A client must not take the loop from the others: what it sends is fed to ngh2 a slice at a time
(1 KiB to 1 MiB, smaller while the slices are dense with frames) and its events are handled at
most `_EVENTS_PER_TURN` a turn of the loop, reading paused while a backlog waits (a read of
256 KiB of HEADERS+RST_STREAM pairs is 20,000 events: 0.4 s in one turn before). Frames that carry
nothing are counted (policy.FloodJudge); a protocol error closes the connection with one line in
the incident log (incidents.py), never a traceback; and a closed connection whose client does
not read is dropped after `_DRAIN_SECONDS`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING

import grpc
import ngh2

from pystub_backend.backend.frontends.grpc.h2.call import ServerCall
from pystub_backend.backend.frontends.grpc.h2.dispatch import serve_call
from pystub_backend.backend.frontends.grpc.h2.inbound import MemoryBudget
from pystub_backend.backend.frontends.grpc.h2.policy import FLOOD_BURST, FLOOD_RATE, FloodJudge, PingJudge
from pystub_backend.backend.frontends.grpc.h2.timers import ConnectionTimers
from pystub_backend.backend.frontends.grpc.h2.wire import (
    SUPPORTED_ENCODINGS,
    TIMEOUT_DETAILS,
    Header,
    MessageReader,
    WireError,
    header_list_size,
    is_grpc_content_type,
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
# ngh2 keeps a header block up to this size (and 1 field per 32 bytes of it, so that the size, not
# the count, is what a long list exceeds: that stream alone is refused); the call's own limit
# (policy.max_metadata, 16 KiB) is checked here, so that a list over it ends that call alone.
_NGH2_HEADER_LIST = 256 << 10
# libnghttp2's own limit on RST_STREAM frames stays as a backstop behind the flood judge, which
# counts them first (and answers with a GOAWAY where ngh2's limit ends the session bare).
_CONFIG = ngh2.Configuration(auto_window_update=False, max_inbound_header_list_size=_NGH2_HEADER_LIST,
                             max_inbound_header_count=_NGH2_HEADER_LIST // 32,
                             stream_reset_rate_limit=(2 * FLOOD_BURST, int(2 * FLOOD_RATE)))
_HEADER_TABLE = 4096  # the HPACK table a client may fill (the protocol's default, said explicitly)
# Bytes handed to ngh2 at a time: a slice that gave many events makes the next one smaller (a
# slice of HEADERS decodes to up to 1,000 header lists), one that gave few the next one larger
# (DATA: one event per frame).
_SLICE_MIN, _SLICE_FIRST, _SLICE_MAX = 1 << 10, 4 << 10, 1 << 20
_BUSY_SLICE, _QUIET_SLICE = 32, 4  # events
_EVENTS_PER_TURN = 128  # events handled before the loop serves the others
# A client sends WINDOW_UPDATEs as it reads what the server sent (grpc's, one for the stream and
# one for the connection per message, often of a few bytes): each message sent allows this many;
# one past them carries nothing, unless it opens a window this much (a client growing its windows).
_UPDATES_PER_MESSAGE = 4
_LARGE_WINDOW_UPDATE = 64 << 10
_DRAIN_SECONDS = 5.0  # a closed connection still unread after this is dropped with what it held
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
        self._floods = FloodJudge(time.monotonic())
        self._budget = MemoryBudget(state.policy.max_connection_memory)
        self.timers = ConnectionTimers(self, state.policy)
        self.closing = False
        self._carried = 0  # bytes received and sent
        self._inbox: collections.deque[memoryview] = collections.deque()  # received, not yet fed to ngh2
        self._slice = _SLICE_FIRST
        self._events: collections.deque[ngh2.Event] = collections.deque()  # from ngh2, not yet handled
        self._work_less = 0  # frames of this turn that carried nothing (FloodJudge)
        self._turn: asyncio.Handle | None = None  # the next turn of a backlog
        self._reading_paused = False
        self._broken = False  # a protocol error: nothing more is read
        self._drain: asyncio.TimerHandle | None = None
        self._reported = False  # the incident log has had its line about this connection
        self._settings_seen = False
        self._last_stream = 0  # the newest stream a call was opened on (a GOAWAY's last stream id)
        self._updates_allowed = _UPDATES_PER_MESSAGE  # WINDOW_UPDATEs the data sent so far explains
        self._opened: list[ServerCall] = []  # calls opened in this turn (_arm_read_timeouts)

    # -- the socket --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        self._peer = peer_name(transport)
        self._state.connections.add(self)
        self._h2.initiate_connection({ngh2.Setting.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
                                      ngh2.Setting.MAX_CONCURRENT_STREAMS: self._state.max_streams,
                                      ngh2.Setting.MAX_FRAME_SIZE: _MAX_FRAME,
                                      ngh2.Setting.HEADER_TABLE_SIZE: _HEADER_TABLE,
                                      ngh2.Setting.MAX_HEADER_LIST_SIZE: self._state.policy.max_metadata})
        self._h2.set_local_window_size(_CONNECTION_WINDOW)
        self.timers.start()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._state.connections.discard(self)
        self._state.connection_lost.set()
        self.timers.stop()
        for handle in (self._turn, self._drain):
            if handle is not None:
                handle.cancel()
        self._inbox.clear()
        self._events.clear()
        self._opened.clear()
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
        self._carried += len(data)
        if self._broken:
            return
        self._inbox.append(memoryview(data))
        if self._turn is None:
            self._read_turn()

    def _read_turn(self) -> None:
        """Feed ngh2 and handle its events, `_EVENTS_PER_TURN` at most; the rest in later turns."""
        self._turn = None
        self._batching = True
        try:
            while self._transport is not None and not self._broken and len(self._events) < _EVENTS_PER_TURN \
                    and self._inbox:
                self._h2.receive_data(self._next_slice())
                events = self._h2.events()
                self._events.extend(events)
                if len(events) > _BUSY_SLICE:
                    self._slice = max(_SLICE_MIN, self._slice >> 2)
                elif len(events) <= _QUIET_SLICE:
                    self._slice = min(_SLICE_MAX, self._slice << 2)
            handled = 0
            while self._events and handled < _EVENTS_PER_TURN and self._transport is not None:
                self._handle(self._events.popleft())
                handled += 1
        except ngh2.NGH2Error as exc:
            self._protocol_error(exc)
        finally:
            self._batching = False
        self._arm_read_timeouts()
        self._judge_floods()
        self._schedule_backlog()
        self.flush()

    def _arm_read_timeouts(self) -> None:
        """The calls opened this turn that are still waiting for their first message get their
        request-read timeout (most unary calls have it by now: no timer for them)."""
        if self._opened:
            opened, self._opened = self._opened, []
            for call in opened:
                call.requests.arm_read_timeout(self._state.policy.request_read_timeout)

    def _next_slice(self) -> memoryview:
        piece = self._inbox.popleft()
        if len(piece) > self._slice:
            self._inbox.appendleft(piece[self._slice:])
            piece = piece[:self._slice]
        return piece

    def _schedule_backlog(self) -> None:
        """Another turn for what is left, after the loop has served everyone else; the socket is
        not read meanwhile (TCP's window then slows the client)."""
        transport = self._transport
        if transport is None or self._broken or not (self._inbox or self._events):
            if self._reading_paused and transport is not None and not self._broken:
                self._reading_paused = False
                transport.resume_reading()
            return
        if not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        self._turn = asyncio.get_running_loop().call_soon(self._read_turn)

    def _judge_floods(self) -> None:
        work_less, self._work_less = self._work_less, 0
        if work_less and self._floods.flooding(time.monotonic(), work_less) and not self._broken:
            self._misbehaved("flood", "sent a flood of frames that carry nothing")
            self.goaway(ngh2.ErrorCode.ENHANCE_YOUR_CALM, b"too_many_frames", close=True)

    def _protocol_error(self, exc: ngh2.NGH2Error) -> None:
        """ngh2 ended the session: it can send nothing more, so the GOAWAY is written here."""
        self._misbehaved(str(exc) or type(exc).__name__, f"broke the HTTP/2 protocol: {exc}")
        self._broken = True
        self._inbox.clear()
        self._events.clear()
        self.cancel_calls()
        if self._transport is not None and not self.closing:
            code = ngh2.ErrorCode.ENHANCE_YOUR_CALM if isinstance(exc, ngh2.DenialOfServiceError) \
                else ngh2.ErrorCode.PROTOCOL_ERROR
            self._transport.write(_goaway_frame(self._last_stream, code))
            self.closing = True
        self.close()

    def _misbehaved(self, kind: str, what: str) -> None:
        """One line for this connection, whatever else it does (incidents.py)."""
        if not self._reported:
            self._reported = True
            self._state.incidents.report(kind, f"gRPC connection from {self._peer} closed: it {what}")

    def flush(self) -> None:
        """Hand what ngh2 has queued to the socket (unless inside a batch or paused)."""
        if self._batching or self._transport is None:
            return
        sent = 0
        window = self._window_left()
        while not self._paused:  # a write over the transport's high water pauses it at once
            try:
                data = self._h2.data_to_send(_WRITE_CHUNK)
            except ngh2.NGH2Error:  # the session ended on a protocol error: nothing more goes out
                break
            if not data:
                break
            self._transport.write(data)
            sent += len(data)
        if sent and self._window_left() < window:
            # DATA went out (only DATA spends the client's window): as grpc core, a client may
            # ping as it reads a long answer (its BDP probes) without striking.
            self._pings.data_sent()
        self._carried += sent
        if self._writers:
            self._wake_writers()
        if self.closing and not self.calls and (self._broken or not self._h2.want_write):
            self.close()

    def _window_left(self) -> int:
        """What the client's connection window still lets the server send (0: the session is over)."""
        try:
            return self._h2.remote_window_size
        except ngh2.NGH2Error:
            return 0

    def close(self) -> None:
        """Close after the last frames (a GOAWAY, say); dropped if still unread `_DRAIN_SECONDS` on."""
        if self._transport is None:
            return
        try:
            data = self._h2.data_to_send()
        except ngh2.NGH2Error:
            data = b""
        if data:
            self._transport.write(data)
        self._transport.close()
        if self._drain is None:
            self._drain = asyncio.get_running_loop().call_later(_DRAIN_SECONDS, self.abort)

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
                if not event.data and not event.end_stream:
                    self._work_less += 1
                call.feed(event.data, event.end_stream)
            else:  # a stream that already has its answer: give the window back
                self._work_less += 1
                if event.data:
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
                if isinstance(event, ngh2.StreamReset):  # reset before its answer (Rapid Reset's frame)
                    self._work_less += 1
                call.cancel()
            self._wake_writers()
        elif isinstance(event, ngh2.WindowUpdated):
            if self._updates_allowed > 0:
                self._updates_allowed -= 1
            elif event.increment < _LARGE_WINDOW_UPDATE:
                self._work_less += 1
            self._wake_writers()
        elif isinstance(event, ngh2.PingReceived):
            if self._pings.too_many(time.monotonic(), bool(self.calls)):
                self._misbehaved("too many pings", "pinged too often (too_many_pings)")
                self.goaway(ngh2.ErrorCode.ENHANCE_YOUR_CALM, b"too_many_pings", close=True)
        elif isinstance(event, ngh2.PingAcknowledged):
            self.timers.ping_acknowledged()
        elif isinstance(event, ngh2.SettingsReceived):
            if self._settings_seen:
                self._work_less += 1
            self._settings_seen = True
            self.timers.handshake_done()
        elif isinstance(event, ngh2.ConnectionClosed):
            self.close()

    def _open(self, stream_id: int, headers: tuple[ngh2.Header, ...], end: bool) -> None:
        self._last_stream = max(self._last_stream, stream_id)
        fields = {name: value for name, value in headers}
        policy = self._state.policy
        size = header_list_size(headers)
        refusal = _refusal(fields, size, policy.max_metadata)
        if refusal is None and b"grpc-timeout" in fields:
            timeout = parse_timeout(fields[b"grpc-timeout"])
            if timeout is None:  # grpc.aio's answer to a malformed one
                refusal = b"200", grpc.StatusCode.INTERNAL, TIMEOUT_DETAILS
        else:
            timeout = None
        if refusal is None:
            try:
                metadata = metadata_of(headers)
            except WireError as error:
                refusal = b"200", error.code, error.details
        if refusal is not None:
            self._work_less += 1
            self._refuse(stream_id, *refusal)
            return
        encoding = fields.get(b"grpc-encoding", b"identity").decode("ascii", "replace")
        deadline = None if timeout is None else time.monotonic() + timeout
        call = ServerCall(self, stream_id, fields[b":path"].decode("ascii", "replace"), metadata, self._peer,
                          deadline, MessageReader(encoding, policy.max_receive),
                          response_encoding(policy.compression_level, fields.get(b"grpc-accept-encoding")),
                          self._budget)
        if not call.requests.hold_headers(size):
            full = self._budget.exhausted()
            self._refuse(stream_id, b"200", full.code, full.details)
            return
        call.max_send = policy.max_send
        self.calls[stream_id] = call
        self.timers.call_started()
        if end:
            call.feed(b"", True)
        elif policy.request_read_timeout is not None:
            self._opened.append(call)  # its read timeout, at the end of the turn if still waiting
        loop = asyncio.get_running_loop()
        # the loop's own create_task: ensure_future looks the loop up again in Python, per call
        call.task = loop.create_task(serve_call(call, self._state.lookup))
        if timeout is not None:
            call.deadline_timer = loop.call_later(timeout, call.expire)

    def _refuse(self, stream_id: int, status: bytes, code: grpc.StatusCode, details: str) -> None:
        """A trailers-only answer to a call that does not start."""
        self._h2.send_response(stream_id, [(b":status", status), (b"content-type", b"application/grpc"),
                                           *status_headers(code, details, ())], end_stream=True)
        self._pings.data_sent()

    # -- the calls' Link ------------------------------------------------------------------------------
    def submit_headers(self, stream_id: int, headers: list[Header], end: bool) -> None:
        if self._broken:  # ngh2 ended the session: nothing more goes through it
            return
        self._h2.send_response(stream_id, headers, end_stream=end)
        self._pings.data_sent()
        self._flush_soon()

    def submit_message(self, stream_id: int, prefix: bytes, body: bytes) -> None:
        if self._broken:  # ngh2 ended the session: nothing more goes through it
            return
        self._h2.send_data(stream_id, prefix)
        self._h2.send_data(stream_id, body)
        self._pings.data_sent()
        self._updates_allowed += _UPDATES_PER_MESSAGE * (1 + len(body) // _MAX_FRAME)
        self._flush_soon()

    def submit_trailers(self, stream_id: int, headers: list[Header]) -> None:
        if self._broken:  # ngh2 ended the session: nothing more goes through it
            return
        self._h2.send_trailers(stream_id, headers)
        self._pings.data_sent()
        self._flush_soon()

    def acknowledge(self, stream_id: int, amount: int) -> None:
        if self._broken:  # ngh2 ended the session: nothing more goes through it
            return
        try:
            self._h2.acknowledge_received_data(amount, stream_id)
        except ngh2.NGH2Error:  # the stream is gone: the connection's window still needs the bytes back
            self._h2.acknowledge_received_data(amount, 0)
        self._pings.data_sent()  # window updates follow: grpc core clears the strikes for those too
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


def _goaway_frame(last_stream: int, code: int) -> bytes:
    """A GOAWAY frame: 8 bytes of payload, type 7, no flags, stream 0."""
    return b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + last_stream.to_bytes(4, "big") + int(code).to_bytes(4, "big")


def _refusal(fields: dict[bytes, bytes], header_size: int, max_header_size: int
             ) -> tuple[bytes, grpc.StatusCode, str] | None:
    """(HTTP status, gRPC status, details) for a request that is not a gRPC call, as grpc core."""
    if fields.get(b":method") != b"POST":
        return b"405", grpc.StatusCode.INTERNAL, "gRPC requires the POST method"
    if not is_grpc_content_type(fields.get(b"content-type", b"")):
        return b"415", grpc.StatusCode.INTERNAL, "Content-Type is not application/grpc"
    encoding = fields.get(b"grpc-encoding", b"identity").decode("ascii", "replace")
    if encoding not in SUPPORTED_ENCODINGS:
        return b"200", grpc.StatusCode.UNIMPLEMENTED, f"Compression algorithm '{encoding}' is disabled."
    if b":path" not in fields:
        return b"400", grpc.StatusCode.INTERNAL, "no :path"
    if 0 <= max_header_size < header_size:  # grpc core's words
        return (b"200", grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"received metadata size exceeds hard limit ({header_size} vs. {max_header_size})")
    return None
