"""One loaded version of a model: its config, its supervised instances, scheduler and statistics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from pystub_backend.backend.config.model_config import (
    ModelConfig,
    config_parameters,
    config_to_json,
    is_decoupled,
)
from pystub_backend.backend.config.placement import Placement, PlacementError, check_placement, placements
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.install import feature_services
from pystub_backend.backend.features.response_cache import cache_refusal, cached_infer, cached_stream, version_cache
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.models.instance_keeper import InstanceKeeper, PreparedUpdate
from pystub_backend.backend.models.instance_update import only_instances_differ
from pystub_backend.backend.models.shared_weights import plan_instances
from pystub_backend.backend.models.snapshot import snapshot_sources
from pystub_backend.backend.models.state import ModelState
from pystub_backend.backend.models.validation import RequestChecks
from pystub_backend.backend.models.warmup import WarmupError, run_warmup
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.scheduling.base import StubInstance
from pystub_backend.backend.scheduling.choice import make_scheduler
from pystub_backend.backend.scheduling.implicit_state import ImplicitState, StateConfigError
from pystub_backend.backend.scheduling.multiplex import multiplex_settings
from pystub_backend.backend.scheduling.rate_limiter import RateLimitError, limit_instances, rate_limited, unregister
from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.execution_env import (
    ExecutionEnvError,
    interpreter_command,
    resolve_execution_env,
)
from pystub_backend.backend.supervision.instance import InstanceSpec, InstanceState, ModelInstance, watch_health
from pystub_backend.backend.supervision.services import StubFacingCore
from pystub_backend.backend.supervision.settings import StubSettings, positive_number
from pystub_backend.backend.supervision.template import WeightsTemplate
from pystub_backend.backend.telemetry.statistics import ModelStatistics
from pystub_backend.ipc.channel import MAX_FRAME
from pystub_backend.ipc.status import Status

__all__ = ["ModelVersion", "ModelLoadError", "Scheduler", "instance_args", "failure_with_status", "RLIMIT_PARAMETERS"]

log = logging.getLogger("pystub.model")

# Config parameters that limit each stub (pystub extension): parameter name -> rlimit name.
RLIMIT_PARAMETERS = {"STUB_MEMORY_LIMIT_BYTES": "as", "STUB_CPU_LIMIT_SECONDS": "cpu", "STUB_MAX_OPEN_FILES": "nofile"}
EXECUTE_TIMEOUT_PARAMETER = "EXECUTE_TIMEOUT_SECONDS"
_SNAPSHOT_FRAME_SHARE = MAX_FRAME // 2  # of the INIT frame, for the config and the snapshot of the model's files
_Number = TypeVar("_Number", int, float)
_FINALIZE_AFTER_DRAIN_S = 1.0  # a removed instance still executing after the exit timeout: its FINALIZE's wait


class Scheduler(Protocol):
    """What a version asks of its scheduler (pystub_backend.backend.scheduling: default, dynamic,
    sequence, multiplex)."""

    @property
    def queued(self) -> int: ...

    def start(self) -> None: ...

    async def schedule(self, request: InferRequest, batch_size: int) -> InferResponse: ...

    async def schedule_stream(self, request: InferRequest, batch_size: int) -> ResponseStream: ...

    def fail_queued(self, error: ServerError) -> int: ...

    async def stop(self, reason: str) -> None: ...

    def add_instances(self, instances: Sequence[StubInstance]) -> None: ...

    async def remove_instance(self, instance: StubInstance) -> None: ...


class ModelLoadError(Exception):
    """A model version failed to load; the message is what the log and the repository index show."""


# Triton's status names a version's failure carries; "Internal" unless the reason names its own.
INVALID_ARGUMENT = "Invalid argument: "
UNSUPPORTED = "Unsupported: "


def failure_with_status(reason: str) -> str:
    """A version's failure reason as Triton prints it after "UNAVAILABLE state: "."""
    return reason if reason.startswith((INVALID_ARGUMENT, UNSUPPORTED)) else f"Internal: {reason}"


def instance_args(config: ModelConfig, config_json: str, placement: Placement,
                  model_dir: str, version: int) -> dict[str, str]:
    """The seven keys `initialize(args)` receives (docs/reference/model-api.md#the-initialize-arguments);
    the stub also reads its device from them."""
    return {
        "model_config": config_json,
        "model_instance_kind": placement.kind,
        "model_instance_name": placement.name,
        "model_instance_device_id": str(placement.device_id),
        "model_repository": model_dir,
        "model_version": str(version),
        "model_name": config.name,
    }


def _parameter_number(parameters: dict[str, str], name: str, kind: type[_Number]) -> _Number | None:
    value = parameters.get(name)
    if value is None or value == "":
        return None
    try:
        return positive_number(value, kind)
    except ValueError as exc:
        raise ModelLoadError(f"config parameter {name} {exc}") from None


def _check_force_cpu_only(parameters: dict[str, str]) -> None:
    """`FORCE_CPU_ONLY_INPUT_TENSORS` is "yes" (the default) or "no", as Triton's python backend
    reads it. Every input a pystub model gets arrives on the CPU either way (BLS GPU inputs are
    copied to the host by the caller), so only the value is checked. Raises ModelLoadError."""
    value = parameters.get("FORCE_CPU_ONLY_INPUT_TENSORS")
    if value is not None and value not in ("yes", "no"):
        raise ModelLoadError(f"{UNSUPPORTED}Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: {value}'")


class ModelVersion:
    def __init__(self, config: ModelConfig, version: int, model_dir: str, model_path: str,
                 settings: StubSettings, core: StubFacingCore | None = None) -> None:
        self.config = config
        self.services = feature_services(core)  # what this version's stubs' feature handlers may use
        self.name = config.name
        self.version = version
        self.version_text = str(version)  # what each request's responses are stamped with
        self.model_dir = model_dir
        self.model_path = model_path
        self.settings = settings
        self.config_json = config_to_json(config)
        self.checks = RequestChecks(config)  # what validating a request needs, derived once
        self.decoupled = is_decoupled(config)
        self.stats = ModelStatistics(self.name, str(version))
        self.response_cache = version_cache(config, core)  # None: no cache, or not enabled for the model
        self._rate_limiter = getattr(core, "rate_limiter", None)  # None: --rate-limit=off
        self.instances: list[ModelInstance] = []
        self._template: WeightsTemplate | None = None  # PYSTUB_SHARE_WEIGHTS (models.shared_weights)
        self.scheduler: Scheduler | None = None  # see pystub_backend.backend.scheduling.choice
        self.state = ModelState.UNAVAILABLE  # changed by _enter only
        self.reason = ""
        self._monitor: asyncio.Task | None = None
        self._scheduled: Sequence[StubInstance] = []  # the instances as the scheduler sees them (rate limiter)
        self._usable = False  # some instance is READY or expected back (kept by _instances_changed)
        self.in_flight: set[Any] = set()  # its requests' tasks and streams (lifecycle.InFlight)
        # What serves a validated request stamped with `version_text` (core.serving): the scheduler
        # itself while the version serves with nothing in between (kept by `_route`), else `infer`.
        self.serve: Callable[[InferRequest, int], Awaitable[InferResponse]] = self.infer
        self._updates = InstanceKeeper()  # what updating the instances in place needs (models.instance_update)

    # -- readiness -------------------------------------------------------------------------------
    def _enter(self, state: ModelState, reason: str | None = None) -> None:
        """The version's state (and, when given, the reason the index shows) changes: and `serve`."""
        self.state = state
        if reason is not None:
            self.reason = reason
        self._route()

    def _route(self) -> None:
        """`serve`: the scheduler when the version is READY, an instance is usable and no
        response cache sits in front; `infer` (its checks, the cache) otherwise."""
        scheduler = self.scheduler
        plain = (scheduler is not None and self.state is ModelState.READY and self._usable
                 and self.response_cache is None)
        self.serve = scheduler.schedule if plain and scheduler is not None else self.infer

    @property
    def loaded(self) -> bool:
        return self.state == ModelState.READY

    @property
    def ready(self) -> bool:
        """Loaded, with at least one healthy instance."""
        return self.loaded and any(instance.healthy for instance in self.instances)

    def health_error(self) -> ServerError | None:
        """Why no instance can serve now, or None when one can."""
        if any(instance.healthy for instance in self.instances):
            return None
        unhealthy = self.instances[0] if self.instances else None
        if unhealthy is None:
            return ServerError(f"Model '{self.name}' version {self.version} has no instances", Status.UNAVAILABLE)
        return unhealthy.unhealthy_error()

    async def check_ready(self) -> str | None:
        """None when the version can serve and its model says it is ready (`is_ready`), else why not."""
        if not self.loaded:
            return f"Model '{self.name}' version {self.version} is not loaded"
        error = self.health_error()
        if error is not None:
            return error.message
        reasons = await asyncio.gather(*(i.check_ready() for i in self.instances if i.healthy))
        return None if any(reason is None for reason in reasons) else next(r for r in reasons if r)

    # -- loading -------------------------------------------------------------------------------------
    def _spec(self, placement: Placement, config_json: str, sources: dict[str, bytes]) -> InstanceSpec:
        parameters = config_parameters(self.config)
        rlimits = {limit: _parameter_number(parameters, name, int) for name, limit in RLIMIT_PARAMETERS.items()}
        python = None
        if parameters.get("EXECUTION_ENV_PATH"):
            try:
                python = interpreter_command(resolve_execution_env(parameters["EXECUTION_ENV_PATH"],
                                                                   self.model_dir))
            except ExecutionEnvError as exc:
                raise ModelLoadError(str(exc)) from exc
        return InstanceSpec(
            model_name=self.name, model_path=self.model_path,
            args=instance_args(self.config, config_json, placement, self.model_dir, self.version),
            stub_settings={"decoupled": self.decoupled}, settings=self.settings,
            execute_timeout=_parameter_number(parameters, EXECUTE_TIMEOUT_PARAMETER, float),
            rlimits={k: v for k, v in rlimits.items() if v is not None}, python=python, services=self.services,
            sources=sources)

    async def load(self) -> None:
        """Start and initialize every instance. Raises ModelLoadError (and stops what started)."""
        self._enter(ModelState.LOADING)
        config_json = json.dumps(self.config_json)
        try:
            refusal = cache_refusal(self.config, self.decoupled)  # response cache hook: Triton's refusals
            if refusal is not None:
                raise ModelLoadError(refusal)
            if not os.path.isfile(self.model_path):
                raise ModelLoadError(f"Failed to preinitialize Python stub: Python model file not found in "
                                     f"'{os.path.abspath(self.model_path)}'")
            _check_force_cpu_only(config_parameters(self.config))
            try:
                check_placement(self.config, self.settings.gpus)
            except PlacementError as exc:
                raise ModelLoadError(f"{INVALID_ARGUMENT}{exc}") from None
            # The files restarts import: the ones this version loads now (models.snapshot).
            budget = _SNAPSHOT_FRAME_SHARE - len(config_json)
            sources = await asyncio.to_thread(snapshot_sources, self.model_path, budget)
            self.instances, self._template = plan_instances(
                self.config, placements(self.config), lambda placement: self._spec(placement, config_json, sources))
            self._updates.loaded(self.instances, self.config, config_json, sources)
            state = ImplicitState.from_config(self.config, self.model_dir)  # implicit state hook (load checks)
            # rate limiter hook: with --rate-limit=execution_count, executes wait for their group's resources
            scheduled = self._scheduled = rate_limited(self.instances, self.config, self._rate_limiter)
            await asyncio.gather(*(instance.start() for instance in self.instances))
            # config-sections hook: model_warmup runs on every instance before the model is ready
            await run_warmup(self.config, self.model_dir, self.instances, self.settings.stub_init_timeout_seconds)
        except (StubStartError, ModelLoadError, RateLimitError, StateConfigError, WarmupError, OSError) as exc:
            await self._stop_instances(self.settings.stub_timeout_seconds)
            self._enter(ModelState.UNAVAILABLE, str(exc))
            raise ModelLoadError(str(exc)) from exc
        except asyncio.CancelledError:  # the load was given up: stop what started, then end as asked
            await self._stop_instances(self.settings.stub_timeout_seconds)
            self._enter(ModelState.UNAVAILABLE, "loading was cancelled")
            raise
        for instance in self.instances:
            instance.on_change(self._instances_changed)
        self._instances_changed()
        scheduler = make_scheduler(self.config, scheduled, self.stats)
        if state is not None:  # implicit state hook: the sequence batcher adds and hides the state tensors
            scheduler.implicit_state = state
        self.scheduler = scheduler
        scheduler.start()
        # Hangs (frozen heartbeat, execute deadline) are the supervisor's to find; deaths it sees at once.
        interval = min(0.5, self.settings.heartbeat_timeout_seconds / 4)
        self._monitor = asyncio.ensure_future(watch_health(lambda: [*self.instances, *self._updates.draining],
                                                           interval))
        self._enter(ModelState.READY, "")

    # -- serving -------------------------------------------------------------------------------------
    def _instances_changed(self) -> None:
        self._usable = any(instance.usable for instance in self.instances)
        self._route()

    def infer(self, request: InferRequest, batch_size: int) -> Awaitable[InferResponse]:
        """Schedule the (validated) request: what the caller awaits for its response (the
        scheduler's own coroutine: no frame of this one in between). Raises ServerError (now, or
        from the await).

        An instance that is restarting is expected back: its requests wait in the queue for it.
        """
        scheduler = self._serving_scheduler()
        request.model_version = self.version_text
        if self.response_cache is not None:  # response cache hook: a hit never reaches the scheduler
            return cached_infer(self.response_cache, self.stats, request,
                                lambda: scheduler.schedule(request, batch_size))
        return scheduler.schedule(request, batch_size)

    async def infer_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """Schedule the (validated) request; its responses arrive on the stream. Raises ServerError."""
        scheduler = self._serving_scheduler()
        request.model_version = self.version_text  # responses name the version that served them
        if self.response_cache is not None:  # response cache hook (default-mode models only: one response)
            request.device_outputs = None  # the cache keeps host bytes: a BLS caller gets a host copy on its GPU
            return await cached_stream(self.response_cache, self.stats, request,
                                       lambda: scheduler.schedule(request, batch_size))
        return await scheduler.schedule_stream(request, batch_size)

    def _serving_scheduler(self) -> Scheduler:
        """The scheduler, when the version can take requests. Raises ServerError."""
        if self.scheduler is None or not self.loaded:
            raise ServerError(f"Request for unknown model: '{self.name}' version {self.version} is not at "
                              f"ready state", Status.UNAVAILABLE)
        if not self._usable:
            raise self.health_error() or ServerError(f"Model '{self.name}' has no usable instance",
                                                     Status.UNAVAILABLE)
        return self.scheduler

    # -- updates that change only the instances (models.instance_update) -------------------------------
    def updatable_to(self, config: ModelConfig) -> bool:
        """Whether `config` (normalized) can replace this version's by adding and removing instances
        alone. A multiplexing model and one whose instances share their weights (pystub extensions)
        are always reloaded."""
        return (self.loaded and self.scheduler is not None and multiplex_settings(self.config) is None
                and self._template is None and only_instances_differ(self.config, config))

    async def prepare_instances(self, config: ModelConfig) -> PreparedUpdate:
        """Start (and warm up) the instances `config` adds, named as Triton names them; nothing that
        serves changes. Raises ModelLoadError (what started is stopped; the version serves on, its
        index row saying why the update failed)."""
        update = self._updates.prepare(self.instances, config)
        created = [ModelInstance(name, self._spec(wanted.placement, self._updates.config_json, self._updates.sources))
                   for name, wanted in update.names()]
        try:
            update.started(created, limit_instances(created, update.groups(), self._rate_limiter))
            await asyncio.gather(*(instance.start() for instance in created))
            await run_warmup(self.config, self.model_dir, created, self.settings.stub_init_timeout_seconds)
        except (StubStartError, ModelLoadError, RateLimitError, WarmupError, OSError) as exc:
            await self._discard(update)
            self.reason = failure_with_status(str(exc))  # the index row says it, READY (as Triton 2.51)
            raise ModelLoadError(str(exc)) from exc
        except asyncio.CancelledError:
            await self._discard(update)
            raise
        return update

    async def _discard(self, update: PreparedUpdate) -> None:
        """An update failed: its new instances are finalized and stopped (as Triton 2.51 does)."""
        unregister(update.scheduled)
        await asyncio.gather(*(instance.stop(self.settings.stub_timeout_seconds) for instance in update.created))

    async def apply_instances(self, update: PreparedUpdate) -> None:
        """Serve on the new instances and the new config; the removed instances get no new work and
        stop once the work they hold ended: their executes (the update waits for them, at most the
        exit timeout), or with the sequence batcher the sequences they hold (in the background, as
        Triton 2.51: the update returns at once)."""
        assert self.scheduler is not None
        scheduler = self.scheduler
        for instance in update.created:
            instance.on_change(self._instances_changed)
        self._updates.adopt(update)
        scheduler.add_instances(update.scheduled)
        scheduled = {**dict(zip(self.instances, self._scheduled, strict=True)),
                     **dict(zip(update.created, update.scheduled, strict=True))}
        self.instances = update.order()
        self._scheduled = [scheduled[instance] for instance in self.instances]
        self.config, self.config_json, self.reason = update.config, config_to_json(update.config), ""
        self._instances_changed()
        removals = [self._remove(instance, scheduled[instance]) for instance in update.removed]
        if self.config.HasField("sequence_batching"):
            for instance, removal in zip(update.removed, removals, strict=True):
                self._updates.drain_in_background(instance, removal)
        else:
            await asyncio.gather(*removals)

    async def _remove(self, instance: ModelInstance, scheduled: StubInstance) -> None:
        assert self.scheduler is not None
        drained = self.scheduler.remove_instance(scheduled)
        if not self.config.HasField("sequence_batching"):  # sequences end by END or idle eviction
            drained = asyncio.wait_for(drained, self.settings.exit_timeout_seconds)
        finalize_timeout = self.settings.stub_timeout_seconds
        try:
            await drained
        except asyncio.TimeoutError:  # its executes are failed by the stop, as an unload fails them
            log.warning("instance '%s' of model '%s' still executes %g s after it was removed; stopping it",
                        instance.name, self.name, self.settings.exit_timeout_seconds)
            finalize_timeout = _FINALIZE_AFTER_DRAIN_S
        finally:  # also when the version unloads meanwhile (it stops the instance itself)
            unregister([scheduled])
        await instance.stop(finalize_timeout)
        self._updates.forget(instance)

    def instance(self, name: str) -> ModelInstance | None:
        return next((i for i in self.instances if i.name == name), None)

    async def unload(self, timeout: float) -> None:
        """Fail queued requests, finalize and stop every instance."""
        self._enter(ModelState.UNLOADING)
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        draining = await self._updates.stop_draining()  # removed by an update, still ending sequences
        if self.scheduler is not None:
            await self.scheduler.stop(f"Model '{self.name}' version {self.version} is unloading.")
        await self._stop_instances(timeout, draining)
        self._enter(ModelState.UNAVAILABLE, "unloaded")

    async def _stop_instances(self, timeout: float, draining: Sequence[ModelInstance] = ()) -> None:
        unregister(self._scheduled)  # rate limiter hook: gone instances no longer size resources
        self._scheduled = []
        await asyncio.gather(*(instance.stop(timeout) for instance in [*self.instances, *draining]))
        if self._template is not None:  # shared weights: the template goes after its instances
            await self._template.stop(timeout)
        self.instances = [i for i in self.instances if i.state is not InstanceState.STOPPED]

    def describe(self) -> dict[str, Any]:
        """The version's index row. A loaded version none of whose instances will serve again (each
        FAILED: its restarts gave up) is not READY, whatever it was at load: it says why."""
        state, reason = self.state, self.reason
        if self.loaded and self.instances and not any(instance.usable for instance in self.instances):
            state, reason = ModelState.UNAVAILABLE, self.instances[0].last_error
        return {"name": self.name, "version": str(self.version), "state": state.value, "reason": reason}
