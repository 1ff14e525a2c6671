"""The core's end of the core link: runs the requests frontend workers decoded, as the in-process
frontends would (`core.target`, the decoupled check, tracing, `core.infer`), and answers them.

One task per request, so a slow model never holds up the link. Each request runs under its own
`ClientLink` (backend/client_link.py): a cancel frame from the worker (its HTTP client left
mid-request) closes it, which lets the sequence batcher evict that client's sequence as the
in-process HTTP frontend does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable

from pystub_backend.backend import client_link
from pystub_backend.backend.errors import ServerError, Status, forget_traceback
from pystub_backend.backend.frontends.grpc import servicer as grpc_servicer
from pystub_backend.backend.frontends.http import server as http_server
from pystub_backend.backend.frontends.workers.link import FrameProtocol, request_from_record, response_record
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.telemetry.tracing import RequestTrace, Tracer
from pystub_backend.ipc.messages.workers import (
    WorkerAnswer,
    WorkerCancel,
    WorkerError,
    WorkerHello,
    WorkerInfer,
)
from pystub_backend.ipc.records import WireError

__all__ = ["LinkServer"]

_log = logging.getLogger("pystub.workers")

# The texts Triton's frontends answer a decoupled model with: the in-process frontends' own.
_DECOUPLED = {"HTTP": http_server.DECOUPLED_REFUSAL, "GRPC": grpc_servicer.DECOUPLED_REFUSAL}


class LinkServer:
    """Listens on `path` for workers; `on_hello(index, pid)` is called when a worker is serving."""

    def __init__(self, core: FrontendCore, tracer: Tracer, path: str,
                 on_hello: Callable[[int, int], None]) -> None:
        self._core = core
        self._tracer = tracer
        self._path = path
        self.on_hello = on_hello
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_WorkerConnection] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _WorkerConnection(self), self._path)
        os.chmod(self._path, 0o600)

    async def stop(self) -> None:
        """Close the listener and every connection (workers have stopped by now)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for connection in list(self._connections):
            connection.close()

    def attach(self, connection: _WorkerConnection, attached: bool) -> None:
        (self._connections.add if attached else self._connections.discard)(connection)

    async def _infer(self, frame: WorkerInfer, connection: _WorkerConnection) -> None:
        link = client_link.open_link()  # current for this task: the scheduler may watch it
        connection.links[frame.id] = link
        trace = self._start_trace(frame)
        try:
            answer = await self._run(frame, trace)
        finally:
            link.detach()
            if trace is not None:
                trace.finish()
        connection.send(answer)

    async def _run(self, frame: WorkerInfer, trace: RequestTrace | None) -> WorkerAnswer | WorkerError:
        request_id = frame.id
        try:
            request = request_from_record(frame.request)
            target = self._core.target(request.model_name, request.model_version)
            if target is not None and target.decoupled:
                raise ServerError(_DECOUPLED.get(frame.protocol, _DECOUPLED["HTTP"]), Status.UNSUPPORTED)
            if trace is not None:
                request.trace = trace
                trace.request_start()
            response = await self._core.infer(request, target)
            completed = time.monotonic_ns()
            try:
                record = response_record(response)
            finally:
                response.release()
            if trace is not None:  # the worker writes the bytes; this is when they leave the core
                trace.sent(completed, completed, time.monotonic_ns())
            return WorkerAnswer(request_id, record)
        except ServerError as err:
            forget_traceback(err)
            return WorkerError(request_id, WireError(int(err.status), err.message))
        except Exception as exc:  # noqa: BLE001 - the worker must always get an answer
            _log.exception("a request from a frontend worker failed")
            forget_traceback(exc)
            return WorkerError(request_id, WireError(int(Status.INTERNAL), str(exc) or type(exc).__name__))

    def _start_trace(self, frame: WorkerInfer) -> RequestTrace | None:
        given = frame.trace
        if not self._tracer.active or given is None:
            return None
        trace = self._tracer.start(frame.request.model, frame.protocol, given.traceparent)
        if trace is not None:
            trace.received(given.received_start_ns, given.received_end_ns)
        return trace


class _WorkerConnection(FrameProtocol):
    """One worker's link: a task per request, its ClientLink, and the cancel frames."""

    def __init__(self, server: LinkServer) -> None:
        super().__init__()
        self._server = server
        self.links: dict[int, client_link.ClientLink] = {}  # of the requests running
        self._running: dict[int, asyncio.Task[None]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server.attach(self, True)

    def message_received(self, message: WorkerInfer | WorkerCancel | WorkerHello) -> None:
        if type(message) is WorkerInfer:
            job = asyncio.ensure_future(self._server._infer(message, self))  # noqa: SLF001 - its own half
            self._running[message.id] = job
            job.add_done_callback(functools.partial(self._forget, message.id))
        elif type(message) is WorkerCancel:
            self._cancel(message)
        elif type(message) is WorkerHello:
            self._server.on_hello(message.worker, message.pid)
        else:
            _log.error("a frontend worker sent %s, which only the core sends; ignored", type(message).__name__)

    def _forget(self, request_id: int, _job: asyncio.Task[None]) -> None:
        self._running.pop(request_id, None)
        self.links.pop(request_id, None)

    def _cancel(self, frame: WorkerCancel) -> None:
        """Cancel the request's task (the model sees is_cancelled()): the gRPC call was cancelled,
        or the HTTP client left, which also closes its ClientLink first, as in-process."""
        link = self.links.get(frame.id) if not frame.task else None
        if link is not None:
            link.close()
        job = self._running.get(frame.id)
        if job is not None:
            job.cancel()

    def connection_lost(self, exc: Exception | None) -> None:
        # A worker stopped or died (the pool restarts it): its clients are gone with it.
        self._server.attach(self, False)
        for link in list(self.links.values()):
            link.close()
        for job in list(self._running.values()):
            job.cancel()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
