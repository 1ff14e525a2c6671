"""The responses of one request, as they arrive from its stub: zero, one or many, in order, the
last one flagged final (decoupled models), or exactly one (default models).

A consumer iterates (`async for response in stream`) or takes the single answer (`single()`, or
`answer(future)`: the future gets it, with no task woken before it is in); it calls
`response.release()` on each response once encoded, which frees its arena bytes and returns a send
credit to the stub. `cancel()` tells the stub (the model sees `is_cancelled()`) and drops
what is still queued. The buffer is bounded by the stub's credits: the stub may have at most
`CREDIT_WINDOW` unreleased data responses per request; after that its sender waits (with a deadline).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferResponse
from pystub_backend.ipc.status import Status

__all__ = ["ResponseStream", "Outcome", "CREDIT_WINDOW", "error_response"]

CREDIT_WINDOW = 64


class ResponseStream:
    __slots__ = ("request_id", "model_name", "model_version", "_on_cancel", "_queue", "_wakeup", "finished",
                 "cancelled", "_dropping", "_on_final", "error", "failed", "on_put", "_answer", "__weakref__")

    def __init__(self, request_id: str, model_name: str, on_cancel: Callable[[], None]) -> None:
        self.request_id = request_id
        self.model_name = model_name
        self.model_version = ""
        self._on_cancel = on_cancel
        self._queue: collections.deque[InferResponse] = collections.deque()
        self._wakeup: asyncio.Future | None = None
        self.finished = False
        self.cancelled = False
        self._dropping = False  # cancelled, and what still arrives is released unseen
        self._on_final: list[Callable[[ResponseStream], None]] = []
        self.error: ServerError | None = None  # the last error response, for statistics
        self.failed = False  # ended by `fail`: the model never answered it (not an inference)
        # Sees every response before a consumer does (implicit state takes the state outputs out).
        self.on_put: Callable[[InferResponse], None] | None = None
        self._answer: asyncio.Future[InferResponse] | None = None  # see answer()

    # -- producer side (the stub's frames) --------------------------------------------------------
    def put(self, response: InferResponse, final: bool) -> None:
        if self.finished:
            response.release()
            return
        if response.error is not None:
            self.error = response.error
        response.final = final
        response.model_version = self.model_version or response.model_version
        if self.on_put is not None:
            self.on_put(response)
        if self._dropping:
            response.release()
        elif self._answer is not None:
            self._keep_for_answer(response)
        else:
            self._queue.append(response)
        if final:
            if self._answer is not None:
                self._resolve_answer()
            self._finish()
        self._wake()

    def fail(self, error: ServerError) -> None:
        """End the stream with an error response (stub death, batch failure)."""
        if not self.finished:
            self.failed = True
            self.put(InferResponse(self.model_name, "", self.request_id, error=error, final=True), final=True)

    def _finish(self) -> None:
        self.finished = True
        callbacks, self._on_final = self._on_final, []
        for callback in callbacks:
            callback(self)

    def when_final(self, callback: Callable[[ResponseStream], None]) -> None:
        """Call `callback(stream)` once the final response is in (now, if it already is)."""
        if self.finished:
            callback(self)
        else:
            self._on_final.append(callback)

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    # -- consumer side ----------------------------------------------------------------------------
    async def next(self) -> InferResponse | None:
        """The next response, or None once the final one has been taken."""
        while not self._queue:
            if self.finished:
                return None
            self._wakeup = asyncio.get_running_loop().create_future()
            await self._wakeup
        return self._queue.popleft()

    def take_ready(self) -> list[InferResponse]:
        """The responses queued now, without waiting: a consumer that writes several per wakeup
        (one socket write for all the events a model sent while the last write was in flight)."""
        ready = list(self._queue)
        self._queue.clear()
        return ready

    def __aiter__(self) -> AsyncIterator[InferResponse]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[InferResponse]:
        while True:
            response = await self.next()
            if response is None:
                return
            yield response

    def answer(self, future: asyncio.Future[InferResponse]) -> None:
        """Resolve `future` with the one response of a default-mode request once the final one is
        in (an error response as its exception; a final flags-only answer as an empty response;
        extra data responses are released), as `single()` returns it. Nothing else may consume
        the stream. A future cancelled meanwhile (its caller is gone) gets nothing: the response
        is released."""
        self._answer = future
        queued = self._queue  # what arrived before the caller asked: the first is the answer
        while len(queued) > 1:
            queued.pop().release()
        if self.finished:
            self._resolve_answer()

    def _keep_for_answer(self, response: InferResponse) -> None:
        if self._queue:
            response.release()  # the first one is the answer
        else:
            self._queue.append(response)

    def _resolve_answer(self) -> None:
        future = self._answer
        assert future is not None
        first = self._queue.popleft() if self._queue else InferResponse(self.model_name, "", self.request_id)
        if future.done():
            first.release()
        elif first.error is not None:
            first.release()
            future.set_exception(first.error)
        else:
            future.set_result(first)

    async def single(self) -> InferResponse:
        """The one response of a default-mode request. Raises ServerError for an error response.

        A final flags-only answer yields an empty response; extra data responses are released.
        """
        first: InferResponse | None = None
        # `next()` directly, not `async for`: no async generator per request on the common path
        while (response := await self.next()) is not None:
            if first is None:
                first = response
            else:
                response.release()
        if first is None:
            first = InferResponse(self.model_name, "", self.request_id)
        if first.error is not None:
            first.release()
            raise first.error
        return first

    def cancel(self, keep_responses: bool = False) -> None:
        """The client is gone or cancelled: tell the stub, drop what is queued. With
        `keep_responses` (a BLS caller's `iterator.cancel()`) the consumer still gets what the stub
        sends until its final response, as on Triton."""
        if self.finished:
            return
        if not keep_responses:
            self._dropping = True
            while self._queue:
                self._queue.popleft().release()
        if not self.cancelled:
            self.cancelled = True
            self._on_cancel()
        self._wake()


def error_response(model_name: str, request_id: str, code: int, text: str) -> InferResponse:
    return InferResponse(model_name, "", request_id, error=ServerError(text, Status.coerce(code)))


# What sending one request to a model gives: its stream of responses, or why it never reached the model.
Outcome = ResponseStream | ServerError
