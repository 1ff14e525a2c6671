"""A stand-in for ModelInstance as the schedulers see it (`submit`, `gate`, `on_change`, readiness),
for the scheduling unit tests: every batch gets its streams at once, as from a real exchange, and
is answered later on the event loop, as a stub answers (after `hold` is set, while a test holds
it), then its `execute` ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.supervision.exchange import ExecuteEnd, Submission
from pystub_backend.backend.telemetry.statistics import BatchTiming
from pystub_backend.ipc.status import Status


class FakeInstance:
    """`error_for(request)` is the error response a request gets (None: success); `dead` refuses
    every batch before the model; `fail_batch` fails every stream of a batch (as when `execute`
    raises); `alive` False makes it unhealthy until it is set again (`set_alive`)."""

    stub = None  # the sequence batcher asks which stub holds a sequence's state
    gate = None
    held = False  # no BLS call holds an execute of it

    def __init__(self, name: str = "fake_0") -> None:
        self.name = name
        self.alive = True
        self.dead = False
        self.fail_batch = False
        self.hold: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.batches: list[list[str]] = []
        self._ready = asyncio.Event()
        self._ready.set()
        self._listeners: list[Callable[[], None]] = []
        self._answering: set[asyncio.Task[None]] = set()

    @property
    def healthy(self) -> bool:
        return self.alive

    @property
    def usable(self) -> bool:
        return self.alive

    def unhealthy_error(self) -> ServerError:
        return ServerError(f"Stub process '{self.name}' is not healthy.", Status.UNAVAILABLE)

    async def wait_ready(self) -> bool:
        while not self.alive:
            self._ready.clear()
            await self._ready.wait()
        return True

    def on_change(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def set_alive(self, alive: bool) -> None:
        self.alive = alive
        if alive:
            self._ready.set()
        for callback in self._listeners:
            callback()

    def error_for(self, request: InferRequest) -> ServerError | None:
        return None

    def submit(self, requests: list[InferRequest], *, wait: bool) -> Submission | None:
        if self.dead or not self.alive:
            return Submission([self.unhealthy_error()] * len(requests), BatchTiming(), None) if wait else None
        self.batches.append([request.id for request in requests])
        self.started.set()
        streams = [ResponseStream(request.id, request.model_name, lambda: None) for request in requests]
        end = ExecuteEnd()
        task = asyncio.ensure_future(self._answer(requests, streams, end))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        return Submission(list(streams), BatchTiming(10, 20, 30), end)

    async def _answer(self, requests: list[InferRequest], streams: list[ResponseStream], end: ExecuteEnd) -> None:
        if self.hold is not None:
            await self.hold.wait()
        for request, stream in zip(requests, streams, strict=True):
            if self.fail_batch:
                stream.fail(ServerError("Failed to process the request(s)", Status.INTERNAL))
            else:
                self.answer(request, stream)
        end.end()

    def answer(self, request: InferRequest, stream: ResponseStream) -> None:
        """The model's answer to one request (by default its response, with `error_for`'s error)."""
        stream.put(InferResponse(request.model_name, "", request.id, error=self.error_for(request)), True)
