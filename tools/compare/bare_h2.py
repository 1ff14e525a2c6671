"""Bare gRPC ceilings on HTTP/2 servers from PyPI other than grpcio (see compare/bare.py).

A gRPC call is an HTTP/2 POST to /package.Service/Method whose body is length-prefixed messages
(1 byte compressed flag, 4 bytes big-endian length, the message) and whose answer ends in HTTP/2
*trailers* carrying grpc-status. A server can carry gRPC when it can send those trailers:

    bare-grpclib            grpclib: gRPC on asyncio + the pure-Python h2 library
    bare-grpc-hypercorn     hypercorn (ASGI over h2, pure Python), `http.response.trailers` extension
    bare-grpc-h2corn        h2corn (ASGI, HTTP/2 in Rust), `http.response.trailers` extension; it answers
                            gRPC requests 415 unless told `grpc=True`
    bare-grpc-ngh2          an asyncio protocol over ngh2 (libnghttp2, sans-I/O) written here
    bare-grpc-ngh2-asyncio  the same on the standard library's event loop (pystub's), not uvloop
    bare-grpc-native-front  pygrpc-native's low-level API: HTTP/2 and gRPC framing in Rust threads,
                            calls reach one Python thread in batches and are answered by id

The asyncio ones run their event loop on uvloop when installed (what each recommends). They need
packages the project does not depend on: they run under the candidates' own venv
(compare/environment.py `ensure_candidates`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

from bare_messages import METHODS, SERVICE, UNARY, answer

MODES = ("bare-grpc-native-front", "bare-grpclib", "bare-grpc-hypercorn", "bare-grpc-h2corn", "bare-grpc-ngh2",
         "bare-grpc-ngh2-asyncio")
_UNIMPLEMENTED = b"12"
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def frame(message: bytes) -> bytes:
    """One uncompressed gRPC length-prefixed message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


# ---- ASGI (hypercorn, h2corn) --------------------------------------------------------------

async def grpc_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    """Unary gRPC as an ASGI app: the reply's status travels in `http.response.trailers`."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    reply = answer(scope["path"], bytes(body[5:]))
    await send({"type": "http.response.start", "status": 200, "trailers": True,
                "headers": [(b"content-type", b"application/grpc")]})
    await send({"type": "http.response.body", "body": b"" if reply is None else frame(reply)})
    status = _UNIMPLEMENTED if reply is None else b"0"
    await send({"type": "http.response.trailers", "headers": [(b"grpc-status", status)]})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def serve_hypercorn(port: int) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    # hypercorn closes a connection after 1000 requests by default: perf_analyzer's one channel
    # then fails the run with "Socket closed"
    config.keep_alive_max_requests = 1 << 62
    await serve(grpc_asgi, config)  # type: ignore[arg-type]  # hypercorn's own ASGI type aliases


async def serve_h2corn(port: int) -> None:
    from h2corn import Config, Server

    server = Server(grpc_asgi, Config(bind=(f"127.0.0.1:{port}",), access_log=False, grpc=True))  # type: ignore[arg-type]
    await server.serve()


# ---- grpclib -------------------------------------------------------------------------------

class _GrpclibService:
    """grpclib finds a service's methods through `__mapping__` (what its protoc plugin generates)."""

    def __mapping__(self) -> dict[str, Any]:
        from grpclib.const import Cardinality, Handler

        return {SERVICE + name: Handler(_grpclib_handler(handler), Cardinality.UNARY_UNARY, request_type,
                                             response_type)
                for name, (request_type, handler, response_type) in METHODS.items()}


def _grpclib_handler(handler: Callable[[Any], Any]) -> Callable[[Any], Awaitable[None]]:
    async def call(stream: Any) -> None:
        request = await stream.recv_message()
        await stream.send_message(handler(request))
    return call


async def serve_grpclib(port: int) -> None:
    from grpclib.server import Server

    server = Server([_GrpclibService()])
    await server.start("127.0.0.1", port)
    await server.wait_closed()


# ---- ngh2 ----------------------------------------------------------------------------------

class _Ngh2Protocol(asyncio.Protocol):
    """Unary gRPC straight on libnghttp2: each request answered in the callback that completed it."""

    def __init__(self) -> None:
        import ngh2

        self._ngh2 = ngh2
        self._connection = ngh2.Connection(ngh2.Role.SERVER)
        self._streams: dict[int, tuple[str, bytearray]] = {}
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self._connection.initiate_connection()
        self._transport.write(self._connection.data_to_send())

    def data_received(self, data: bytes) -> None:
        ngh2 = self._ngh2
        self._connection.receive_data(data)
        for event in self._connection.events():
            if isinstance(event, ngh2.RequestReceived):
                path = next(value for name, value in event.headers if name == b":path")
                self._streams[event.stream_id] = (path.decode(), bytearray())
            elif isinstance(event, ngh2.DataReceived):
                self._streams[event.stream_id][1].extend(event.data)
                if event.end_stream:
                    self._respond(event.stream_id)
            elif isinstance(event, ngh2.StreamReset):
                self._streams.pop(event.stream_id, None)
            elif isinstance(event, ngh2.ConnectionClosed) and self._transport is not None:
                self._transport.close()
        if self._transport is not None:
            self._transport.write(self._connection.data_to_send())

    def _respond(self, stream_id: int) -> None:
        path, body = self._streams.pop(stream_id)
        reply = answer(path, bytes(body[5:]))
        self._connection.send_response(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        if reply is not None:
            self._connection.send_data(stream_id, frame(reply))
        status = _UNIMPLEMENTED if reply is None else b"0"
        self._connection.send_trailers(stream_id, [(b"grpc-status", status)])


async def serve_ngh2(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Ngh2Protocol, "127.0.0.1", port)
    await server.serve_forever()


# ---- pygrpc-native's low-level API ---------------------------------------------------------

def serve_native_front(port: int) -> None:
    """One Python thread takes the calls in batches of up to 64 and answers each by id."""
    from pygrpc_native import EVENT_CALL, NativeGrpcFront

    paths = list(UNARY)
    front = NativeGrpcFront(f"127.0.0.1:{port}", [(path, False) for path in paths])
    front.start()
    # recv_batch returns None once the front is closed; the process is killed before that here
    while (events := front.recv_batch(64)) is not None:
        for kind, call_id, method_id, payload, _ in events:
            if kind == EVENT_CALL and payload is not None:
                reply = answer(paths[method_id], payload)
                front.respond(call_id, b"" if reply is None else reply)


SERVERS: dict[str, Callable[[int], Coroutine[Any, Any, None]]] = {
    "bare-grpclib": serve_grpclib, "bare-grpc-hypercorn": serve_hypercorn, "bare-grpc-h2corn": serve_h2corn,
    "bare-grpc-ngh2": serve_ngh2}


def run(mode: str, port: int) -> None:
    """Serve `mode` on `port` until killed, on uvloop when it is installed (unless `*-asyncio`)."""
    if mode == "bare-grpc-native-front":
        serve_native_front(port)
        return
    if mode.endswith("-asyncio"):
        asyncio.run(SERVERS[mode.removesuffix("-asyncio")](port))
        return
    try:
        import uvloop
    except ImportError:
        asyncio.run(SERVERS[mode](port))
    else:
        uvloop.run(SERVERS[mode](port))
