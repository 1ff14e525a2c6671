"""The inference port's listener: an asyncio server whose connections are `HttpConnection`s serving
one `HttpApp`, on TCP or on a unix socket (the core's private socket behind frontend workers).

Stopping (as aiohttp's runner did): stop accepting, close the connections that are idle, let each
request in progress finish (no further request of its connection is read) for at most `grace`
seconds, then cancel what is left and close every connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from pystub_backend.backend.frontends.heap_trim import HeapTrimmer
from pystub_backend.backend.frontends.http.app import HttpApp
from pystub_backend.backend.frontends.http.connection import ConnectionSettings, HttpConnection, ReadTimeouts

__all__ = ["HttpListener"]

_log = logging.getLogger(__name__)


class HttpListener:
    """`start_tcp` or `start_unix` once, `stop` at the end."""

    def __init__(self, app: HttpApp, read_timeouts: ReadTimeouts | None = None) -> None:
        self.app = app
        self.heap = HeapTrimmer()
        self.connections: set[HttpConnection] = set()
        self._settings = ConnectionSettings(app, read_timeouts or ReadTimeouts(), self.heap,
                                            self.connections.add, self.connections.discard)
        self._server: asyncio.Server | None = None

    def _protocol(self) -> HttpConnection:
        return HttpConnection(self._settings)

    async def start_tcp(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on host:port (0: a free one); the bound port. Raises OSError."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, host, port, reuse_address=True,
                                                reuse_port=reuse_port or None, backlog=128)
        return int(self._server.sockets[0].getsockname()[1])

    async def start_unix(self, path: str) -> None:
        """Listen on the unix socket `path`. Raises OSError."""
        self._server = await asyncio.get_running_loop().create_unix_server(self._protocol, path, backlog=128)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._server.sockets) if self._server is not None else ()

    async def stop(self, grace: float = 60.0) -> None:
        """Stop accepting; requests in progress get `grace` seconds to finish. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await asyncio.sleep(0)  # connections accepted just before the close start their first request
        busy = [task for connection in list(self.connections)
                if not connection.close_if_idle() and (task := connection.finish_then_close()) is not None]
        if busy:
            _, late = await asyncio.wait(busy, timeout=grace)
            if late:
                _log.warning("%d HTTP requests still running %g s after the shutdown began: cancelled", len(late),
                             grace)
            for task in late:
                task.cancel()
        for connection in list(self.connections):
            connection.force_close()
        self.heap.cancel()  # a trim the last closes asked for: the loop is about to go
