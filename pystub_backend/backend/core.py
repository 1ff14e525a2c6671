"""The server core: the loaded models and what the frontends ask of them (`ServerCore`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.client_shm import ClientShmRegistry
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.models.config import ConfigError, ModelConfig, config_from_json, model_metadata
from pystub_backend.backend.models.ensemble_config import (
    composes,
    ensemble_dependencies,
    ensemble_graph_models,
    load_waves,
)
from pystub_backend.backend.models.lifecycle import InFlight, ModelEntry, retire, start_versions, stop_versions
from pystub_backend.backend.models.overrides import LoadRequest, OverrideDir, parse_load_parameters
from pystub_backend.backend.models.repository import (
    ModelSource,
    RepositoryError,
    check_stub_name,
    find_models,
    model_fingerprint,
    prepare_model,
)
from pystub_backend.backend.models.validation import validate_request
from pystub_backend.backend.models.version import ModelVersion
from pystub_backend.backend.supervision.response_stream import ResponseStream
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.telemetry.statistics import REJECTED
from pystub_backend.ipc.status import Status

__all__ = ["Core", "CoreOptions", "SERVER_NAME", "SERVER_VERSION", "EXTENSIONS", "MODEL_CONTROL_MODES"]

log = logging.getLogger("pystub.core")
_T = TypeVar("_T")

SERVER_NAME = "pystub"
SERVER_VERSION = "0.1.0"
# Only what is implemented: perf_analyzer reads this list (PROTOCOL.md section 15).
EXTENSIONS = ["binary_tensor_data", "parameters", "statistics", "model_configuration", "model_repository",
              "model_repository(unload_dependents)", "logging"]
SYSTEM_SHARED_MEMORY = "system_shared_memory"  # listed only with --allow-client-shm=true
MODEL_CONTROL_MODES = ("none", "poll", "explicit")
# Triton's text (model_repository_manager.cc), in every mode but explicit.
_NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


@dataclass
class CoreOptions:
    repositories: list[str]
    settings: StubSettings = field(default_factory=StubSettings)
    auto_complete: bool = True
    strict_readiness: bool = True
    server_id: str = SERVER_NAME
    model_control_mode: str = "none"
    startup_models: list[str] = field(default_factory=list)  # explicit mode; "*" means all
    poll_seconds: float = 15.0
    allow_client_shm: bool = False  # the system shared memory extension (Triton's default: off)
    load_thread_count: int = 4  # --model-load-thread-count: models starting at the same time
    load_retry_count: int = 0  # --model-load-retry-count: further tries of a model that failed to start
    backend_directory: str = ""  # --backend-directory: Python-based backends, <dir>/<backend>/model.py
    model_config_name: str = ""  # --model-config-name: <model>/configs/<name>.pbtxt when it exists


def _load_error(name: str, text: str) -> ServerError:
    return ServerError(f"load failed for model '{name}': {text}", Status.INVALID_ARG)


def _version_failures(failed: dict[int, str]) -> str:
    return "\n".join(f"version {v} is at UNAVAILABLE state: Internal: {reason};"
                     for v, reason in sorted(failed.items()))


class Core:
    def __init__(self, options: CoreOptions) -> None:
        self.options = options
        self.server_name = options.server_id
        self.server_version = SERVER_VERSION
        self.extensions = list(EXTENSIONS)
        self.client_shm = ClientShmRegistry(options.allow_client_shm, options.settings.shm_prefix)
        if self.client_shm.enabled:
            self.extensions.append(SYSTEM_SHARED_MEMORY)
        self._models: dict[str, ModelEntry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._operations: set[asyncio.Task[Any]] = set()
        self._in_flight = InFlight()
        self._load_slots = asyncio.Semaphore(options.load_thread_count)
        self._poller: asyncio.Task[None] | None = None
        self._closing = False
        self._live = True
        self._shutting_down = False

    # -- start-up and shutdown -------------------------------------------------------------------
    async def load_repository(self) -> list[str]:
        """Load the models the control mode selects at start-up and, in poll mode, start polling.
        Returns the names that failed (already logged). Raises RepositoryError when a repository
        itself is unusable."""
        found = find_models(self.options.repositories)
        names = list(found)
        if self.options.model_control_mode == "explicit" and "*" not in self.options.startup_models:
            names = list(dict.fromkeys(self.options.startup_models))
        fingerprints: dict[str, frozenset[Any]] = {}
        if self.options.model_control_mode == "poll":  # what the first poll compares against
            fingerprints = await asyncio.to_thread(lambda: {n: model_fingerprint(p) for n, p in found.items()})
        results: list[Any] = []
        ordered: list[str] = []
        for wave in load_waves(names, found):  # ensembles after the models they compose
            ordered.extend(wave)
            results.extend(await asyncio.gather(
                *(self._exclusive(name, self._load, name, found.get(name), None, fingerprints.get(name))
                  for name in wave), return_exceptions=True))
        self._raise_unexpected(results)
        if self.options.model_control_mode == "poll":
            self._poller = asyncio.ensure_future(self._poll_forever())
        return [name for name, result in zip(ordered, results) if result is not None]

    def begin_shutdown(self) -> None:
        """Refuse new inference and fail what waits in queues; running requests go on."""
        self._shutting_down = True
        error = ServerError("Server is shutting down; the queued request was not executed.", Status.UNAVAILABLE)
        for version in self.model_versions():
            if version.scheduler is not None:
                version.scheduler.fail_queued(error)

    async def unload_all(self) -> None:
        """Stop polling, let running loads finish, then drain and unload every model."""
        self._live = False
        self._closing = True
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await asyncio.gather(*list(self._operations), return_exceptions=True)
        await asyncio.gather(*(self._unload(name) for name in list(self._models)))
        self.client_shm.close()  # the stubs are gone: unmap the clients' regions (never unlink)

    # -- model control (PROTOCOL.md section 10) ---------------------------------------------------
    async def load_model(self, name: str, parameters: dict[str, Any] | None = None,
                         _seen: frozenset[str] = frozenset()) -> None:
        """Load (or reload) a model; explicit mode only. `parameters`: `config` (str) and
        `file:<path>` (bytes). Raises ServerError."""
        self._require_explicit()
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise _load_error(name, "invalid model name")
        try:
            check_stub_name(name)
        except RepositoryError as exc:
            raise _load_error(name, str(exc)) from None
        request = parse_load_parameters(parameters or {})
        model_dir = None
        if not request.files:
            try:
                model_dir = find_models(self.options.repositories).get(name)
            except RepositoryError as exc:
                raise ServerError(str(exc), Status.INTERNAL) from None
        await self._load_composing_models(name, model_dir, request, _seen)
        await self._exclusive(name, self._load, name, model_dir, request, None)

    async def _load_composing_models(self, name: str, model_dir: str | None, request: LoadRequest,
                                     seen: frozenset[str]) -> None:
        """An ensemble's composing models that are not loaded yet load first (as in Triton)."""
        try:
            config = config_from_json(request.config) if request.config else None
        except ConfigError:
            return  # the load itself reports the bad config
        composing = ensemble_graph_models(config) if config is not None else ensemble_dependencies(model_dir)
        if not composing:
            return
        try:
            found = find_models(self.options.repositories)
        except RepositoryError:
            found = {}
        for dependency in composing:  # one that is nowhere fails the ensemble's load, which says so
            entry = self._models.get(dependency)
            loaded = entry is not None and any(v.loaded for v in entry.versions.values())
            if dependency in found and dependency not in seen and not loaded:
                await self.load_model(dependency, None, seen | {name})

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Drain and unload a model; explicit mode only. With `unload_dependents`, the loaded
        ensembles that compose it are unloaded too. Unloading what is not loaded succeeds."""
        self._require_explicit()
        dependents = (parameters or {}).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise ServerError("Unload parameter 'unload_dependents' must be a boolean", Status.INVALID_ARG)
        await self._exclusive(name, self._unload, name)
        if dependents:
            for ensemble in [e.name for e in self._models.values() if composes(e.versions.values(), name)]:
                await self.unload_model(ensemble, {"unload_dependents": True})

    def _require_explicit(self) -> None:
        if self.options.model_control_mode != "explicit":
            raise ServerError(_NOT_EXPLICIT, Status.UNAVAILABLE)

    async def _exclusive(self, name: str, function: Any, *args: Any) -> Any:
        """Run one load/unload of `name` after the previous one ended. It runs in its own task,
        so a client that goes away does not cancel it half-way; shutdown waits for it."""
        if self._closing:
            raise ServerError("the server is shutting down", Status.UNAVAILABLE)
        lock = self._locks.setdefault(name, asyncio.Lock())

        async def run() -> Any:
            async with lock:
                return await function(*args)

        task = asyncio.ensure_future(run())
        self._operations.add(task)
        task.add_done_callback(self._operation_done)
        return await asyncio.shield(task)

    def _operation_done(self, task: asyncio.Task[Any]) -> None:
        self._operations.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here: the caller that awaited it may be gone

    @staticmethod
    def _raise_unexpected(results: list[Any]) -> None:
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ServerError):
                raise result

    async def _load(self, name: str, model_dir: str | None, request: LoadRequest | None,
                    fingerprint: frozenset[Any] | None) -> None:
        """Load `name` from `model_dir` (or the request's override files); reload it if loaded.
        A failed reload leaves the loaded versions serving. Raises ServerError (logged)."""
        entry = self._models.setdefault(name, ModelEntry(name))
        if fingerprint is not None:
            entry.fingerprint = fingerprint
        override = None
        try:
            check_stub_name(name)
            config = config_from_json(request.config) if request is not None and request.config else None
            if request is not None and request.files:
                override = OverrideDir.create(name, request.files)
                model_dir = override.model_dir
            if model_dir is None:
                raise RepositoryError("failed to poll from model repository")
            if not entry.versions:
                entry.state, entry.reason = "LOADING", ""
            source = await prepare_model(name, model_dir, self.options.settings, self.options.auto_complete, config,
                                         self.options.backend_directory, self.options.model_config_name)
        except (RepositoryError, ConfigError, ServerError) as exc:
            if override is not None:
                override.remove()
            text = exc.message if isinstance(exc, ServerError) else str(exc)
            log.error("failed to load '%s': Internal: %s", name, text)
            if not entry.versions:
                entry.state, entry.reason, entry.failed, entry.unloaded = "UNAVAILABLE", text, {}, []
            raise _load_error(name, text) from None
        loaded, failed = await self._start_versions(source)
        for version in loaded.values():
            version.stats.loaded()  # nv_model_load_duration_secs
        if failed and (entry.versions or not loaded):
            await stop_versions(loaded, self.options.settings.stub_timeout_seconds)
            if override is not None:
                override.remove()
            if not entry.versions:
                entry.state, entry.reason = "UNAVAILABLE", "; ".join(failed.values())
                entry.failed, entry.unloaded = failed, []
            raise _load_error(name, _version_failures(failed))
        await self._install(entry, loaded, failed, override)
        if failed:
            raise _load_error(name, _version_failures(failed))

    async def _start_versions(self, source: ModelSource) -> tuple[dict[int, ModelVersion], dict[int, str]]:
        """`start_versions` in one of the load slots; a failure is retried `load_retry_count` times."""
        for attempt in range(self.options.load_retry_count + 1):
            async with self._load_slots:
                loaded, failed = await start_versions(source, self.options.settings, self)
            if not failed or attempt == self.options.load_retry_count:
                break
            await stop_versions(loaded, self.options.settings.stub_timeout_seconds)
            log.warning("failed to load '%s' (%s); retrying (%d of %d)", source.name, "; ".join(failed.values()),
                        attempt + 1, self.options.load_retry_count)
        return loaded, failed

    async def _install(self, entry: ModelEntry, loaded: dict[int, ModelVersion], failed: dict[int, str],
                       override: OverrideDir | None) -> None:
        """Swap the new versions in, then retire the old ones and their override directory."""
        old, old_override = entry.versions, entry.override
        entry.versions, entry.failed, entry.unloaded, entry.override = loaded, failed, [], override
        entry.state, entry.reason = ("READY", "") if not failed else ("UNAVAILABLE", "; ".join(failed.values()))
        await self._retire(entry, old)
        if old_override is not None:
            old_override.remove()

    async def _retire(self, entry: ModelEntry, versions: dict[int, ModelVersion]) -> None:
        entry.retiring.update(versions)
        timeout = self.options.settings.exit_timeout_seconds
        try:
            await asyncio.gather(*(retire(version, self._in_flight, timeout) for version in versions.values()))
        finally:
            for number, version in versions.items():
                if entry.retiring.get(number) is version:
                    del entry.retiring[number]

    async def _unload(self, name: str) -> None:
        entry = self._models.get(name)
        if entry is None:
            return
        versions, entry.versions = entry.versions, {}
        had = sorted(set(versions) | set(entry.failed) | set(entry.unloaded))
        entry.state, entry.reason, entry.failed = "UNLOADING", "", {}
        await self._retire(entry, versions)
        if entry.override is not None:
            entry.override.remove()
            entry.override = None
        entry.unloaded, entry.fingerprint = had, None
        entry.state, entry.reason = "UNAVAILABLE", "unloaded"

    # -- repository polling ------------------------------------------------------------------------
    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_seconds)
            try:
                await self.poll_repository()
            except Exception:  # a bad poll must not end polling
                log.exception("repository poll failed")

    async def poll_repository(self) -> None:
        """Load new model directories, reload changed ones, unload removed ones."""
        try:
            found = find_models(self.options.repositories)
        except RepositoryError as exc:
            log.error("repository poll: %s", exc)
            return
        fingerprints = await asyncio.to_thread(lambda: {n: model_fingerprint(p) for n, p in found.items()})
        operations = []
        for name, path in found.items():
            entry = self._models.get(name)
            if entry is None or entry.fingerprint != fingerprints[name]:
                log.info("repository poll: %s '%s'", "reloading" if entry and entry.versions else "loading", name)
                operations.append(self._exclusive(name, self._load, name, path, None, fingerprints[name]))
        for name, entry in self._models.items():
            if name not in found and entry.fingerprint is not None:
                log.info("repository poll: '%s' was removed; unloading it", name)
                operations.append(self._exclusive(name, self._unload, name))
        self._raise_unexpected(await asyncio.gather(*operations, return_exceptions=True))

    # -- lookups ---------------------------------------------------------------------------------
    def _lookup(self, name: str, version: str = "", require_ready: bool = True) -> ModelVersion:
        """The model version a request names (PROTOCOL.md section 1). Raises ServerError."""
        entry = self._models.get(name)
        if entry is None:
            raise ServerError(f"Request for unknown model: '{name}' is not found", Status.NOT_FOUND)
        if version:
            found = entry.versions.get(int(version)) if version.isdigit() else None
            if found is None:
                raise ServerError(f"Request for unknown model: '{name}' version {version} is not found",
                                  Status.NOT_FOUND)
            if require_ready and not found.loaded:
                raise ServerError(f"Request for unknown model: '{name}' version {version} is not at ready state",
                                  Status.UNAVAILABLE)
            return found
        # "loaded", not "healthy": a version whose stub is restarting answers with the stub's error
        candidates = [v for _, v in sorted(entry.versions.items(), reverse=True) if v.loaded or not require_ready]
        if not candidates:
            raise ServerError(f"Request for unknown model: '{name}' has no available versions", Status.NOT_FOUND)
        return candidates[0]

    # -- ServerCore --------------------------------------------------------------------------------
    def is_live(self) -> bool:
        return self._live

    def is_ready(self) -> bool:
        if not self._live or self._shutting_down:
            return False
        if not self.options.strict_readiness:
            return True
        # As in Triton, a model unloaded on purpose does not make the server unready.
        return all(any(v.ready for v in entry.versions.values())
                   for entry in self._models.values() if not entry.is_unloaded)

    async def model_ready(self, name: str, version: str = "") -> bool:
        try:
            found = self._lookup(name, version)
        except ServerError:
            return False
        reason = await found.check_ready()
        if reason is not None:
            log.warning("Model '%s' version %d is not ready: %s", found.name, found.version, reason)
        return reason is None

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        found = self._lookup(name, version, require_ready=False)
        entry = self._models[name]
        return model_metadata(found.config, [str(v) for v in sorted(entry.versions)])

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._lookup(name, version, require_ready=False).config

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        return self._lookup(name, version, require_ready=False).config_json

    def _check_accepting(self) -> None:
        if self._shutting_down:
            raise ServerError("Server is shutting down; it accepts no new inference requests.", Status.UNAVAILABLE)

    async def infer(self, request: InferRequest) -> InferResponse:
        self._check_accepting()
        model_version = self._lookup(request.model_name, request.model_version)
        with self.client_shm.resolve(request):  # before validation: shm inputs get their data
            batch_size = self._validate(model_version, request)
            return await self._tracked(model_version, model_version.infer(request, batch_size))

    @staticmethod
    def _validate(model_version: ModelVersion, request: InferRequest) -> int:
        """The request's batch size. Raises ServerError, counted (as in Triton) as a REJECTED
        failure of the model version."""
        started = time.monotonic_ns()
        try:
            return validate_request(request, model_version.config)
        except ServerError:
            model_version.stats.record_failure(time.monotonic_ns() - started, REJECTED)
            raise

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model uses the decoupled transaction policy (False when it is unknown: the
        request then fails with the lookup's own error)."""
        try:
            return self._lookup(name, version, require_ready=False).decoupled
        except ServerError:
            return False

    async def infer_stream(self, request: InferRequest) -> ResponseStream:
        """The request's responses, as they come (decoupled models, streaming frontends)."""
        self._check_accepting()
        model_version = self._lookup(request.model_name, request.model_version)
        lease = self.client_shm.resolve(request)  # before validation: shm inputs get their data
        try:
            batch_size = self._validate(model_version, request)
            stream = await self._tracked(model_version, model_version.infer_stream(request, batch_size))
        except BaseException:
            lease.release()
            raise
        stream.when_final(lambda _: lease.release())
        self._in_flight.enter_stream(model_version, stream)  # until its final response
        return stream

    async def _tracked(self, model_version: ModelVersion, call: Awaitable[_T]) -> _T:
        """Await `call` as an in-flight request of `model_version`: what unloading it drains."""
        task = self._in_flight.enter(model_version)
        try:
            return await call
        except asyncio.CancelledError:
            error = self._in_flight.abandoned_error(task)
            if error is None:
                raise
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
            raise error from None
        finally:
            self._in_flight.leave(model_version, task)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model the server knows of, and every model directory in the repositories that
        was never loaded (as in Triton's explicit mode, such a row has only a name)."""
        rows = [row for entry in self._models.values() for row in entry.index_rows()]
        try:
            found = find_models(self.options.repositories)
        except RepositoryError:
            found = {}
        rows.extend({"name": name} for name in found if name not in self._models)
        rows.sort(key=lambda row: (row["name"], int(row.get("version") or 0)))
        return [row for row in rows if not ready_only or row.get("state") == "READY"]

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if name:
            entry = self._models.get(name)
            if entry is None:
                raise ServerError(f"Request for unknown model: '{name}' is not found", Status.NOT_FOUND)
            if version:
                return [self._lookup(name, version, require_ready=False).stats.as_dict()]
            return [v.stats.as_dict() for _, v in sorted(entry.versions.items())]
        return [v.stats.as_dict() for _, entry in sorted(self._models.items())
                for _, v in sorted(entry.versions.items())]

    def model_versions(self) -> list[ModelVersion]:
        """Every loaded model version, by name then version (for stubctl and metrics)."""
        return [v for _, entry in sorted(self._models.items()) for _, v in sorted(entry.versions.items())]
