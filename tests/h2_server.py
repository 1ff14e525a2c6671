"""pystub's h2 gRPC server for tests that talk to it from synchronous code: on 127.0.0.1, a free
port, its event loop in a thread of its own."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc

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
