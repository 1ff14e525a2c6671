"""Pipelined workers that pull: each instance runs `PIPELINE_DEPTH` workers, and a free worker takes
the request its instance should run next (the oldest, or what a routing policy picks for it:
scheduling.multiplex). The default scheduler pushes instead (scheduling.default); a policy that
routes each request to the instance best suited for it pulls, so no instance idles while work it
may take is waiting.

While the stub executes one request the next one's inputs are already in its arena and its
EXECUTE frame in its queue: the IPC round trip overlaps the model's compute instead of adding to
it. A worker is free again when the model's `execute` returns, not when the request's last
response arrives (a decoupled model keeps answering while the next request runs). A slot is what
limits an instance to `PIPELINE_DEPTH` executes: a worker that took work waits for one, in order.

    schedule ──▶ queue ──▶ worker of instance I: _next_work(I) ──▶ slot ──▶ _execute ──▶ stream
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from typing import TypeVar

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.response_stream import Outcome, ResponseStream
from pystub_backend.backend.scheduling.base import Instance, WorkerScheduler
from pystub_backend.backend.telemetry.statistics import BACKEND, CANCELED, OTHER, ModelStatistics
from pystub_backend.ipc.status import Status

__all__ = ["PipelinedScheduler", "PIPELINE_DEPTH", "Work"]

PIPELINE_DEPTH = 2

log = logging.getLogger("pystub.scheduler")


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


_Unit = TypeVar("_Unit", bound=Instance)  # the instances' own type (a policy may wrap them)


class PipelinedScheduler(WorkerScheduler[_Unit, Work]):
    _runs_in_own_task = False  # `_deliver` hands the caller its stream once the request is sent

    def __init__(self, instances: Sequence[_Unit], stats: ModelStatistics) -> None:
        super().__init__(stats)
        self._instances = instances
        self._queue: asyncio.Queue[Work] = asyncio.Queue()
        self._busy: dict[Instance, int] = {}  # executes running per instance, from either path
        self._slot_waiters: dict[Instance, collections.deque[asyncio.Future[None]]] = {}
        self._holding = 0  # requests workers took and hold while they wait for a slot

    @property
    def queued(self) -> int:
        return self._queue.qsize() + self._holding  # taken by a worker that waits for a slot: still queued

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
            elif not work.future.cancelled() and work.future.done() \
                    and isinstance(delivered := work.future.result(), ResponseStream):
                delivered.cancel()  # delivered as the caller was cancelled: nobody will read or cancel it
            work.future.cancel()
            raise
        if isinstance(result, ServerError):
            raise result
        return result

    # -- the policy: the next free pipeline slot of any instance takes the oldest request ----------
    def _units(self) -> Sequence[_Unit]:
        return [instance for instance in self._instances for _ in range(PIPELINE_DEPTH)]

    def _instance_of(self, unit: _Unit) -> Instance:
        return unit

    async def _take(self, unit: _Unit) -> Work | None:
        work = await self._next_work(unit)
        return None if work.future.done() else work

    async def _next_work(self, instance: _Unit) -> Work:
        """The work a free worker of `instance` runs next: the oldest. A hook for schedulers that
        route (multiplex.MultiplexScheduler picks work whose sub-model the instance holds)."""
        return await self._queue.get()

    def _give_back(self, unit: _Unit, work: Work) -> None:
        self._queue.put_nowait(work)  # another instance takes it

    async def _run(self, unit: _Unit, work: Work) -> None:
        try:
            runnable = await self._take_slot(unit)
        except asyncio.CancelledError:  # the scheduler stops: the work it held is failed like queued work
            if not work.future.done():
                self._record_failure(work.enqueued_ns, OTHER)
                work.future.set_result(self._stopped or ServerError("the scheduler stopped", Status.UNAVAILABLE))
            raise
        if not runnable:
            self._give_back(unit, work)
            return
        try:
            work.started = True
            (result,) = await self._execute(unit, [work], lambda sent: self._deliver(work, sent[0]))
            self._deliver(work, result)
        finally:
            self._release_slot(unit)

    # -- pipeline slots -------------------------------------------------------
    async def _take_slot(self, instance: Instance) -> bool:
        """One of the instance's PIPELINE_DEPTH slots for a worker, in the order workers asked;
        False (no slot kept) when the instance cannot run the work any more once it has one."""
        if self._busy.get(instance, 0) < PIPELINE_DEPTH and not self._slot_waiters.get(instance):
            self._busy[instance] = self._busy.get(instance, 0) + 1
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._slot_waiters.setdefault(instance, collections.deque()).append(waiter)
            self._holding += 1
            try:
                await waiter  # `_release_slot` hands a slot over: the busy count stays
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release_slot(instance)  # handed over just as the worker was cancelled
                raise
            finally:
                self._holding -= 1
        if self._can_run(instance):
            return True
        self._release_slot(instance)
        return False

    def _release_slot(self, instance: Instance) -> None:
        waiters = self._slot_waiters.get(instance)
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # a cancelled waiter is skipped
                waiter.set_result(None)
                return
        self._busy[instance] -= 1

    @staticmethod
    def _deliver(work: Work, result: Outcome) -> None:
        """Hand the stream to the caller as soon as the request is on its way (so a client that
        goes away cancels it while the model runs); cancel it when nobody waits any more."""
        if not work.future.done():
            work.future.set_result(result)
        elif not isinstance(result, ServerError) and result is not work.delivered:
            result.cancel()
        work.delivered = result

    def _instance_gone(self, unit: _Unit) -> None:
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
