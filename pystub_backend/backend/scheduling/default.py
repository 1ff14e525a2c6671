"""The default scheduler: one queue per model version, the next free instance takes the next request.

Each instance runs `PIPELINE_DEPTH` workers, so while the stub executes one request the next one's
inputs are already in its arena and its EXECUTE frame in its queue: the IPC round trip overlaps
the model's compute instead of adding to it.

A worker is free again when the model's `execute` returns, not when the request's last response
arrives: a decoupled model (or an `async def execute`) keeps answering while the next request runs.
The caller gets the request's ResponseStream; `schedule` waits for its single answer.

The direct send: when nothing is queued and an instance has a free pipeline slot, the caller's
own task places the request and sends its EXECUTE (`ModelInstance.start_streams`) and gets its
stream at once; the slot is freed and the request counted from the callback of its `execute`'s
end. No worker wakes up and no future is handed back: two loop hops less per request. A slot is
what limits an instance to `PIPELINE_DEPTH` executes whichever path sent them: a worker that took
work waits for one (in order), and while any worker waits, callers queue instead of overtaking.

    schedule ──queue empty, slot free?──yes──▶ start_streams ──▶ stream (slot freed at EXECUTE_DONE)
                                      └─no──▶ queue ──▶ worker: slot ──▶ _execute ──▶ stream
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from typing import Protocol, cast

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.scheduling.base import Instance, Outcome, Scheduler
from pystub_backend.backend.telemetry.statistics import BACKEND, CANCELED, OTHER, BatchTiming, ModelStatistics
from pystub_backend.ipc.status import Status

__all__ = ["DefaultScheduler", "PIPELINE_DEPTH", "Work"]

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


class _SendsNow(Instance, Protocol):
    """An instance a caller may send to itself (supervision.instance.ModelInstance)."""

    def start_streams(self, requests: list[InferRequest]
                      ) -> tuple[list[Outcome], BatchTiming, asyncio.Future[None] | None] | None: ...

    def counted(self, streams: list[Outcome]) -> None: ...


def _sends_now(instance: Instance) -> bool:
    # Asked of the class: a wrapper that forwards attributes (the rate limiter's, which must see
    # every execute) does not have the method itself.
    return callable(getattr(type(instance), "start_streams", None))


class _Direct:
    """A request a caller sent itself (what statistics and tracing keep of it)."""

    __slots__ = ("request", "batch_size", "enqueued_ns")

    def __init__(self, request: InferRequest, batch_size: int, enqueued_ns: int) -> None:
        self.request = request
        self.batch_size = batch_size
        self.enqueued_ns = enqueued_ns


class DefaultScheduler(Scheduler[Instance, Work]):
    _runs_in_own_task = False  # `_deliver` hands the caller its stream once the request is sent
    _sends_directly = True  # a policy that routes each request (multiplex) turns the direct send off

    def __init__(self, instances: Sequence[Instance], stats: ModelStatistics) -> None:
        super().__init__(stats)
        self._instances = instances
        self._queue: asyncio.Queue[Work] = asyncio.Queue()
        self._busy: dict[Instance, int] = {}  # executes running per instance, from either path
        self._slot_waiters: dict[Instance, collections.deque[asyncio.Future[None]]] = {}
        self._holding = 0  # requests workers took and hold while they wait for a slot
        self._direct = [cast(_SendsNow, instance) for instance in instances if _sends_now(instance)] \
            if self._sends_directly else []

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
        if self._direct and self._queue.empty():
            sent = self._send_directly(request, batch_size)
            if isinstance(sent, ServerError):
                raise sent
            if sent is not None:
                return sent
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

    # -- pipeline slots and the direct send -------------------------------------------------------
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

    def _idle_instance(self) -> _SendsNow | None:
        """The least busy instance with a free slot that no worker waits for, if any."""
        best, best_busy = None, PIPELINE_DEPTH
        for instance in self._direct:
            busy = self._busy.get(instance, 0)
            if busy < best_busy and not self._slot_waiters.get(instance) and self._can_run(instance):
                best, best_busy = instance, busy
        return best

    def _send_directly(self, request: InferRequest, batch_size: int) -> Outcome | None:
        """Send the request from the caller's task to an idle instance: its stream, or why it
        never ran; None when no instance is idle or its queue is full (then it is queued)."""
        enqueued = time.monotonic_ns()  # the queue time is the choice of the instance
        instance = self._idle_instance()
        if instance is None:
            return None
        work = _Direct(request, batch_size, enqueued)
        self._busy[instance] = self._busy.get(instance, 0) + 1
        begun = time.monotonic_ns()
        try:
            started = instance.start_streams([request])
        except Exception as exc:  # a bug below us fails this request, as `_execute` does
            log.exception("scheduler: sending a request to '%s' failed", instance.name)
            started = [ServerError(f"failed to execute the request: {exc}", Status.INTERNAL)], BatchTiming(), None
        if started is None:
            self._release_slot(instance)
            return None
        results, timing, done = started
        self._begin([work], begun)
        if done is None:
            self._direct_done(instance, work, results, begun, timing)
        else:
            done.add_done_callback(lambda _: self._direct_done(instance, work, results, begun, timing))
        return results[0]

    def _direct_done(self, instance: _SendsNow, work: _Direct, results: list[Outcome], begun: int,
                     timing: BatchTiming) -> None:
        """A directly sent request's `execute` returned (or it never reached the model)."""
        try:
            instance.counted(results)
            self._finish([work], results, begun, timing)
        finally:
            self._release_slot(instance)

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
