"""Model multiplexing in the backend: what each instance holds, and the scheduler that follows it.

    config parameter MAX_MULTIPLEXED_MODELS ──▶ scheduling.make_scheduler ──▶ multiplex_state()
        MultiplexState       per model version: instances wrapped as MultiplexedInstance, the
                             counters per instance, the ids each stub holds (from its frames)
        MultiplexedInstance  sends MultiplexConfigure to each new stub incarnation before its first
                             batch, so the stub's sub-model cache exists before a request needs it
        MultiplexScheduler   the default scheduler; its free workers pick work by the rules of
                             multiplex_queue.RoutedQueue: work whose id their instance holds first,
                             else work nobody holds (if their instance loses least by loading it),
                             else work whose holders are too busy (so no instance takes it all)

The stub reports its cache's changes (pystub_backend.ipc.messages.multiplex); the handlers here mirror them per
stub process. A restarted stub is a new process with an empty cache: its holdings start empty,
while the counters, kept per instance name, go on. With `dynamic_batching` the batcher schedules
as usual (no routing) and the instances are still wrapped, so the model side works the same.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pystub_backend.backend.config.model_config import ModelConfig, config_parameters
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.scheduling.base import Gate, StubHolder, StubInstance
from pystub_backend.backend.scheduling.multiplex_queue import ROUTING_POLICIES, RoutedQueue, routed_id
from pystub_backend.backend.scheduling.multiplex_stats import InstanceCounters, multiplex_metric_lines
from pystub_backend.backend.scheduling.pipelined import PIPELINE_DEPTH, PipelinedScheduler, Work
from pystub_backend.backend.supervision.handlers import BackendHandlers
from pystub_backend.backend.telemetry.statistics import ModelStatistics
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages.multiplex import (
    MODEL_ID_PARAMETER,
    MultiplexConfigure,
    MultiplexLoaded,
    MultiplexLoadFailed,
    MultiplexUnloaded,
    MultiplexUsage,
    model_id_problem,
)
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["CAP_PARAMETER", "ROUTING_PARAMETER", "MultiplexSettings", "MultiplexState", "MultiplexScheduler",
           "multiplex_settings", "multiplex_state", "held_ids", "multiplex_stats", "multiplex_metrics",
           "request_model_id", "register"]

log = logging.getLogger("pystub.multiplex")

CAP_PARAMETER = "MAX_MULTIPLEXED_MODELS"
ROUTING_PARAMETER = "MULTIPLEX_ROUTING"
MAX_CAP = 100_000
_RUN_AVERAGE_WEIGHT = 0.05


class MultiplexSettings:
    __slots__ = ("cap", "routing")

    def __init__(self, cap: int, routing: str) -> None:
        self.cap = cap
        self.routing = routing


def multiplex_settings(config: ModelConfig) -> MultiplexSettings | None:
    """The model's multiplexing settings, or None when it does not multiplex. A bad value is
    logged and leaves multiplexing off (the model's lookups then say it is not enabled)."""
    parameters = config_parameters(config)
    raw = parameters.get(CAP_PARAMETER, "").strip()
    if not raw:
        return None
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if not 1 <= cap <= MAX_CAP:
        log.error("model '%s': config parameter %s must be an integer from 1 to %d, got '%s'; multiplexing "
                  "is off", config.name, CAP_PARAMETER, MAX_CAP, raw)
        return None
    routing = parameters.get(ROUTING_PARAMETER, "").strip().lower() or ROUTING_POLICIES[0]
    if routing not in ROUTING_POLICIES:
        log.error("model '%s': config parameter %s must be one of %s, got '%s'; using '%s'", config.name,
                  ROUTING_PARAMETER, ", ".join(ROUTING_POLICIES), routing, ROUTING_POLICIES[0])
        routing = ROUTING_POLICIES[0]
    return MultiplexSettings(cap, routing)


class MultiplexedVersion(Protocol):
    """A loaded model version as the multiplexing metrics see it (models.version.ModelVersion)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def stats(self) -> ModelStatistics: ...


class VersionSource(Protocol):
    """Where the metrics find every loaded model version (the server core)."""

    def model_versions(self) -> Iterable[MultiplexedVersion]: ...


def request_model_id(request: InferRequest) -> str | None:
    """The request's multiplexed model id, None when it has none. Raises ServerError(INVALID_ARG)
    for an invalid one."""
    value = request.parameters.get(MODEL_ID_PARAMETER)
    if value is None:
        return None
    problem = model_id_problem(value)
    if problem is not None:
        raise ServerError(problem, Status.INVALID_ARG)
    assert isinstance(value, str)  # model_id_problem refuses anything else
    return value


# -- what each stub holds (mirrored from its frames) ------------------------------------------------


class _StubHoldings:
    __slots__ = ("ids", "counters", "state")

    def __init__(self, counters: InstanceCounters, state: MultiplexState) -> None:
        self.ids: collections.OrderedDict[str, None] = collections.OrderedDict()  # LRU first
        self.counters = counters
        self.state = state


# Keyed by StubProcess: a stub's holdings die with it, and a new incarnation starts empty.
_HOLDINGS: weakref.WeakKeyDictionary[StubProcess, _StubHoldings] = weakref.WeakKeyDictionary()
# Keyed by the version's ModelStatistics: what `multiplex_stats(version)` reports.
_STATES: weakref.WeakKeyDictionary[ModelStatistics, MultiplexState] = weakref.WeakKeyDictionary()


def _holdings(stub: StubProcess, what: str) -> _StubHoldings | None:
    holdings = _HOLDINGS.get(stub)
    if holdings is None:
        log.warning("%s from stub '%s', which was not configured for multiplexing", what, stub.instance_name)
    return holdings


def _on_loaded(stub: StubProcess, message: MultiplexLoaded) -> None:
    holdings = _holdings(stub, "MultiplexLoaded")
    if holdings is not None:
        holdings.ids[message.model_id] = None
        holdings.ids.move_to_end(message.model_id)
        holdings.counters.loads += 1
        holdings.counters.load_seconds.observe(message.seconds)
        holdings.state.changed()


def _on_load_failed(stub: StubProcess, message: MultiplexLoadFailed) -> None:
    holdings = _holdings(stub, "MultiplexLoadFailed")
    if holdings is not None:
        holdings.counters.load_failures += 1
        holdings.counters.load_seconds.observe(message.seconds)
        holdings.state.changed()


def _on_unloaded(stub: StubProcess, message: MultiplexUnloaded) -> None:
    holdings = _holdings(stub, "MultiplexUnloaded")
    if holdings is not None:
        holdings.ids.pop(message.model_id, None)
        holdings.counters.unloads += 1
        holdings.counters.unload_seconds.observe(message.seconds)
        holdings.state.changed()


def _on_usage(stub: StubProcess, message: MultiplexUsage) -> None:
    holdings = _holdings(stub, "MultiplexUsage")
    if holdings is not None:
        holdings.counters.hits += message.hits
        holdings.counters.waits += message.waits
        for model_id in message.recent:
            if model_id in holdings.ids:
                holdings.ids.move_to_end(model_id)


def register(handlers: BackendHandlers) -> None:
    """The stubs' reports of their sub-model caches (called by features.install)."""
    handlers.on_frame(MultiplexLoaded, _on_loaded)
    handlers.on_frame(MultiplexLoadFailed, _on_load_failed)
    handlers.on_frame(MultiplexUnloaded, _on_unloaded)
    handlers.on_frame(MultiplexUsage, _on_usage)


def held_ids(instance: StubHolder) -> list[str]:
    """The ids the instance's current stub holds, least recently used first ([] if none)."""
    holdings = _stub_holdings(instance)
    return list(holdings.ids) if holdings is not None else []


def _stub_holdings(instance: StubHolder) -> _StubHoldings | None:
    stub = instance.stub
    return _HOLDINGS.get(stub) if stub is not None else None


def multiplex_stats(version: MultiplexedVersion) -> dict[str, Any] | None:
    """Plain numbers for metrics: `{"model", "version", "cap", "routing", "instances": [{"instance",
    "held": [ids], "loads", "load_failures", "unloads", "hits", "waits", "load_seconds",
    "unload_seconds"}]}` (histograms as `multiplex_stats.Histogram.snapshot`), or None when the
    version does not multiplex."""
    state = _STATES.get(version.stats)
    if state is None:
        return None
    return {"model": version.name, "version": str(version.version), "cap": state.settings.cap,
            "routing": state.settings.routing,
            "instances": [{"instance": instance.name, "held": held_ids(instance),
                           **state.counters[instance.name].snapshot()} for instance in state.instances]}


def multiplex_metrics(core: VersionSource) -> list[str]:
    """The Prometheus text lines of every multiplexed model version (for `GET /metrics`)."""
    return multiplex_metric_lines(stats for stats in map(multiplex_stats, core.model_versions()) if stats)


# -- per model version ------------------------------------------------------------------------------


class MultiplexState:
    """Multiplexing of one model version: wrapped instances, counters, and who holds what."""

    def __init__(self, settings: MultiplexSettings, instances: Sequence[StubInstance], stats: ModelStatistics) -> None:
        self.settings = settings
        self.counters = {instance.name: InstanceCounters() for instance in instances}
        self.instances = [MultiplexedInstance(instance, self) for instance in instances]
        self._running: dict[str, collections.Counter[str]] = {i.name: collections.Counter() for i in instances}
        self._run_seconds: float | None = None  # moving average of a worker's turn (pipelining included)
        self._listeners: list[Callable[[], None]] = []
        _STATES[stats] = self

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def changed(self) -> None:
        for listener in self._listeners:
            listener()

    def holds(self, instance: MultiplexedInstance, model_id: str) -> bool:
        """Whether the instance holds the id, or runs a request for it now (it will hold it)."""
        if self._running[instance.name][model_id] > 0:
            return True
        holdings = _stub_holdings(instance)
        return holdings is not None and model_id in holdings.ids

    def victim(self, instance: MultiplexedInstance) -> str | None:
        """The id the instance's cache evicts to load another one, None when it has room."""
        holdings = _stub_holdings(instance)
        held = list(holdings.ids) if holdings is not None else []
        loading = [model_id for model_id in self._running[instance.name] if model_id not in held]
        if len(held) + len(loading) < self.settings.cap:
            return None
        return held[0] if held else loading[0]

    def started(self, instance: MultiplexedInstance, model_id: str | None) -> None:
        if model_id is None:
            return
        self._running[instance.name][model_id] += 1
        holdings = _stub_holdings(instance)
        if holdings is not None and model_id in holdings.ids:
            holdings.ids.move_to_end(model_id)  # used now: the stub will report it too, a bit later

    def patience(self) -> float:
        """Turns a request may wait for the instances holding its id before a free one loads it as
        well: as many as a holder serves in the time of an average load. A worker's turn (its
        `execute`, pipelining included) is a moving average; until a load and a turn have been
        measured, one round of the holder's workers."""
        loads = [c.load_seconds for c in self.counters.values() if c.load_seconds.count]
        if not loads or not self._run_seconds:
            return PIPELINE_DEPTH
        load_seconds = sum(h.sum for h in loads) / sum(h.count for h in loads)
        return PIPELINE_DEPTH * load_seconds / self._run_seconds

    def finished(self, instance: MultiplexedInstance, model_id: str | None, seconds: float) -> None:
        previous = self._run_seconds
        self._run_seconds = seconds if previous is None else previous + _RUN_AVERAGE_WEIGHT * (seconds - previous)
        if model_id is not None:
            running = self._running[instance.name]
            running[model_id] -= 1
            if running[model_id] <= 0:
                del running[model_id]
        self.changed()

    def register(self, stub: StubProcess, instance_name: str) -> None:
        if stub not in _HOLDINGS:
            _HOLDINGS[stub] = _StubHoldings(self.counters[instance_name], self)


class MultiplexedInstance:
    """A ModelInstance that configures each new stub incarnation's sub-model cache before its first
    batch. Everything else is the instance's own (attributes are forwarded)."""

    def __init__(self, instance: StubInstance, state: MultiplexState) -> None:
        self._instance = instance
        self._state = state
        self._configuring: weakref.WeakKeyDictionary[StubProcess, asyncio.Future[bool]] = weakref.WeakKeyDictionary()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._instance, name)

    @property
    def name(self) -> str:
        return self._instance.name

    @property
    def stub(self) -> StubProcess | None:
        return self._instance.stub

    @property
    def gate(self) -> Gate:
        """Before each batch: the stub's sub-model cache configured (then the inner gate, if any)."""
        return self

    async def enter(self) -> None:
        await self._configure()
        inner = self._instance.gate
        if inner is not None:
            await inner.enter()

    def leave(self) -> None:
        inner = self._instance.gate
        if inner is not None:
            inner.leave()

    async def _configure(self) -> None:
        stub = self._instance.stub
        if stub is None or not stub.alive:
            return  # the execute fails with the instance's own error
        sending = self._configuring.get(stub)
        if sending is None:
            self._state.register(stub, self._instance.name)
            # One send per stub; every worker waits for it, so no EXECUTE overtakes it.
            sending = self._configuring[stub] = asyncio.ensure_future(self._send(stub))
        if not await asyncio.shield(sending):
            self._configuring.pop(stub, None)  # try again with the next batch

    async def _send(self, stub: StubProcess) -> bool:
        try:
            await stub.send(MultiplexConfigure(self._state.settings.cap))
        except (ChannelClosedError, ChannelTimeoutError) as exc:
            log.warning("could not configure multiplexing of stub '%s': %s", stub.instance_name, exc)
            return False
        return True


class MultiplexScheduler(PipelinedScheduler[MultiplexedInstance]):
    """The default scheduler with routing: a free worker takes the work its instance suits best."""

    def __init__(self, state: MultiplexState, stats: ModelStatistics) -> None:
        super().__init__(state.instances, stats)
        self._state = state
        queue = self._routed = RoutedQueue(state.instances, state, state.settings.routing)
        self._queue = queue  # type: ignore[assignment]  # it offers the asyncio.Queue calls the base makes
        state.on_change(queue.notify)

    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        request_model_id(request)  # an invalid id fails here, before it queues
        return await super().schedule_stream(request, batch_size)

    async def _next_work(self, instance: MultiplexedInstance) -> Work:
        return await self._routed.get_for(instance)

    async def _run(self, instance: MultiplexedInstance, work: Work) -> None:
        model_id = routed_id(work.request)
        self._state.started(instance, model_id)
        began = time.monotonic()
        try:
            await super()._run(instance, work)
        finally:
            self._state.finished(instance, model_id, time.monotonic() - began)


def multiplex_state(config: ModelConfig, instances: Sequence[StubInstance], stats: ModelStatistics
                    ) -> MultiplexState | None:
    """The multiplexing state of a model version, or None when it does not multiplex. A scheduler
    must be given `state.instances` (they configure each stub's cache); `MultiplexScheduler(state,
    stats)` adds routing."""
    settings = multiplex_settings(config)
    return None if settings is None else MultiplexState(settings, instances, stats)
