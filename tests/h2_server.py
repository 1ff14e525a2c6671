"""pystub's h2 gRPC server for tests that talk to it from synchronous code (on 127.0.0.1, a free
port, its event loop in a thread of its own), and a raw HTTP/2 client written with ngh2 for tests
that need frames grpcio would not send or reads it would not skip."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import grpc
import ngh2

from pystub_backend.backend.frontends.grpc.h2 import H2Server

WAIT = 10.0  # seconds any one step on the server's loop may take


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
