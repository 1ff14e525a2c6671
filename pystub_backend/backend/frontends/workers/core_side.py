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
from pystub_backend.backend.frontends.workers.link import (
    ANSWER,
    CANCEL,
    ERROR,
    HELLO,
    INFER,
    Frame,
    LinkClosedError,
    TraceStamp,
    read_frame,
    request_from_record,
    response_record,
    write_frame,
)
from pystub_backend.backend.inference import ServerCore
from pystub_backend.backend.telemetry.tracing import RequestTrace, Tracer

__all__ = ["LinkServer"]

_log = logging.getLogger("pystub.workers")

# The texts Triton's frontends answer a decoupled model with (the in-process frontends' texts).
_DECOUPLED = {"HTTP": "HTTP end point doesn't support models with decoupled transaction policy",
              "GRPC": "ModelInfer RPC doesn't support models with decoupled transaction policy"}


class LinkServer:
    """Listens on `path` for workers; `on_hello(index, pid)` is called when a worker is serving."""

    def __init__(self, core: ServerCore, tracer: Tracer, path: str,
                 on_hello: Callable[[int, int], None]) -> None:
        self._core = core
        self._tracer = tracer
        self._path = path
        self._on_hello = on_hello
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve_connection, self._path)
        os.chmod(self._path, 0o600)

    async def stop(self) -> None:
        """Close the listener and every connection (workers have stopped by now)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        links: dict[int, client_link.ClientLink] = {}
        running: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                frame = await read_frame(reader)
                kind = frame["k"]
                if kind == INFER:
                    request_id = frame["id"]
                    running[request_id] = job = asyncio.ensure_future(self._infer(frame, writer, links))
                    job.add_done_callback(functools.partial(_forget, running, request_id))
                elif kind == CANCEL:
                    _cancel(frame, links, running)
                elif kind == HELLO:
                    self._on_hello(int(frame["index"]), int(frame["pid"]))
        except LinkClosedError:
            pass  # a worker stopped or died: the pool notices and restarts it
        finally:
            for link in links.values():
                link.close()  # its clients are gone with it
            for job in list(running.values()):
                job.cancel()
            writer.close()
            self._connections.discard(task)

    async def _infer(self, frame: Frame, writer: asyncio.StreamWriter,
                     links: dict[int, client_link.ClientLink]) -> None:
        request_id = frame["id"]
        link = client_link.open_link()  # current for this task: the scheduler may watch it
        links[request_id] = link
        trace = self._start_trace(frame)
        try:
            answer = await self._run(frame, trace)
        finally:
            links.pop(request_id, None)
            link.detach()
            if trace is not None:
                trace.finish()
        if not writer.is_closing():
            write_frame(writer, answer)

    async def _run(self, frame: Frame, trace: RequestTrace | None) -> Frame:
        request_id = frame["id"]
        try:
            request = request_from_record(frame["request"])
            target = self._core.target(request.model_name, request.model_version)
            if target is not None and target.decoupled:
                raise ServerError(_DECOUPLED.get(frame["protocol"], _DECOUPLED["HTTP"]), Status.UNSUPPORTED)
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
            return {"k": ANSWER, "id": request_id, "response": record}
        except ServerError as err:
            forget_traceback(err)
            return {"k": ERROR, "id": request_id, "status": int(err.status), "message": err.message}
        except Exception as exc:  # noqa: BLE001 - the worker must always get an answer
            _log.exception("a request from a frontend worker failed")
            forget_traceback(exc)
            return {"k": ERROR, "id": request_id, "status": int(Status.INTERNAL),
                    "message": str(exc) or type(exc).__name__}

    def _start_trace(self, frame: Frame) -> RequestTrace | None:
        stamp = frame.get("trace")
        if not self._tracer.active or stamp is None:
            return None
        given = TraceStamp(*stamp)
        model = frame["request"][0]
        trace = self._tracer.start(model, frame["protocol"], given.traceparent)
        if trace is not None:
            trace.received(given.received_start_ns, given.received_end_ns)
        return trace


def _cancel(frame: Frame, links: dict[int, client_link.ClientLink], running: dict[int, asyncio.Task[None]]) -> None:
    """A cancel frame: cancel the request's task (gRPC: the call was cancelled), or close its
    ClientLink (HTTP: the client left; aiohttp would not have cancelled the handler either)."""
    if frame.get("task"):
        job = running.get(frame["id"])
        if job is not None:
            job.cancel()
        return
    link = links.get(frame["id"])
    if link is not None:
        link.close()


def _forget(running: dict[int, asyncio.Task[None]], request_id: int, _job: asyncio.Task[None]) -> None:
    running.pop(request_id, None)
