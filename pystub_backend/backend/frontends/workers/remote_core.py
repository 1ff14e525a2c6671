"""`RemoteCore`: the `FrontendCore` members the infer handlers use (`target`, `infer`), answered by
the core process over the core link (link.py).

The in-process handlers run unchanged in the worker with a `RemoteCore` in place of the core: they
decode with the frontend's codecs, `infer` sends the request over the link, and they encode what
comes back. What a handler knows but does not pass to `infer` (the protocol, the traceparent, when
the request arrived, the HTTP request whose client may leave) travels in the context variable
`CALL`, set by the worker's front of each handler.

`target` answers None: the core looks the model up and makes the decoupled check itself.
A single poller watches the transports of in-flight HTTP requests and sends a cancel frame for a
client that left (what `http/request_link.py` does in-process, without a task per request).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import time
from dataclasses import dataclass
from typing import cast

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.messages import HttpRequest
from pystub_backend.backend.frontends.workers.link import FrameProtocol, request_record, response_from_record
from pystub_backend.backend.inference import FrontendCore, InferRequest, InferResponse, ServingTarget
from pystub_backend.ipc.messages.workers import (
    LinkTrace,
    WorkerAnswer,
    WorkerCancel,
    WorkerError,
    WorkerHello,
    WorkerInfer,
)
from pystub_backend.ipc.records import WireError

__all__ = ["RemoteCore", "CallContext", "CALL"]

_log = logging.getLogger("pystub.workers")
_POLL_SECONDS = 0.1  # as http/request_link.py's HTTP_POLL_SECONDS


@dataclass(frozen=True)
class CallContext:
    """What the worker's handler front learned about a request before the shared handler ran."""

    protocol: str  # "HTTP" or "GRPC"
    received_ns: int
    traceparent: str | None = None
    http_request: HttpRequest | None = None


CALL: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("pystub_worker_call", default=None)


class RemoteCore(FrameProtocol):
    """The core, seen through one link connection. `connect` first; `close` at the end."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[WorkerAnswer | WorkerError]] = {}
        self._watched: dict[int, HttpRequest] = {}
        self._poller: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()  # set when the link is gone: the worker then stops

    async def connect(self, timeout: float) -> None:
        """Raises TimeoutError/OSError when the core's link socket does not answer in time."""
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.create_unix_connection(lambda: self, self._path), timeout)
        self._poller = asyncio.ensure_future(self._poll_clients())

    def hello(self, index: int, pid: int) -> None:
        """Tell the core this worker is serving."""
        self.send(WorkerHello(index, pid))

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self.transport is not None:
            self.transport.close()
        self._fail_pending()

    def as_server_core(self) -> FrontendCore:
        """This object where the shared handlers want a `FrontendCore`: the infer handlers use only
        `target` and `infer` (raw bodies, which need the metadata, take the proxy way)."""
        return cast(FrontendCore, self)

    def target(self, name: str, version: str = "") -> ServingTarget | None:
        return None  # the core looks the model up (once) and checks for decoupled models

    async def infer(self, request: InferRequest, target: ServingTarget | None = None) -> InferResponse:
        """Run `request` in the core. Raises the core's ServerError, or UNAVAILABLE without a link."""
        if not self.open:
            raise ServerError("the server's core is not reachable from this frontend worker", Status.UNAVAILABLE)
        call = CALL.get()
        request_id = next(self._ids)
        future: asyncio.Future[WorkerAnswer | WorkerError] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        protocol = call.protocol if call is not None else "HTTP"
        trace = LinkTrace(call.traceparent, call.received_ns, time.monotonic_ns()) if call is not None else None
        if call is not None and call.http_request is not None:
            self._watched[request_id] = call.http_request
        try:
            self.send(WorkerInfer(request_id, protocol, request_record(request), trace))
            answer = await future
        except asyncio.CancelledError:
            # grpc cancelled the call (deadline, client cancel): cancel the core's task too, as the
            # in-process handler's cancellation would have.
            self.send(WorkerCancel(request_id, True))
            raise
        finally:
            self._pending.pop(request_id, None)
            self._watched.pop(request_id, None)
        if isinstance(answer, WorkerAnswer):
            return response_from_record(answer.response)
        raise ServerError(answer.error.message, Status.coerce(answer.error.code))

    def message_received(self, message: WorkerAnswer | WorkerError) -> None:
        if type(message) not in (WorkerAnswer, WorkerError):
            _log.error("the core sent %s, which only workers send; ignored", type(message).__name__)
            return
        future = self._pending.get(message.id)
        if future is not None and not future.done():
            future.set_result(message)

    def connection_lost(self, exc: Exception | None) -> None:
        _log.warning("the core link closed")
        self.closed.set()
        self._fail_pending()

    def _fail_pending(self) -> None:
        lost = WireError(int(Status.UNAVAILABLE), "the server's core closed the link to this frontend worker")
        for request_id, future in self._pending.items():
            if not future.done():
                future.set_result(WorkerError(request_id, lost))

    async def _poll_clients(self) -> None:
        """Cancel frames for HTTP clients that left while their request was in the core."""
        while True:
            await asyncio.sleep(_POLL_SECONDS)
            gone = [key for key, request in self._watched.items() if request.transport is None]
            for key in gone:
                del self._watched[key]
                self.send(WorkerCancel(key, False))
