"""The default scheduler: one queue per model version, the next free instance takes the next request.

Each instance runs `PIPELINE_DEPTH` workers, so while the stub executes one request the next one's
inputs are already in its arena and its EXECUTE frame in its queue: the IPC round trip overlaps
the model's compute instead of adding to it.

A worker is free again when the model's `execute` returns, not when the request's last response
arrives: a decoupled model (or an `async def execute`) keeps answering while the next request runs.
The caller gets the request's ResponseStream; `schedule` waits for its single answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.scheduling.base import Instance, Outcome, Scheduler
from pystub_backend.backend.supervision.response_stream import ResponseStream
from pystub_backend.backend.telemetry.statistics import BACKEND, CANCELED, OTHER, ModelStatistics

__all__ = ["DefaultScheduler", "PIPELINE_DEPTH", "Work"]

PIPELINE_DEPTH = 2


class Work:
    """A queued request and the future its caller awaits (its stream, or why it never ran)."""

    __slots__ = ("request", "batch_size", "future", "enqueued_ns", "delivered", "started")

    def __init__(self, request: InferRequest, batch_size: int, future: asyncio.Future[Outcome]) -> None:
        self.request = request
        self.batch_size = batch_size
        self.future = future
        self.enqueued_ns = time.monotonic_ns()
        self.delivered: Outcome | None = None
        self.started = False  # handed to an instance: its statistics are recorded when it ends


class DefaultScheduler(Scheduler[Instance, Work]):
    _runs_in_own_task = False  # `_deliver` hands the caller its stream once the request is sent
    def __init__(self, instances: Sequence[Instance], stats: ModelStatistics) -> None:
        super().__init__(stats)
        self._instances = instances
        self._queue: asyncio.Queue[Work] = asyncio.Queue()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def schedule(self, request: InferRequest, batch_size: int) -> InferResponse:
        """The request's InferResponse. Raises ServerError."""
        stream = await self.schedule_stream(request, batch_size)
        try:
            return await stream.single()
        except asyncio.CancelledError:
            stream.cancel()  # the client went away: the model sees is_cancelled()
            raise

    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """The request's ResponseStream, once its execute has started. Raises ServerError."""
        if self._stopped is not None:
            raise self._stopped
        work = Work(request, batch_size, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(work)
        try:
            result = await work.future
        except asyncio.CancelledError:
            # Cancelled while queued (awaiting it, the task's cancel cancels the future too).
            if not work.started and (work.future.cancelled() or not work.future.done()):
                self._record_failure(work.enqueued_ns, CANCELED)
            work.future.cancel()
            raise
        if isinstance(result, ServerError):
            raise result
        return result

    # -- the policy: the next free pipeline slot of any instance takes the oldest request ----------
    def _units(self) -> Sequence[Instance]:
        return [instance for instance in self._instances for _ in range(PIPELINE_DEPTH)]

    def _instance_of(self, unit: Instance) -> Instance:
        return unit

    async def _take(self, unit: Instance) -> Work | None:
        work = await self._next_work(unit)
        return None if work.future.done() else work

    async def _next_work(self, instance: Instance) -> Work:
        """The work a free worker of `instance` runs next: the oldest. A hook for schedulers that
        route (multiplex.MultiplexScheduler picks work whose sub-model the instance holds)."""
        return await self._queue.get()

    def _give_back(self, unit: Instance, work: Work) -> None:
        self._queue.put_nowait(work)  # another instance takes it

    async def _run(self, unit: Instance, work: Work) -> None:
        work.started = True
        (result,) = await self._execute(unit, [work], lambda sent: self._deliver(work, sent[0]))
        self._deliver(work, result)

    @staticmethod
    def _deliver(work: Work, result: Outcome) -> None:
        """Hand the stream to the caller as soon as the request is on its way (so a client that
        goes away cancels it while the model runs); cancel it when nobody waits any more."""
        if not work.future.done():
            work.future.set_result(result)
        elif not isinstance(result, ServerError) and result is not work.delivered:
            result.cancel()
        work.delivered = result

    def _instance_gone(self, unit: Instance) -> None:
        if not any(other.usable for other in self._instances):
            self._fail_all_queued(unit.unhealthy_error(), BACKEND)

    def fail_queued(self, error: ServerError) -> int:
        """Fail every request still waiting in the queue; running ones go on. Returns how many."""
        return self._fail_all_queued(error, OTHER)

    def _fail_all_queued(self, error: ServerError, reason: str) -> int:
        failed = 0
        while not self._queue.empty():
            work = self._queue.get_nowait()
            if not work.future.done():
                self._record_failure(work.enqueued_ns, reason)
                work.future.set_result(error)
                failed += 1
        return failed
