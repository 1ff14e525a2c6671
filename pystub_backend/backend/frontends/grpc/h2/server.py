"""The h2 stack's server: what `grpc.aio.Server` offers pystub's listener (handler registration as
the generated `add_*Servicer_to_server` does it, grpc.aio server interceptors, bind, start, stop),
serving each connection with `connection.H2Connection` on the running event loop.

Binding happens when the port is added (a busy port is an OSError then, as with grpc.aio); the
listening socket starts accepting at `start()` (accept.py: a failed accept pauses accepting).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

import grpc

from pystub_backend.backend.frontends.grpc.h2.accept import Acceptor
from pystub_backend.backend.frontends.grpc.h2.connection import H2Connection
from pystub_backend.backend.frontends.grpc.h2.context import H2ServicerContext
from pystub_backend.backend.frontends.grpc.h2.incidents import IncidentLog
from pystub_backend.backend.frontends.grpc.h2.policy import ConnectionPolicy
from pystub_backend.backend.frontends.heap_trim import HeapTrimmer

__all__ = ["H2Server", "ServerState"]

_Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
_MAX_STREAMS = 1000
_CANCELLED_HANDLERS_SECONDS = 5.0  # how long stop() waits for the handlers it cancelled to end
_CLOSING_SECONDS = 1.0  # how long stop() lets closed connections flush their last frames
log = logging.getLogger("pystub.grpc")


class _CallDetails(NamedTuple):
    """grpc.HandlerCallDetails as interceptors and generic handlers see it."""

    method: str
    invocation_metadata: Sequence[tuple[str, str | bytes]]


class ServerState:
    """What every connection of one server shares: its handlers, policy and open connections."""

    def __init__(self, policy: ConnectionPolicy, interceptors: Sequence[grpc.aio.ServerInterceptor]) -> None:
        self.policy = policy
        self.max_streams = _MAX_STREAMS
        self.connections: set[H2Connection] = set()
        self.methods: dict[str, grpc.RpcMethodHandler] = {}
        self.generic: list[grpc.GenericRpcHandler] = []
        self.call_ended = asyncio.Event()  # set whenever a call ends (stop's grace waits on it)
        self.connection_lost = asyncio.Event()  # set whenever a connection's socket goes
        self.heap = HeapTrimmer()  # closed connections' memory back to the system
        self.incidents = IncidentLog(log)  # one line per misbehaving connection, rate-limited
        self._chain: _Continuation = self._find
        for interceptor in reversed(interceptors):
            self._chain = _intercepted(interceptor, self._chain)

    async def _find(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self.methods.get(details.method)
        if handler is not None:
            return handler
        for generic in self.generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    async def lookup(self, method: str, context: H2ServicerContext) -> grpc.RpcMethodHandler | None:
        return await self._chain(_CallDetails(method, context.invocation_metadata()))


def _intercepted(interceptor: grpc.aio.ServerInterceptor, continuation: _Continuation) -> _Continuation:
    async def intercept(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return await interceptor.intercept_service(continuation, details)
    return intercept


def tls_context(server_key: bytes | str, server_cert: bytes | str, root_cert: str | None,
                require_client_auth: bool) -> ssl.SSLContext:
    """A server TLS context offering HTTP/2 (ALPN h2); with `root_cert`, client certificates are
    checked against it (and required when `require_client_auth`). Raises OSError, ssl.SSLError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_cert, server_key)
    context.set_alpn_protocols(["h2"])
    if root_cert:
        context.load_verify_locations(root_cert)
        context.verify_mode = ssl.CERT_REQUIRED if require_client_auth else ssl.CERT_OPTIONAL
    return context


class H2Server:
    """A gRPC server on libnghttp2; the methods pystub's listener uses of grpc.aio.Server."""

    def __init__(self, options: dict[str, int] | None = None,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> None:
        self._options = dict(options or {})
        self._state = ServerState(ConnectionPolicy.of(self._options), interceptors)
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._acceptors: list[Acceptor] = []
        self._unix_paths: list[str] = []

    # -- registration (what the generated code calls) ----------------------------------------------
    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._state.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self._state.methods[f"/{service}/{name}"] = handler

    # -- binding -----------------------------------------------------------------------------------
    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, tls: ssl.SSLContext) -> int:
        return self._bind(address, tls)

    def _bind(self, address: str, tls: ssl.SSLContext | None) -> int:
        """Bind now (`host:port`, `[v6]:port` or `unix:path`); the bound port. Raises OSError."""
        if address.startswith("unix:"):
            path = address[5:]
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                if os.path.exists(path):
                    os.unlink(path)  # a stale socket of a previous run, as grpc core replaces it
                sock.bind(path)
            except OSError:
                sock.close()
                raise
            self._unix_paths.append(path)
            port = 1  # no port, but grpc's "bound" (0 is grpcio's old "failed")
        else:
            host, _, port_text = address.rpartition(":")
            sock = _tcp_socket(host.strip("[]"), int(port_text), bool(self._options.get("grpc.so_reuseport", 0)))
            port = sock.getsockname()[1]
        sock.listen(socket.SOMAXCONN)
        self._sockets.append((sock, tls))
        return port

    # -- running -------------------------------------------------------------------------------------
    async def start(self) -> None:
        handshake = self._state.policy.handshake_timeout
        for sock, tls in self._sockets:
            acceptor = Acceptor(sock, tls, handshake, lambda: H2Connection(self._state), self._state.incidents)
            acceptor.start()
            self._acceptors.append(acceptor)

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; GOAWAY to every client; the open calls get `grace` seconds (None: none),
        then they are cancelled and the connections closed."""
        for acceptor in self._acceptors:
            acceptor.stop()
        connections = list(self._state.connections)
        for connection in connections:
            connection.goaway()
        if grace:
            await _wait_until(lambda: not any(connection.calls for connection in connections),
                              self._state.call_ended, grace)
        handlers = [call.task for connection in self._state.connections for call in connection.calls.values()
                    if call.task is not None]
        for connection in list(self._state.connections):
            connection.cancel_calls()
            connection.close()
        if handlers:  # let the cancelled handlers run their cleanup before the loop moves on
            await asyncio.wait(handlers, timeout=_CANCELLED_HANDLERS_SECONDS)
        await self._connections_gone()
        for connection in list(self._state.connections):  # its client reads nothing: the buffer stays
            connection.abort()
        await self._connections_gone()
        self._acceptors.clear()
        for sock, _ in self._sockets:
            sock.close()
        for path in self._unix_paths:
            _unlink(path)
        self._state.heap.cancel()
        self._state.incidents.close()

    async def _connections_gone(self) -> None:
        await _wait_until(lambda: not self._state.connections, self._state.connection_lost, _CLOSING_SECONDS)

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        return True


async def _wait_until(done: Callable[[], bool], changed: asyncio.Event, seconds: float) -> None:
    """Wait until `done()`, checked whenever `changed` is set, at most `seconds`."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while not done() and loop.time() < until:
        changed.clear()
        try:
            await asyncio.wait_for(changed.wait(), until - loop.time())
        except asyncio.TimeoutError:
            return


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _tcp_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: the sockets accepted from it inherit the protocol number, and asyncio
    # turns Nagle's algorithm off only where it is IPPROTO_TCP (as grpc core turns it off). With it
    # on, an answer's small last frames waited for the client's delayed ACK (40 ms on Linux): one
    # 1 MiB call in ten, 57 calls/s and p90 50 ms under perf_analyzer against 131/s and 9 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock

