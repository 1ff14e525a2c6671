"""The dynamic batcher: gathers single requests into batches before they reach an instance.

    schedule ──▶ PriorityQueue (levels, policies, timeouts) ──kick──▶ form_batch ──▶ idle worker
                   │ full: UNAVAILABLE "Exceeds maximum queue size"       (one per instance)
                   │ timed out: REJECT fails it, DELAY serves it later        │
                   ▼                                                          ▼
               loop timers (queue delay, timeouts)      instance.submit([r1, r2, ...])
                                                        ── one EXECUTE, the model's `execute`
                                                           gets the list

Same interface as DefaultScheduler. Everything runs on the backend's asyncio loop: a "kick"
(coalesced with call_soon, so a burst of arrivals is seen at once) expires timed-out requests and
hands batches to idle workers; one loop timer wakes it for the queue delay or the next timeout.
A worker holds one batch at a time, so requests gather while its instance executes.

Errors stay per request: a request the model answers with an error fails alone; an exception in
`execute` fails the whole batch (the stub answers every request with its text). Unload (`stop`)
and `fail_queued` answer queued requests with UNAVAILABLE and the reason; a batch already sent
finishes, or fails with the stub when the instance stops.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Hashable, Sequence
from typing import Any

from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.delay_hooks import delay_hooks
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.response_stream import Outcome, ResponseStream
from pystub_backend.backend.scheduling.base import Instance, WorkerScheduler
from pystub_backend.backend.scheduling.request_queue import (
    BatchLimits,
    PriorityQueue,
    QueueEntry,
    QueueFullError,
    form_batch,
)
from pystub_backend.backend.telemetry.statistics import BACKEND, CANCELED, OTHER, REJECTED, ModelStatistics
from pystub_backend.ipc.status import Status

__all__ = ["DynamicBatcher", "TIMEOUT_MESSAGE"]

TIMEOUT_MESSAGE = "Request timeout expired"  # Triton's text for a REJECT timeout


class _Item(QueueEntry):
    """A queued request, the future its caller awaits, and its place in the response order."""

    __slots__ = ("request", "future", "finished", "turn")

    def __init__(self, request: InferRequest, batch_size: int, key: Hashable, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(batch_size, key, time.monotonic_ns())
        self.request = request
        self.future: asyncio.Future[Outcome] = loop.create_future()
        self.finished = False  # preserve_ordering: its answer is known
        self.turn: asyncio.Future | None = None  # preserve_ordering: done when earlier ones answered


class DynamicBatcher(WorkerScheduler[Instance, list[_Item]]):
    def __init__(self, instances: Sequence[Instance], stats: ModelStatistics, config: ModelConfig) -> None:
        super().__init__(stats)
        self._instances = instances
        self._limits = BatchLimits.from_config(config)
        self._requests = PriorityQueue.from_config(config.dynamic_batching)
        self._preserve_ordering = bool(config.dynamic_batching.preserve_ordering)
        self._order: collections.deque[_Item] = collections.deque()
        self._ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
        self._shape_tensors = frozenset(i.name for i in config.input if i.is_shape_tensor)
        self._loop: Any = None  # the running loop, known from start()
        self._idle: collections.deque[asyncio.Future[list[_Item]]] = collections.deque()
        self._kick_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_ns = 0
        self._hold = delay_hooks().queue_hold()  # TRITONSERVER_DELAY_SCHEDULER, a test hook

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        super().start()

    @property
    def queued(self) -> int:
        return len(self._requests)

    # -- callers ---------------------------------------------------------------------------------
    async def schedule(self, request: InferRequest, batch_size: int) -> Any:
        """The request's InferResponse. Raises ServerError."""
        item = self._enqueue(request, batch_size, self._preserve_ordering)
        result: Any = None
        try:
            result = await item.future
            if isinstance(result, ResponseStream):
                try:
                    result = await result.single()
                except ServerError as error:
                    result = error
            if item.turn is not None:
                item.finished = True
                self._deliver_in_order()
                await item.turn
        except asyncio.CancelledError:
            self._abandon(item, result)
            raise
        if isinstance(result, ServerError):
            raise result
        return result

    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """The request's ResponseStream, once its batch's execute has started. Raises ServerError.
        (Responses of streams are not reordered: preserve_ordering applies to `schedule`.)"""
        item = self._enqueue(request, batch_size, False)
        try:
            result = await item.future
        except asyncio.CancelledError:
            self._abandon(item, None)
            raise
        if isinstance(result, ServerError):
            raise result
        return result

    def _enqueue(self, request: InferRequest, batch_size: int, ordered: bool) -> _Item:
        if self._stopped is not None:
            raise self._stopped
        item = _Item(request, batch_size, self._key(request), self._loop)
        parameters = request.parameters
        try:
            self._requests.push(item, int(parameters.get("priority", 0) or 0),
                                int(parameters.get("timeout", 0) or 0), item.enqueued_ns)
        except QueueFullError as exc:
            self._record_failure(item.enqueued_ns, REJECTED)
            raise ServerError(str(exc), Status.UNAVAILABLE) from None
        if ordered:
            item.turn = self._loop.create_future()
            self._order.append(item)
        self._schedule_kick()
        return item

    def _key(self, request: InferRequest) -> Hashable:
        """Requests batch together only if they have the same inputs with the same datatypes and
        non-batch dims (the whole shape and the values of shape tensors; any shape when ragged)."""
        if self._limits.max_batch_size <= 0:
            return None
        key: list[tuple[object, ...]] = []
        for tensor in sorted(request.inputs, key=lambda t: t.name):
            if tensor.name in self._ragged:
                key.append((tensor.name, tensor.datatype))
            elif tensor.name in self._shape_tensors:
                key.append((tensor.name, tensor.datatype, tuple(tensor.shape), bytes(tensor.data)))
            else:
                key.append((tensor.name, tensor.datatype, tuple(tensor.shape[1:])))
        return tuple(key)

    def _abandon(self, item: _Item, result: Outcome | InferResponse | None) -> None:
        """The caller went away: take the request out of the queue, cancel or free its answer."""
        if self._requests.discard(item):
            self._record_failure(item.enqueued_ns, CANCELED)
            self._schedule_kick()
        if item.future.done() and not item.future.cancelled() and result is None:
            result = item.future.result()
        item.future.cancel()
        if isinstance(result, ResponseStream):
            result.cancel()
        elif result is not None and not isinstance(result, ServerError):
            result.release()
        if item.turn is not None:
            item.finished = True
            self._deliver_in_order()

    def _resolve(self, item: _Item, result: Outcome) -> None:
        if not item.future.done():
            item.future.set_result(result)
        elif isinstance(result, ResponseStream):
            result.cancel()  # nobody waits for it any more

    def _deliver_in_order(self) -> None:
        while self._order and self._order[0].finished:
            turn = self._order.popleft().turn
            if turn is not None and not turn.done():
                turn.set_result(None)

    # -- forming batches -------------------------------------------------------------------------
    def _schedule_kick(self) -> None:
        if not self._kick_scheduled:
            self._kick_scheduled = True
            self._loop.call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_scheduled = False
        if self._stopped is not None:
            return
        now = time.monotonic_ns()
        for entry in self._requests.expire(now):
            self._fail(entry, ServerError(TIMEOUT_MESSAGE, Status.UNAVAILABLE), REJECTED)  # type: ignore[arg-type]
        if self._hold is not None and self._hold.holds(len(self._requests)):
            return  # the test hook: no batch until enough are queued (each arrival kicks again)
        wake = None
        while self._idle:
            if self._idle[0].done():  # its worker was cancelled
                self._idle.popleft()
                continue
            count, wake = form_batch(self._requests, now, self._limits)
            if not count:
                break
            self._idle.popleft().set_result(self._requests.pop(count))  # type: ignore[arg-type]  # our _Items
        deadline = self._requests.next_deadline()
        if deadline is not None and (wake is None or deadline < wake):
            wake = deadline
        if wake is not None:
            self._arm(wake, now)

    def _arm(self, wake_ns: int, now_ns: int) -> None:
        if self._timer is not None:
            if self._timer_ns <= wake_ns:
                return
            self._timer.cancel()
        self._timer_ns = wake_ns
        self._timer = self._loop.call_later(max(0, wake_ns - now_ns) / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._kick()

    def _fail(self, item: _Item, error: ServerError, reason: str) -> None:
        self._record_failure(item.enqueued_ns, reason)
        self._resolve(item, error)

    # -- the policy: an idle instance takes the next batch ----------------------------------------
    def _units(self) -> Sequence[Instance]:
        return self._instances

    def _instance_of(self, unit: Instance) -> Instance:
        return unit

    async def _take(self, unit: Instance) -> list[_Item]:
        waiter = self._loop.create_future()
        self._idle.append(waiter)
        self._schedule_kick()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give_back(unit, waiter.result())
            waiter.cancel()
            raise

    def _give_back(self, unit: Instance, work: list[_Item]) -> None:
        if self._stopped is not None:
            for item in work:
                self._fail(item, self._stopped, OTHER)
            return
        self._requests.push_front(work)  # type: ignore[arg-type]
        self._schedule_kick()

    async def _run(self, unit: Instance, work: list[_Item]) -> None:
        results = await self._execute(unit, work)
        for item, result in zip(work, results, strict=True):
            self._resolve(item, result)  # an error: it never reached the model (counted)

    def _instance_gone(self, unit: Instance) -> None:
        if not any(other.usable for other in self._instances):
            self._fail_all_queued(unit.unhealthy_error(), BACKEND)

    def _add_units(self, instances: Sequence[Instance]) -> Sequence[Instance]:
        self._instances = [*self._instances, *instances]
        return instances

    def _forget(self, instance: Instance) -> None:
        self._instances = [other for other in self._instances if other is not instance]

    # -- stopping --------------------------------------------------------------------------------
    def fail_queued(self, error: ServerError) -> int:
        """Answer every queued request with `error` (batches already sent run on); returns how
        many."""
        return self._fail_all_queued(error, OTHER)

    def _fail_all_queued(self, error: ServerError, reason: str) -> int:
        entries = self._requests.drain()
        for entry in entries:
            self._fail(entry, error, reason)  # type: ignore[arg-type]
        return len(entries)

    async def _before_workers_stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
