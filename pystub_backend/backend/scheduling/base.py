"""What every scheduler shares: its face, failure accounting and statistics (`Scheduler`), and the
worker loop of those that pull work (`WorkerScheduler`: the batchers, multiplex routing):

    start() ──▶ one worker per unit (an instance, a pipeline slot of one, a sequence lane)
    worker:  while instance.wait_ready():        READY, or back from a restart (False: FAILED/stopped)
                 work = await _take(unit)         the policy: which request(s) this unit runs next
                 unit can't run it now?  ──▶ _give_back(unit, work)   (died meanwhile, held by BLS)
                 _run(unit, work) in a task of its own (or inline, if the policy says so)
             _instance_gone(unit)                 the policy: what happens to work nobody can run

    a model update adds instances (`add_instances`: workers for the policy's new units) and removes
    them (`remove_instance`: the policy drains the instance, then its workers end, at once when they
    wait for work, after the work they hold otherwise)

Statistics are counted here and only here (`telemetry.statistics` says what each counter means):
an execution when a batch reached the model; per request, when its stream ends, an inference
unless the stream was failed (batch failure, stub death: the model did not answer it), then a
success, or a failure with the reason its error gives; a request that never reached the model
fails with the reason its scheduler names (REJECTED, CANCELED, BACKEND, OTHER).
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.response_stream import Outcome, ResponseStream
from pystub_backend.backend.supervision.exchange import Submission
from pystub_backend.backend.telemetry.statistics import BACKEND, BatchTiming, ModelStatistics, reason_for
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["Scheduler", "WorkerScheduler", "Outcome", "Gate", "Instance", "StubHolder", "StubInstance", "Queued"]

log = logging.getLogger("pystub.scheduler")


class Gate(Protocol):
    """An admission step before each batch an instance runs (the rate limiter's resources, a new
    stub's multiplexing setup): `enter` waits until the batch may go, `leave` once its `execute`
    returned."""

    async def enter(self) -> None: ...

    def leave(self) -> None: ...


class Instance(Protocol):
    """What a scheduler uses of a model instance (supervision.instance.ModelInstance, or a wrapper
    such as multiplex.MultiplexedInstance)."""

    @property
    def name(self) -> str: ...

    @property
    def healthy(self) -> bool: ...

    # An execute on it waits for a BLS call: work sent now would only queue behind it.
    held: bool

    @property
    def usable(self) -> bool: ...

    def unhealthy_error(self) -> ServerError: ...

    async def wait_ready(self) -> bool: ...

    @property
    def gate(self) -> Gate | None: ...

    def submit(self, requests: list[InferRequest], *, wait: bool) -> Submission | None:
        """Send a batch (supervision.exchange.RequestExchange.submit). With `wait=False`, None when
        it cannot go now."""

    def on_change(self, callback: Callable[[], None]) -> None:
        """`callback()` whenever the instance may take work again, or never will."""


class StubHolder(Protocol):
    """Something whose current stub process a policy follows (the sub-models it holds, the
    sequences whose state it keeps): a ModelInstance, or a wrapper of one."""

    @property
    def stub(self) -> StubProcess | None: ...


class StubInstance(Instance, StubHolder, Protocol):
    """An instance whose stub a policy follows (supervision.instance.ModelInstance, or the rate
    limiter's wrapper of one): what the sequence batcher and multiplexing are given."""


class Queued(Protocol):
    """What a scheduler keeps of each request it queues."""

    request: InferRequest
    batch_size: int
    enqueued_ns: int


_Unit = TypeVar("_Unit")
_Work = TypeVar("_Work")


class Scheduler(abc.ABC):
    """The face every scheduler has, and the accounting they share (`_execute`, `_begin`,
    `_finish`, the statistics)."""

    def __init__(self, stats: ModelStatistics) -> None:
        self._stats = stats
        self._running: set[asyncio.Task[None]] = set()
        self._stopped: ServerError | None = None

    @abc.abstractmethod
    def start(self) -> None:
        """Begin serving (the scheduler's workers, if it has any)."""

    @property
    @abc.abstractmethod
    def queued(self) -> int:
        """Requests waiting for an instance."""

    @abc.abstractmethod
    async def schedule(self, request: InferRequest, batch_size: int) -> InferResponse:
        """The request's single InferResponse. Raises ServerError."""

    @abc.abstractmethod
    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """The request's ResponseStream once its execute has started. Raises ServerError."""

    @abc.abstractmethod
    def fail_queued(self, error: ServerError) -> int:
        """Answer every queued request with `error` (running ones go on); returns how many."""

    # -- a model update that changes only the instances (models.instance_update) --------------------
    def add_instances(self, instances: Sequence[Instance]) -> None:
        """Serve on these (started) instances too."""
        raise NotImplementedError(f"{type(self).__name__} cannot add instances")

    async def remove_instance(self, instance: Instance) -> None:
        """Give `instance` no new work, and return once the work it holds has ended: the executes it
        runs (and, for the sequence batcher, the sequences it holds). It is not stopped here."""
        raise NotImplementedError(f"{type(self).__name__} cannot remove instances")

    async def stop(self, reason: str) -> None:
        """Fail what is still queued with `reason` (UNAVAILABLE) and stop what waits."""
        self._stopped = ServerError(reason, Status.UNAVAILABLE)
        failed = self.fail_queued(self._stopped)
        if failed:
            log.info("%s failed %d queued request(s)", reason, failed)
        await self._before_workers_stop()

    async def _before_workers_stop(self) -> None:  # noqa: B027 - a hook: most schedulers need nothing here
        """A hook of `stop`, after the queue failed (and before any workers are cancelled)."""

    def _can_run(self, instance: Instance) -> bool:
        """Whether an instance may run work now: it did not die, and no execute on it waits for a
        BLS call (the work could only queue behind it)."""
        return bool(instance.healthy) and not instance.held

    async def _execute(self, instance: Instance, batch: Sequence[Queued],
                       on_sent: Callable[[list[Outcome]], None] | None = None,
                       follow: Callable[[Queued], bool] | None = None) -> list[Outcome]:
        """Send a batch to the instance and wait for its `execute` to return: one outcome per
        request, counted here. A request that never reached the model (stub gone, arena full) is
        a BACKEND failure; the others are one execution, and each is counted when its stream ends
        (`follow`: whether to count a request at all; False for one the model runs again).
        `on_sent(outcomes)` runs as soon as the batch is on its way. Never raises but for
        cancellation."""
        started = self._begin(batch)
        gate = instance.gate
        try:
            if gate is not None:
                await gate.enter()
            try:
                outcomes, timing = await self._submit(instance, [work.request for work in batch], on_sent)
            finally:
                if gate is not None:
                    gate.leave()
        except Exception as exc:  # a bug below us must fail these requests, not end the worker
            log.exception("scheduler: executing a batch of %d on '%s' failed", len(batch),
                          getattr(instance, "name", "?"))
            outcomes, timing = [ServerError(f"failed to execute the request: {exc}", Status.INTERNAL)] * len(batch), \
                BatchTiming()
        except BaseException:  # cancelled (the worker stops): the batch's traces end here, not never
            for work in batch:
                if work.request.trace is not None:
                    work.request.trace.computed(time.monotonic_ns(), time.monotonic_ns())
            raise
        return self._finish(batch, outcomes, started, timing, follow)

    @staticmethod
    async def _submit(instance: Instance, requests: list[InferRequest],
                      on_sent: Callable[[list[Outcome]], None] | None) -> tuple[list[Outcome], BatchTiming]:
        submission = instance.submit(requests, wait=True)
        assert submission is not None  # wait=True always answers
        if submission.sent:
            if on_sent is not None:
                on_sent(submission.outcomes)
            await submission.executed()
        return submission.outcomes, submission.timing

    def _begin(self, batch: Sequence[Queued], started: int | None = None) -> int:
        """A batch starts executing now (or at `started`): the clock, and the tracing hook."""
        started = time.monotonic_ns() if started is None else started
        for work in batch:
            if work.request.trace is not None:  # tracing hook
                work.request.trace.computing(self._stats.version, work.enqueued_ns, started)
        return started

    def _finish(self, batch: Sequence[Queued], results: list[Outcome], started: int, timing: BatchTiming,
                follow: Callable[[Queued], bool] | None = None) -> list[Outcome]:
        """A batch's `execute` returned (or it never reached the model): count it (see `_execute`)."""
        executed = 0
        for work, result in zip(batch, results, strict=True):
            if work.request.trace is not None:
                self._trace(work, result, started, timing)
            counted = follow is None or follow(work)
            if isinstance(result, ServerError):
                if counted:
                    self._record_failure(work.enqueued_ns, BACKEND)
                continue
            executed += work.batch_size
            if counted:
                result.when_final(functools.partial(self._record_final, work=work, started_ns=started, timing=timing))
        if executed:  # requests that never reached the model are no execution
            self._stats.record_execution(executed, timing)
        return list(results)

    def _trace(self, work: Queued, result: Outcome, started_ns: int, timing: BatchTiming) -> None:
        """Tracing hook: the request's compute times, and its end when its stream ends."""
        trace = work.request.trace
        assert trace is not None
        staged = started_ns + timing.compute_input_ns
        waited = timing.queued_in_stub_ns
        trace.computed(staged, staged + waited + timing.compute_infer_ns, waited)
        if isinstance(result, ResponseStream):
            result.when_final(lambda _stream: trace.request_end())

    # -- statistics ----------------------------------------------------------------------------------
    def _record_failure(self, enqueued_ns: int, reason: str) -> None:
        """A request failed with `reason` before the model answered it."""
        self._stats.record_failure(time.monotonic_ns() - enqueued_ns, reason)

    def _record_final(self, stream: ResponseStream, work: Queued, started_ns: int, timing: BatchTiming) -> None:
        finished, enqueued = time.monotonic_ns(), work.enqueued_ns
        if stream.error is None and not stream.cancelled:
            self._stats.record_success(work.batch_size, finished - enqueued, started_ns - enqueued, timing)
        else:  # an error response of the model is an inference, so is a cancelled one; a stream the stub failed is not
            self._stats.record_failure(finished - enqueued, reason_for(stream.error, stream.cancelled),
                                       0 if stream.failed else work.batch_size)


class WorkerScheduler(Scheduler, Generic[_Unit, _Work]):
    """A scheduler with a worker per unit (the loop drawn in the module docstring). A subclass
    keeps only its policy: `_units`, `_instance_of`, `_take`, `_give_back`, `_run` (which calls
    `_execute`), `_instance_gone`, `fail_queued`, `queued`, `schedule` and `schedule_stream`."""

    # A batch runs in a task of its own, so that stopping the worker never cuts it in half (its
    # requests still get their answers). A policy whose run hands each caller its outcome as
    # soon as the request is on its way may run inline instead: one task less per request.
    _runs_in_own_task = True

    def __init__(self, stats: ModelStatistics) -> None:
        super().__init__(stats)
        self._workers: list[asyncio.Task[None]] = []
        self._workers_of: dict[Instance, list[asyncio.Task[None]]] = {}
        self._working: set[asyncio.Task[None]] = set()  # workers running the work they took
        self._retired: set[asyncio.Task[None]] = set()  # workers that end once that work is done

    def start(self) -> None:
        for unit in self._units():
            self._start_worker(unit)

    def _start_worker(self, unit: _Unit) -> None:
        worker = asyncio.ensure_future(self._work(unit))
        self._workers.append(worker)
        self._workers_of.setdefault(self._instance_of(unit), []).append(worker)

    # -- instances added and removed by a model update -------------------------------------------------
    def add_instances(self, instances: Sequence[Instance]) -> None:
        for unit in self._add_units(instances):
            self._start_worker(unit)

    async def remove_instance(self, instance: Instance) -> None:
        """The policy drains the instance (`_drain`), then its workers end: at once when they wait
        for work, after the work they run otherwise (never cut in half)."""
        await self._drain(instance)
        workers = self._workers_of.pop(instance, [])
        for worker in workers:
            self._retired.add(worker)
            if worker not in self._working:
                worker.cancel()  # it waits for work (or for its instance): nothing of it is lost
        await asyncio.gather(*workers, return_exceptions=True)
        for worker in workers:
            self._retired.discard(worker)
            self._workers.remove(worker)
        self._forget(instance)

    def _add_units(self, instances: Sequence[Instance]) -> Sequence[_Unit]:
        """The policy's units for instances added by an update (it keeps them from now on)."""
        raise NotImplementedError(f"{type(self).__name__} cannot add instances")

    async def _drain(self, instance: Instance) -> None:  # noqa: B027 - a hook: most policies need nothing
        """Before a removed instance's workers end: what it holds that must finish on it."""

    def _forget(self, instance: Instance) -> None:  # noqa: B027 - a hook: most policies keep nothing
        """A removed instance's workers have ended: drop what the policy keeps of it."""

    async def stop(self, reason: str) -> None:
        await super().stop(reason)
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

    # -- the worker loop -------------------------------------------------------------------------------
    async def _work(self, unit: _Unit) -> None:
        # A worker serves while its instance is READY, waits while it restarts, and ends when it
        # is FAILED or stopped.
        instance = self._instance_of(unit)
        worker = asyncio.current_task()
        assert worker is not None  # this coroutine is the unit's worker task (_start_worker)
        while await instance.wait_ready():
            if worker in self._retired:  # its instance was removed by a model update
                return
            work = await self._take(unit)
            if work is None:
                continue
            if not self._can_run(instance):
                self._give_back(unit, work)
                continue
            self._working.add(worker)
            if not self._runs_in_own_task:
                await self._run(unit, work)
            else:
                task = asyncio.ensure_future(self._run(unit, work))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
                await asyncio.shield(task)
            self._working.discard(worker)
        self._instance_gone(unit)
