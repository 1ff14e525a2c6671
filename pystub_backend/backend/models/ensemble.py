"""Ensemble models (`platform: "ensemble"`): a loaded ensemble version and its scheduler.

An ensemble has no model.py and no instances: `EnsembleVersion` stands where a `ModelVersion`
stands (the core looks it up, validates requests against its config, tracks its requests, drains
and unloads it) and `EnsembleScheduler` runs each request as an `ensemble_run.EnsembleRun`, whose
steps go through `Core.infer_stream` like any client request, so each composing model keeps its
own scheduling, batching and statistics.

Loading checks the graph (ensemble_config) and that every composing model is loaded with the
tensors the steps map; the core loads composing models first (and, in explicit mode, loads the
ones that are missing). The ensemble's statistics count one execution per request: success and
failure with their total durations, `compute_infer` being the time from start to final response.

An ensemble answers like a decoupled model when its config says so or when a composing model is
decoupled (known when a request starts); unary endpoints then refuse it, as for decoupled models.
`ensemble_scheduling.max_inflight_requests` bounds the requests running at once; more wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

from pystub_backend.backend.config.model_config import ConfigError, ModelConfig, config_to_json, is_decoupled
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.response_cache import cached_stream, version_cache
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.models.ensemble_config import EnsembleGraph, EnsembleStep
from pystub_backend.backend.models.ensemble_run import EnsembleRun
from pystub_backend.backend.models.state import ModelState
from pystub_backend.backend.models.validation import RequestChecks
from pystub_backend.backend.models.version import ModelLoadError
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.supervision.services import StubFacingCore
from pystub_backend.backend.telemetry.statistics import BatchTiming, ModelStatistics, reason_for
from pystub_backend.ipc.status import Status

__all__ = ["EnsembleVersion", "EnsembleScheduler"]

log = logging.getLogger("pystub.ensemble")


class EnsembleScheduler:
    """Runs ensemble requests; the scheduler face of pystub_backend.backend.scheduling.choice."""

    def __init__(self, version: EnsembleVersion) -> None:
        self._version = version
        limit = version.config.ensemble_scheduling.max_inflight_requests
        self._limit = asyncio.Semaphore(limit) if limit > 0 else None
        self._runs: dict[asyncio.Task[None], EnsembleRun] = {}
        self._stopped: ServerError | None = None
        self.queued = 0

    def start(self) -> None:
        pass

    async def schedule(self, request: InferRequest, batch_size: int) -> InferResponse:
        stream = await self.schedule_stream(request, batch_size)
        try:
            return await stream.single()
        except asyncio.CancelledError:
            stream.cancel()
            raise

    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """The request's responses; the graph runs in the background. Raises ServerError."""
        if self._stopped is not None:
            raise self._stopped
        enqueued = time.monotonic_ns()
        if self._limit is not None:
            self.queued += 1
            try:
                await self._limit.acquire()
            finally:
                self.queued -= 1
            if self._stopped is not None:
                self._limit.release()
                raise self._stopped
        version = self._version
        run_holder: list[EnsembleRun] = []
        stream = ResponseStream(request.id, version.name, lambda: self._cancel(run_holder))
        stream.model_version = str(version.version)
        decoupled_steps = version.decoupled_steps()
        assert version.graph is not None  # set when the version loaded, before it served
        run = EnsembleRun(version.core, version.graph, request, stream, decoupled_steps,
                          version.answers_decoupled(decoupled_steps))
        run_holder.append(run)
        task = asyncio.ensure_future(run.run())
        self._runs[task] = run
        started = time.monotonic_ns()
        stream.when_final(lambda finished: self._record(finished, batch_size, enqueued, started))
        task.add_done_callback(self._run_done)
        return stream

    def _cancel(self, holder: list[EnsembleRun]) -> None:
        for task, run in list(self._runs.items()):
            if holder and run is holder[0] and not task.done():
                task.cancel()

    def _run_done(self, task: asyncio.Task[None]) -> None:
        self._runs.pop(task, None)
        if self._limit is not None:
            self._limit.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("ensemble '%s' run failed", self._version.name, exc_info=task.exception())

    def _record(self, stream: ResponseStream, batch_size: int, enqueued: int, started: int) -> None:
        stats, now = self._version.stats, time.monotonic_ns()
        if stream.error is not None:
            stats.record_failure(now - enqueued, reason_for(stream.error))
            return
        timing = BatchTiming(compute_infer_ns=now - started)
        stats.record_execution(batch_size, timing)
        stats.record_success(batch_size, now - enqueued, started - enqueued, timing)

    def fail_queued(self, error: ServerError) -> int:
        return 0  # requests waiting for `max_inflight_requests` see `_stopped` when they wake

    async def stop(self, reason: str) -> None:
        """Refuse new requests; end the running ones with `reason`."""
        self._stopped = ServerError(reason, Status.UNAVAILABLE)
        for task in list(self._runs):
            task.cancel()
        await asyncio.gather(*self._runs, return_exceptions=True)


class EnsembleVersion:
    """One loaded version of an ensemble; the face of pystub_backend.backend.models.version.ModelVersion."""

    def __init__(self, config: ModelConfig, version: int, model_dir: str, core: StubFacingCore) -> None:
        self.config = config
        self.core = core
        self.name = config.name
        self.version = version
        self.version_text = str(version)  # what core.serving stamps each request with
        self.model_dir = model_dir
        self.config_json = config_to_json(config)
        self.checks = RequestChecks(config)  # what validating a request needs, derived once
        self.stats = ModelStatistics(self.name, str(version))
        self.in_flight: set[Any] = set()  # its requests' tasks and streams (lifecycle.InFlight)
        self.instances: list[Any] = []
        self.scheduler: EnsembleScheduler | None = None
        self.state = ModelState.UNAVAILABLE
        self.reason = ""
        self.graph: EnsembleGraph | None = None
        self.response_cache = version_cache(config, core)  # Triton caches top-level ensemble requests too

    # -- readiness -------------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self.state == ModelState.READY

    @property
    def ready(self) -> bool:
        return self.loaded

    def health_error(self) -> ServerError | None:
        return None

    async def check_ready(self) -> str | None:
        return None if self.loaded else f"Model '{self.name}' version {self.version} is not loaded"

    @property
    def decoupled(self) -> bool:
        """Whether clients must stream: the config says so, or a composing model is decoupled."""
        return self.answers_decoupled(self.decoupled_steps())

    def decoupled_steps(self) -> set[int]:
        if self.graph is None or self.core is None:
            return set()
        return {step.index for step in self.graph.steps if self.core.is_decoupled(step.model_name, step.model_version)}

    def answers_decoupled(self, decoupled_steps: set[int]) -> bool:
        return is_decoupled(self.config) or bool(decoupled_steps)

    # -- loading ---------------------------------------------------------------------------------------
    async def load(self) -> None:
        """Check the graph and the composing models. Raises ModelLoadError."""
        self.state = ModelState.LOADING
        try:
            self.graph = EnsembleGraph.from_config(self.config)
            for step in self.graph.steps:
                self._check_step(step)
        except (ConfigError, ModelLoadError) as exc:
            self.state, self.reason = ModelState.UNAVAILABLE, str(exc)
            raise ModelLoadError(str(exc)) from exc
        self.scheduler = EnsembleScheduler(self)
        self.state, self.reason = ModelState.READY, ""

    def _check_step(self, step: EnsembleStep) -> None:
        try:
            config = self.core.model_config(step.model_name, step.model_version)
        except ServerError:
            version = f" version {step.model_version}" if step.model_version else ""
            raise ModelLoadError(f"ensemble '{self.name}' depends on '{step.model_name}'{version}, which has no "
                                 f"loaded version") from None
        inputs = {tensor.name for tensor in config.input}
        outputs = {tensor.name for tensor in config.output}
        for name in step.input_map:
            if name not in inputs:
                raise ModelLoadError(f"in ensemble '{self.name}', {step.label} maps input '{name}', which model "
                                     f"'{step.model_name}' does not have")
        for name in step.output_map:
            if name not in outputs:
                raise ModelLoadError(f"in ensemble '{self.name}', {step.label} maps output '{name}', which model "
                                     f"'{step.model_name}' does not have")

    # -- serving ---------------------------------------------------------------------------------------
    def serve(self, request: InferRequest, batch_size: int) -> Awaitable[InferResponse]:
        """What core.serving calls (ModelVersion's face): `infer`."""
        return self.infer(request, batch_size)

    async def infer(self, request: InferRequest, batch_size: int) -> InferResponse:
        stream = await self.infer_stream(request, batch_size)
        try:
            return await stream.single()
        except asyncio.CancelledError:
            stream.cancel()
            raise

    async def infer_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        if self.scheduler is None or not self.loaded:
            raise ServerError(f"Request for unknown model: '{self.name}' version {self.version} is not at "
                              f"ready state", Status.UNAVAILABLE)
        request.model_version = str(self.version)
        if self.response_cache is not None and not self.decoupled:  # response cache hook
            return await cached_stream(self.response_cache, self.stats, request,
                                       lambda: self._single(request, batch_size))
        return await self.scheduler.schedule_stream(request, batch_size)

    async def _single(self, request: InferRequest, batch_size: int) -> InferResponse:
        assert self.scheduler is not None
        stream = await self.scheduler.schedule_stream(request, batch_size)
        try:
            return await stream.single()
        except asyncio.CancelledError:
            stream.cancel()
            raise

    def instance(self, name: str) -> None:
        return None

    async def unload(self, timeout: float) -> None:
        self.state = ModelState.UNLOADING
        if self.scheduler is not None:
            await self.scheduler.stop(f"Model '{self.name}' version {self.version} is unloading.")
        self.state, self.reason = ModelState.UNAVAILABLE, "unloaded"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": str(self.version), "state": self.state.value, "reason": self.reason}
