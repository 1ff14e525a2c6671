"""The default scheduler: one queue per model version, the next free instance takes the next request.

Each instance runs `PIPELINE_DEPTH` workers, so while the stub executes one request the next one's
inputs are already in its arena and its EXECUTE frame in its queue: the IPC round trip overlaps
the model's compute instead of adding to it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from backend.errors import ServerError
from backend.inference import InferRequest
from backend.statistics import ModelStatistics
from ipc.status import Status

__all__ = ["DefaultScheduler", "PIPELINE_DEPTH"]

PIPELINE_DEPTH = 2


class _Work:
    __slots__ = ("request", "batch_size", "future", "enqueued_ns")

    def __init__(self, request: InferRequest, batch_size: int, future: asyncio.Future) -> None:
        self.request = request
        self.batch_size = batch_size
        self.future = future
        self.enqueued_ns = time.monotonic_ns()


class DefaultScheduler:
    def __init__(self, instances: list[Any], stats: ModelStatistics,
                 is_available: Callable[[Any], bool] = lambda instance: instance.alive) -> None:
        self._instances = instances
        self._stats = stats
        self._is_available = is_available
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
        if self._stopped is not None:
            raise self._stopped
        work = _Work(request, batch_size, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(work)
        result = await work.future
        if isinstance(result, ServerError):
            raise result
        return result

    async def _work(self, instance: Any) -> None:
        while True:
            work = await self._queue.get()
            if work.future.done():
                continue
            started = time.monotonic_ns()
            (result,), timing = await instance.execute_timed([work.request])
            finished = time.monotonic_ns()
            self._stats.record_execution(work.batch_size, timing)
            if isinstance(result, ServerError):
                self._stats.record_failure(finished - work.enqueued_ns)
            else:
                self._stats.record_success(work.batch_size, finished - work.enqueued_ns,
                                           started - work.enqueued_ns, timing)
            if not work.future.done():
                work.future.set_result(result)
            elif not isinstance(result, ServerError):
                result.release()

    async def stop(self, reason: str) -> None:
        """Fail what is still queued with `reason` and stop the workers."""
        self._stopped = ServerError(reason, Status.UNAVAILABLE)
        while not self._queue.empty():
            work = self._queue.get_nowait()
            if not work.future.done():
                work.future.set_result(self._stopped)
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
