"""gRPC `ModelStreamInfer`: many requests on one bidirectional stream
(docs/reference/protocol.md#streaming-and-decoupled-models, #cancellation).

Each request runs as soon as it arrives; its responses are written as they come, each carrying
`triton_final_response`. Default-mode models answer in request order; decoupled models send 0..N
responses that may interleave with other requests'. A flags-only final becomes an empty response
only when the request asked for `triton_enable_empty_final_response`. Errors travel in-band
(`error_message`) and the stream goes on, unless the client opened it with the header
`triton_grpc_error: true`: then the first error ends the stream with its gRPC status.

When the client cancels or closes the stream, every request still running on it is cancelled:
the model sees `is_cancelled()`, and what it still sends is released unread. The handler is a
coroutine that writes with `context.write`, not an async generator: grpc.aio cancels the handler's
task when the client goes, and a generator suspended at `yield` would not see that (its cleanup
would wait for the garbage collector while the model kept streaming).

Flow control: the messages waiting for the stream's writer are bounded (`STREAM_WINDOW_BYTES`, at
most `_OUT_QUEUE` messages), and `context.write` waits for the connection. A client that does not
read stops the writer, then the requests' tasks (each holds at most one encoded message), then the
release of the model's responses, which keeps credits from the stub, whose sender then waits
(stub/senders.py). Each request has a window of its own in the stub, so the stream also bounds how
many of its requests run at once (`STREAM_MAX_REQUESTS`): while that many run, the handler reads no
further request from the client (HTTP/2 flow control then stops the client's sending), and the next
one is read when one of them ends. What one client's stream holds is bounded whatever it sends
(docs/hostile-input.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from pystub_backend.backend import client_link
from pystub_backend.backend.delay_hooks import delay_hooks
from pystub_backend.backend.errors import ServerError, forget_traceback, grpc_code, grpc_details
from pystub_backend.backend.frontends.forwarding import forward_headers
from pystub_backend.backend.frontends.grpc.codec import decode_infer_request, encode_infer_response, output_bytes
from pystub_backend.backend.header_patterns import HeaderPattern
from pystub_backend.backend.inference import FrontendCore, InferRequest, InferResponse
from pystub_backend.backend.telemetry.tracing import RequestTrace, Tracer

__all__ = ["stream_infer", "EMPTY_FINAL_KEY", "STREAM_WINDOW_BYTES", "STREAM_MAX_REQUESTS"]

log = logging.getLogger("pystub.grpc")
EMPTY_FINAL_KEY = "triton_enable_empty_final_response"
STREAM_WINDOW_BYTES = 256 << 10  # encoded messages waiting for one stream's writer (one always fits)
# Requests of one stream running at once; more wait unread (each running one may hold its stub window).
STREAM_MAX_REQUESTS = 16
_DONE = object()
_OUT_QUEUE = 64


class _WriteQueue:
    """The items waiting for a stream's writer, bounded in count and bytes: `put` waits while the
    queue is full, except that an empty queue takes one item of any size.

    Futures rather than an asyncio.Condition, as asyncio.Queue does: the writer takes an item
    without a lock round when one is there, and each item taken wakes one waiting producer, not
    all of them (a streamed token costs one `put` and one `get`, thousands of times a second, and
    while the writer is the bottleneck every running request of the stream waits here)."""

    def __init__(self) -> None:
        self._items: collections.deque[tuple[Any, int]] = collections.deque()
        self._bytes = 0
        self._reader: asyncio.Future[None] | None = None
        self._writers: collections.deque[asyncio.Future[None]] = collections.deque()

    def _has_room(self, nbytes: int) -> bool:
        return not self._items or (len(self._items) < _OUT_QUEUE and self._bytes + nbytes <= STREAM_WINDOW_BYTES)

    async def put(self, item: Any, nbytes: int = 0) -> None:
        while not self._has_room(nbytes):
            waiter = asyncio.get_running_loop().create_future()
            self._writers.append(waiter)
            try:
                await waiter
            except BaseException:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._writers.remove(waiter)
                if not waiter.cancelled():  # woken, then cancelled: the wakeup goes to the next one
                    self._wake_writer()
                raise
        self._items.append((item, nbytes))
        self._bytes += nbytes
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            self._reader = asyncio.get_running_loop().create_future()
            await self._reader
        item, nbytes = self._items.popleft()
        self._bytes -= nbytes
        self._wake_writer()
        return item

    def _wake_writer(self) -> None:
        """Wake the longest-waiting producer (it rechecks the room, and waits again if there is none)."""
        while self._writers:
            waiter = self._writers.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class _Messages:
    """The stream messages of one request's responses. A decoupled model's responses share all
    but their data (model, id, output names, types, shapes; no parameters): the message without
    its data is built once, and each response's message is a copy of it plus the output bytes,
    several times cheaper than building it field by field. Anything else takes the general path."""

    __slots__ = ("_key", "_templates")

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._templates: dict[bool, service_pb2.ModelStreamInferResponse] = {}

    def message(self, response: InferResponse, final: bool) -> service_pb2.ModelStreamInferResponse:
        if response.parameters or any(tensor.parameters for tensor in response.outputs):
            return _message(response, final)
        key = (response.model_name, response.model_version, response.id,
               tuple((tensor.name, tensor.datatype, tensor.shape) for tensor in response.outputs))
        if key != self._key:
            self._key, self._templates = key, {}
        template = self._templates.get(final)
        if template is None:
            template = self._templates[final] = _message(response, final)
            del template.infer_response.raw_output_contents[:]
        message = service_pb2.ModelStreamInferResponse()
        message.CopyFrom(template)
        message.infer_response.raw_output_contents.extend(output_bytes(tensor) for tensor in response.outputs)
        return message


def _wants_grpc_errors(context: grpc.aio.ServicerContext) -> bool:
    metadata = context.invocation_metadata() or ()
    return any(key == "triton_grpc_error" and str(value).lower() == "true" for key, value in metadata)


def _message(response: InferResponse, final: bool) -> service_pb2.ModelStreamInferResponse:
    encoded = encode_infer_response(response)
    encoded.parameters["triton_final_response"].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=encoded)


def _error_message(request_id: str, error: ServerError) -> service_pb2.ModelStreamInferResponse:
    return service_pb2.ModelStreamInferResponse(
        error_message=error.message, infer_response=service_pb2.ModelInferResponse(id=request_id))


class _StreamSession:
    """The requests of one stream, and the queue their responses are written from."""

    def __init__(self, core: FrontendCore, grpc_errors: bool, forwarded: list[tuple[str, str | bytes]],
                 header_pattern: HeaderPattern | None, tracer: Tracer | None = None) -> None:
        self.core = core
        self._tracer = tracer
        self.grpc_errors = grpc_errors
        self._forwarded, self._header_pattern = forwarded, header_pattern  # the stream's metadata
        # Bounded: a client that does not read stops our reading of the model's responses, which
        # stops returning credits, which makes the model's sender wait (and, past its deadline,
        # fail the request). Memory stays bounded at every step.
        self.out = _WriteQueue()
        self.tasks: set[asyncio.Task] = set()
        self.admission = asyncio.Semaphore(STREAM_MAX_REQUESTS)  # one per running request
        self.streams: set[Any] = set()
        self._previous_in_order: asyncio.Future | None = None

    def start(self, message: service_pb2.ModelInferRequest) -> None:
        order_turn = self._previous_in_order
        done = asyncio.get_running_loop().create_future()
        self._previous_in_order = done
        task = asyncio.ensure_future(self._serve(message, order_turn, done))
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self.admission.release()

    async def next_request(self, requests: AsyncIterator[Any]) -> Any:
        """The client's next request once fewer than `STREAM_MAX_REQUESTS` run (None: the client is
        done sending). Until then the client's stream is not read."""
        await self.admission.acquire()
        try:
            return await anext(requests)
        except StopAsyncIteration:
            self.admission.release()
            return None
        except BaseException:
            self.admission.release()
            raise

    async def _serve(self, message: service_pb2.ModelInferRequest, turn: asyncio.Future | None,
                     done: asyncio.Future) -> None:
        request_id = message.id
        trace = self._start_trace(message.model_name) if self._tracer is not None and self._tracer.active else None
        try:
            request = decode_infer_request(message)
            forward_headers(self._forwarded, request.parameters, self._header_pattern)
            if trace is not None:
                request.trace = trace
                trace.request_start()
            request_id = request.id
            empty_final = bool(request.parameters.pop(EMPTY_FINAL_KEY, False))
            target = self.core.target(request.model_name, request.model_version)  # the one lookup
            stream = await self.core.infer_stream(request, target)
        except ServerError as error:
            forget_traceback(error)  # its frames hold the request; the error lives on in the queue
            await self._wait(turn)
            await self.out.put(("error", request_id, error))
            done.set_result(None)
            if trace is not None:
                trace.finish()
            return
        self.streams.add(stream)
        try:
            decoupled = target.decoupled if target is not None else \
                self.core.is_decoupled(request.model_name, request.model_version)
            if not decoupled:
                await self._wait(turn)  # default-mode models answer in request order
            answered, messages = False, _Messages()
            async for response in stream:
                if decoupled:
                    await self._emit(response, empty_final, request, messages)
                elif answered:   # a default-mode request has one response: what follows the
                    response.release()   # first (a model's second send failing, ...) is dropped
                else:
                    answered = True
                    await self._emit(response, empty_final, request, messages, final=True)
        finally:
            self.streams.discard(stream)
            if not done.done():
                done.set_result(None)
            if trace is not None:  # the last response is queued for the stream's writer
                now = time.monotonic_ns()
                trace.sent(now, now, now)
                trace.finish()

    def _start_trace(self, model: str) -> RequestTrace | None:
        """A trace of one request of the stream (or None); it continues the stream's `traceparent`."""
        assert self._tracer is not None
        now = time.monotonic_ns()
        parent = next((value for key, value in self._forwarded if key == "traceparent"), None)
        trace = self._tracer.start(model, "GRPC", parent if isinstance(parent, str) else None)
        if trace is not None:
            trace.received(now, now)
        return trace

    @staticmethod
    async def _wait(turn: asyncio.Future | None) -> None:
        if turn is not None:
            await asyncio.shield(turn)

    async def _emit(self, response: InferResponse, empty_final: bool, request: InferRequest, messages: _Messages,
                    final: bool = False) -> None:
        """Queue `response` for the client (`final`: it ends its request whatever its flags say)."""
        try:  # encoding copies the outputs out of the arena: release before waiting for room
            if response.error is not None:
                item: tuple[Any, ...] | None = ("error", response.id or request.id, response.error)
            elif response.flags_only:
                item = ("message", _message(response, True)) if empty_final else None
            else:
                item = ("message", messages.message(response, final or response.final))
        finally:
            response.release()
        if item is not None:
            await self.out.put(item, item[1].ByteSize() if item[0] == "message" else 0)

    def cancel_all(self) -> None:
        for stream in list(self.streams):
            stream.cancel()
        for task in list(self.tasks):
            task.cancel()


async def stream_infer(core: FrontendCore, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext,
                       header_pattern: HeaderPattern | None = None, tracer: Tracer | None = None) -> None:
    """Serve one `ModelStreamInfer` call, writing its responses with `context.write`."""
    metadata = list(context.invocation_metadata() or ())
    session = _StreamSession(core, _wants_grpc_errors(context), metadata, header_pattern, tracer)
    link = client_link.open_link()  # pystub sequences: sequences left open on this stream end with it

    async def read() -> None:
        requests = aiter(request_iterator)
        try:
            while (message := await session.next_request(requests)) is not None:
                session.start(message)
            await asyncio.gather(*list(session.tasks), return_exceptions=True)
        finally:
            await session.out.put((_DONE,))

    reader = asyncio.ensure_future(read())
    late = delay_hooks().grpc_complete_s  # Triton's test hook: each response written this late
    try:
        while True:
            item = await session.out.get()
            if item[0] is _DONE:
                break
            if late:
                await asyncio.sleep(late)
            if item[0] == "error":
                _, request_id, error = item
                if session.grpc_errors:
                    await context.abort(grpc_code(error.status), grpc_details(error.message))
                await context.write(_error_message(request_id, error))
            else:
                await context.write(item[1])
    finally:
        # The client cancelled or closed the stream, or we are done: nothing may keep running.
        link.close()
        session.cancel_all()
        reader.cancel()
        await asyncio.gather(reader, *list(session.tasks), return_exceptions=True)
