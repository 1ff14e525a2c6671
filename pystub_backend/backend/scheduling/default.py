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
import logging
import time
from typing import Any

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest
from pystub_backend.backend.supervision.response_stream import ResponseStream
from pystub_backend.backend.telemetry.statistics import (
    BACKEND,
    CANCELED,
    OTHER,
    BatchTiming,
    ModelStatistics,
    reason_for,
)
from pystub_backend.ipc.status import Status

__all__ = ["DefaultScheduler", "PIPELINE_DEPTH"]

PIPELINE_DEPTH = 2
log = logging.getLogger("pystub.scheduler")


class _Work:
    __slots__ = ("request", "batch_size", "future", "enqueued_ns", "delivered", "started")

    def __init__(self, request: InferRequest, batch_size: int, future: asyncio.Future) -> None:
        self.request = request
        self.batch_size = batch_size
        self.future = future
        self.enqueued_ns = time.monotonic_ns()
        self.delivered: Any = None
        self.started = False  # handed to an instance: its statistics are recorded when it ends


class DefaultScheduler:
    def __init__(self, instances: list[Any], stats: ModelStatistics) -> None:
        self._instances = instances
        self._stats = stats
        self._queue: asyncio.Queue[_Work] = asyncio.Queue()
        self._workers: list[asyncio.Task] = []
        self._stopped: ServerError | None = None

    def start(self) -> None:
        for instance in self._instances:
            for _ in range(PIPELINE_DEPTH):
                self._workers.append(asyncio.ensure_future(self._work(instance)))

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def schedule(self, request: InferRequest, batch_size: int) -> Any:
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
        work = _Work(request, batch_size, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(work)
        try:
            result = await work.future
        except asyncio.CancelledError:
            # Cancelled while queued (awaiting it, the task's cancel cancels the future too).
            if not work.started and (work.future.cancelled() or not work.future.done()):
                self._stats.record_failure(time.monotonic_ns() - work.enqueued_ns, CANCELED)
            work.future.cancel()
            raise
        if isinstance(result, ServerError):
            raise result
        return result

    async def _work(self, instance: Any) -> None:
        # A worker serves while its instance is READY, waits while it restarts, and ends when it
        # is FAILED or stopped.
        while await instance.wait_ready():
            work = await self._next_work(instance)
            if work.future.done():
                continue
            # Died while we waited, or an execute on it now waits for a BLS call (the work could only
            # queue behind it): leave the work to another instance.
            if not instance.healthy or getattr(instance, "held", False):
                self._queue.put_nowait(work)
                continue
            await self._run(instance, work)
        self._fail_queue_if_no_instance_left(instance)

    async def _next_work(self, instance: Any) -> _Work:
        """The work a free worker of `instance` runs next: the oldest. A hook for schedulers that
        route (multiplex_router.MultiplexScheduler picks work whose sub-model the instance holds)."""
        return await self._queue.get()

    async def _run(self, instance: Any, work: _Work) -> None:
        work.started = True
        started = time.monotonic_ns()
        try:
            (result,), timing = await instance.execute_streams([work.request],
                                                               lambda sent: self._deliver(work, sent[0]))
        except Exception as exc:  # a bug below us must fail this request, not end the worker
            log.exception("scheduler: executing a request on '%s' failed", getattr(instance, "name", "?"))
            result, timing = ServerError(f"failed to execute the request: {exc}", Status.INTERNAL), BatchTiming()
        if isinstance(result, ServerError):  # it never reached the model (stub gone, arena full)
            self._stats.record_failure(time.monotonic_ns() - work.enqueued_ns, BACKEND)
        else:
            self._stats.record_execution(work.batch_size, timing)
            result.when_final(lambda stream: self._record(stream, work, started, timing))
        self._deliver(work, result)

    @staticmethod
    def _deliver(work: _Work, result: Any) -> None:
        """Hand the stream to the caller as soon as the request is on its way (so a client that
        goes away cancels it while the model runs); cancel it when nobody waits any more."""
        if not work.future.done():
            work.future.set_result(result)
        elif not isinstance(result, ServerError) and result is not work.delivered:
            result.cancel()
        work.delivered = result

    def _record(self, stream: ResponseStream, work: _Work, started: int, timing: BatchTiming) -> None:
        finished = time.monotonic_ns()
        if stream.error is not None:
            self._stats.record_failure(finished - work.enqueued_ns, reason_for(stream.error))
        else:
            self._stats.record_success(work.batch_size, finished - work.enqueued_ns, started - work.enqueued_ns,
                                       timing)

    def _fail_queue_if_no_instance_left(self, instance: Any) -> None:
        if any(other.usable for other in self._instances):
            return
        error = instance.unhealthy_error()
        while not self._queue.empty():
            work = self._queue.get_nowait()
            if not work.future.done():
                self._stats.record_failure(time.monotonic_ns() - work.enqueued_ns, BACKEND)
                work.future.set_result(error)

    def fail_queued(self, error: ServerError) -> int:
        """Fail every request still waiting in the queue; running ones go on. Returns how many."""
        failed = 0
        while not self._queue.empty():
            work = self._queue.get_nowait()
            if not work.future.done():
                self._stats.record_failure(time.monotonic_ns() - work.enqueued_ns, OTHER)
                work.future.set_result(error)
                failed += 1
        return failed

    async def stop(self, reason: str) -> None:
        """Fail what is still queued with `reason` and stop the workers."""
        self._stopped = ServerError(reason, Status.UNAVAILABLE)
        self.fail_queued(self._stopped)
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
