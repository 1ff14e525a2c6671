"""pystub's h2 gRPC server for tests that talk to it from synchronous code (on 127.0.0.1, a free
port, its event loop in a thread of its own), and a raw HTTP/2 client written with ngh2 for tests
that need frames grpcio would not send or reads it would not skip; `frame` and `hpack_*` build the
frames even ngh2 would not send (floods, bad magic, a chosen HPACK encoding) for `send_raw`."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
import ngh2

from pystub_backend.backend.frontends.grpc.h2 import H2Server

WAIT = 10.0  # seconds any one step on the server's loop may take
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x6, 0x8, 0x9
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: 3-byte length, type, flags, stream id, payload."""
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out, value = bytearray((first | limit,)), value - limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal(name: bytes, value: bytes, indexed: bool = False) -> bytes:
    """A header field as an HPACK literal with a new name (no Huffman); `indexed`: also added to the
    decoder's dynamic table (whose newest entry is index 62)."""
    return (b"\x40" if indexed else b"\x00") + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


def hpack_indexed(index: int) -> bytes:
    """A reference to table entry `index` (static 1-61, dynamic from 62)."""
    return _hpack_int(index, 7, 0x80)


def grpc_request_block(path: bytes, extra: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """A gRPC request's header block, every field a literal."""
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"127.0.0.1"),
              (b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra]
    return b"".join(hpack_literal(name, value) for name, value in fields)


class RunningH2Server:
    def __init__(self, options: dict[str, int],
                 services: dict[str, dict[str, grpc.RpcMethodHandler]] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="h2-test-server")
        self.thread.start()
        self.server = H2Server(options)
        for service, handlers in (services or {}).items():
            self.server.add_registered_method_handlers(service, handlers)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.run(self.server.start())

    def run(self, coro: Any) -> Any:  # noqa: ANN401 - whatever the coroutine returns
        """Run `coro` on the server's loop and return its result (within WAIT seconds)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=WAIT)

    def close(self) -> None:
        try:
            self.run(self.server.stop(None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=WAIT)
            self.loop.close()


class RawH2Client:
    """A raw HTTP/2 client connection: what it sends, and the events and end of what it reads.
    `preface`: send the connection preface with `settings`; without it the server waits for one."""

    def __init__(self, port: int, preface: bool = True, settings: Mapping[ngh2.Setting, int] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.h2 = ngh2.Connection(ngh2.Role.CLIENT)
        if preface:
            self.h2.initiate_connection(settings)
            self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def send_raw(self, data: bytes) -> None:
        """Bytes straight to the socket, past ngh2 (whose own state does not see them)."""
        self.sock.sendall(data)

    def events_until_closed(self, answer: bool = True) -> tuple[list[ngh2.Event], float]:
        """Read until the server closes the connection: the events, and when it closed.
        `answer`: acknowledge what needs it (pings); otherwise read the bytes and answer nothing."""
        events: list[ngh2.Event] = []
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return events, time.monotonic()
            if answer:
                self.h2.receive_data(data)
                events += self.h2.events()
                try:
                    self.flush()
                except (ConnectionResetError, BrokenPipeError):  # closed right after its last frames
                    return events, time.monotonic()
        raise AssertionError("the server did not close the connection")

    def close(self) -> None:
        self.sock.close()
