"""What every scheduler shares: the worker loop, failure accounting and statistics.

    start() ──▶ one worker per unit (an instance, a pipeline slot of one, a sequence lane)
    worker:  while instance.wait_ready():        READY, or back from a restart (False: FAILED/stopped)
                 work = await _take(unit)         the policy: which request(s) this unit runs next
                 unit can't run it now?  ──▶ _give_back(unit, work)   (died meanwhile, held by BLS)
                 _run(unit, work) in a task of its own, so stopping the worker never cuts it in half
             _instance_gone(unit)                 the policy: what happens to work nobody can run

Statistics are counted here and only here (`telemetry.statistics` says what each counter means):
an execution when a batch reached the model; per request, when its stream ends, an inference
unless the stream was failed (batch failure, stub death: the model did not answer it), then a
success, or a failure with the reason its error gives; a request that never reached the model
fails with the reason its scheduler names (REJECTED, CANCELED, BACKEND, OTHER).
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.supervision.response_stream import ResponseStream
from pystub_backend.backend.telemetry.statistics import BatchTiming, ModelStatistics, reason_for
from pystub_backend.ipc.status import Status

__all__ = ["Scheduler", "Outcome", "Instance"]

log = logging.getLogger("pystub.scheduler")

Outcome = ResponseStream | ServerError  # what executing one request gives: its stream, or why it never ran


class Instance(Protocol):
    """What a scheduler uses of a model instance (supervision.instance.ModelInstance, or a wrapper
    such as multiplex.MultiplexedInstance)."""

    name: str

    @property
    def healthy(self) -> bool: ...

    @property
    def usable(self) -> bool: ...

    def unhealthy_error(self) -> ServerError: ...

    async def wait_ready(self) -> bool: ...

    async def execute_streams(self, requests: list[InferRequest],
                              on_sent: Callable[[list[Outcome]], None] | None = None
                              ) -> tuple[list[Outcome], BatchTiming]: ...


_Unit = TypeVar("_Unit")
_Work = TypeVar("_Work")


class Scheduler(abc.ABC, Generic[_Unit, _Work]):
    """The base of every scheduler. A subclass keeps only its policy: `_units`, `_instance_of`,
    `_take`, `_give_back`, `_run`, `_instance_gone`, `fail_queued`, `queued`, `schedule_stream`."""

    def __init__(self, stats: ModelStatistics) -> None:
        self._stats = stats
        self._workers: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[None]] = set()
        self._stopped: ServerError | None = None

    # -- the face every scheduler has -------------------------------------------------------------
    def start(self) -> None:
        for unit in self._units():
            self._workers.append(asyncio.ensure_future(self._work(unit)))

    @property
    @abc.abstractmethod
    def queued(self) -> int:
        """Requests waiting for an instance."""

    @abc.abstractmethod
    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """The request's ResponseStream once its execute has started. Raises ServerError."""

    async def schedule(self, request: InferRequest, batch_size: int) -> InferResponse:
        """The request's single InferResponse. Raises ServerError."""
        stream = await self.schedule_stream(request, batch_size)
        try:
            return await stream.single()
        except asyncio.CancelledError:
            stream.cancel()  # the client went away: the model sees is_cancelled()
            raise

    @abc.abstractmethod
    def fail_queued(self, error: ServerError) -> int:
        """Answer every queued request with `error` (running ones go on); returns how many."""

    async def stop(self, reason: str) -> None:
        """Fail what is still queued with `reason` (UNAVAILABLE) and stop the workers."""
        self._stopped = ServerError(reason, Status.UNAVAILABLE)
        failed = self.fail_queued(self._stopped)
        if failed:
            log.info("%s failed %d queued request(s)", reason, failed)
        await self._before_workers_stop()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()

    # -- the policy ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def _units(self) -> Sequence[_Unit]:
        """What gets a worker each."""

    @abc.abstractmethod
    def _instance_of(self, unit: _Unit) -> Instance:
        """The ModelInstance a unit runs its work on."""

    @abc.abstractmethod
    async def _take(self, unit: _Unit) -> _Work | None:
        """The work the unit runs next (None: nothing after all, ask again)."""

    @abc.abstractmethod
    def _give_back(self, unit: _Unit, work: _Work) -> None:
        """Work taken by a unit that cannot run it now goes back to wait."""

    @abc.abstractmethod
    async def _run(self, unit: _Unit, work: _Work) -> None:
        """Execute the work and hand each caller its outcome."""

    @abc.abstractmethod
    def _instance_gone(self, unit: _Unit) -> None:
        """The unit's instance is FAILED for good (or the scheduler stopped)."""

    def _can_run(self, instance: Instance) -> bool:
        """Whether a unit may run the work it took: its instance did not die while it waited, and
        no execute on it waits for a BLS call (the work could only queue behind it)."""
        return bool(instance.healthy) and not getattr(instance, "held", False)

    async def _before_workers_stop(self) -> None:
        """A hook of `stop`, after the queue failed and before the workers are cancelled."""

    # -- the worker loop -------------------------------------------------------------------------------
    async def _work(self, unit: _Unit) -> None:
        # A worker serves while its instance is READY, waits while it restarts, and ends when it
        # is FAILED or stopped.
        instance = self._instance_of(unit)
        while await instance.wait_ready():
            work = await self._take(unit)
            if work is None:
                continue
            if not self._can_run(instance):
                self._give_back(unit, work)
                continue
            task = asyncio.ensure_future(self._run(unit, work))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            await asyncio.shield(task)
        self._instance_gone(unit)

    async def _execute(self, instance: Instance, requests: list[InferRequest],
                       on_sent: Callable[[list[Outcome]], None] | None = None) -> tuple[list[Outcome], BatchTiming]:
        """Send a batch to the instance: one outcome per request. Never raises but for cancellation."""
        try:
            results, timing = await instance.execute_streams(requests, on_sent)
        except Exception as exc:  # a bug below us must fail these requests, not end the worker
            log.exception("scheduler: executing a batch of %d on '%s' failed", len(requests),
                          getattr(instance, "name", "?"))
            return [ServerError(f"failed to execute the request: {exc}", Status.INTERNAL)] * len(requests), \
                BatchTiming()
        return list(results), timing

    # -- statistics ----------------------------------------------------------------------------------
    def _record_execution(self, batch_size: int, timing: BatchTiming) -> None:
        """A batch of `batch_size` reached the model (requests that never did are no execution)."""
        if batch_size:
            self._stats.record_execution(batch_size, timing)

    def _record_failure(self, enqueued_ns: int, reason: str) -> None:
        """A request failed with `reason` before the model answered it."""
        self._stats.record_failure(time.monotonic_ns() - enqueued_ns, reason)

    def _follow(self, stream: ResponseStream, batch_size: int, enqueued_ns: int, started_ns: int,
                timing: BatchTiming) -> None:
        """Count the request when its stream ends."""
        stream.when_final(lambda done: self._record_final(done, batch_size, enqueued_ns, started_ns, timing))

    def _record_final(self, stream: ResponseStream, batch_size: int, enqueued_ns: int, started_ns: int,
                      timing: BatchTiming) -> None:
        finished = time.monotonic_ns()
        if not getattr(stream, "failed", False):  # the model answered it (an error response too)
            self._stats.record_inferences(batch_size)
        if stream.error is not None:
            self._stats.record_failure(finished - enqueued_ns, reason_for(stream.error))
        else:
            self._stats.record_success(batch_size, finished - enqueued_ns, started_ns - enqueued_ns, timing)
