"""Model control: loading, reloading and unloading models, repository polling, the repository index
(docs/reference/protocol.md#model-repository-extension).

    load_model ──▶ _exclusive(name) ──▶ _load: prepare_model ─▶ start_versions ─▶ _install (swap in,
                   (one operation per      retire the old versions) ── a failure leaves what served
                    model at a time)
    unload_model ─▶ _exclusive(name) ──▶ _unload: out of the table, then retire each version
    poll mode: core.polling starts loads, reloads and unloads as the repository changes

Each operation runs in a task of its own, so a client that goes away does not cancel it half-way.
A load can be cancelled until it starts swapping versions in (a newer poll supersedes it, or
shutdown comes): its new stubs are then killed, so an `initialize` that hangs holds up neither
the poll nor shutdown. Shutdown waits for the other operations. Entries and versions move
through `ModelState`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from pystub_backend.backend.config.model_config import ConfigError, ModelConfig, config_from_json
from pystub_backend.backend.core.options import CoreOptions
from pystub_backend.backend.core.polling import Fingerprint, RepositoryPoller
from pystub_backend.backend.core.table import ModelTable, check_model_name
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.models.ensemble_config import (
    composes,
    ensemble_dependencies,
    ensemble_graph_models,
    load_waves,
)
from pystub_backend.backend.models.instance_keeper import PreparedUpdate
from pystub_backend.backend.models.lifecycle import (
    InFlight,
    ModelEntry,
    apply_updates,
    prepare_updates,
    retire,
    start_versions,
    stop_versions,
    updatable_versions,
)
from pystub_backend.backend.models.overrides import LoadRequest, OverrideDir, parse_load_parameters
from pystub_backend.backend.models.repository import (
    POLL_FAILED,
    ModelSource,
    PollError,
    RepositoryError,
    check_config_name,
    check_stub_name,
    find_models,
    model_fingerprint,
    prepare_model,
)
from pystub_backend.backend.models.state import UNLOADED_REASON, ModelState
from pystub_backend.backend.models.version import ModelVersion, failure_with_status
from pystub_backend.backend.models.version_files import VersionFiles, version_files
from pystub_backend.backend.supervision.services import StubFacingCore
from pystub_backend.ipc.status import Status

__all__ = ["ModelControl"]


class _NameLock:
    """One load/unload of a name at a time; `users` counts the operations holding or awaiting it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


log = logging.getLogger("pystub.core")
_T = TypeVar("_T")

# Triton's text (model_repository_manager.cc), in every mode but explicit.
_NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


def _load_error(name: str, text: str) -> ServerError:
    return ServerError(f"load failed for model '{name}': {text}", Status.INVALID_ARG)


def _version_failures(failed: dict[int, str], refused: dict[int, str] | None = None) -> str:
    """`failed`: versions that did not load; `refused`: versions whose instance update failed, which
    serve on (READY). Triton ends every version's line with ";\n", the last one included."""
    states = {**{v: (ModelState.UNAVAILABLE, r) for v, r in failed.items()},
              **{v: (ModelState.READY, r) for v, r in (refused or {}).items()}}
    return "".join(f"version {v} is at {state.value} state: {failure_with_status(reason)};\n"
                   for v, (state, reason) in sorted(states.items()))


def _raise_unexpected(results: list[object]) -> None:
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, ServerError):
            raise result


def _override_config(request: LoadRequest | None, name: str) -> ModelConfig | None:
    """The load request's `config` override for model `name`. Raises PollError for text that is
    not JSON or a config naming another model (Triton reports both as a failed poll: a name the
    repository cannot hold, braces included, is just another name), ConfigError for JSON that is
    no config."""
    if request is None or not request.config:
        return None
    try:
        json.loads(request.config)
    except ValueError as exc:
        raise PollError(f"failed to parse model configuration JSON: {exc}") from None
    config = config_from_json(request.config)
    check_config_name(name, config)
    return config


class ModelControl:
    """Loads and unloads the models of `table`. `context` (the core) reaches the stubs' feature
    handlers; `in_flight` is what retiring a version drains."""

    def __init__(self, options: CoreOptions, table: ModelTable, in_flight: InFlight, context: StubFacingCore) -> None:
        self.options = options
        self._table = table
        self._in_flight = in_flight
        self._context = context
        self._locks: dict[str, _NameLock] = {}  # only while an operation on the name runs or waits
        self._operations: set[asyncio.Task[Any]] = set()
        self._load_slots = asyncio.Semaphore(options.load_thread_count)  # --model-load-thread-count
        self._polling = RepositoryPoller(options.repositories, table, self)
        self._poller: asyncio.Task[None] | None = None  # poll_forever, in poll mode
        self._loads: dict[asyncio.Task[Any], str] = {}  # loads running or waiting, by task: the name
        self._committing: set[str] = set()  # names whose load swaps versions in: no longer cancellable
        self._closing = False

    # -- start-up and shutdown -------------------------------------------------------------------
    async def load_repository(self) -> list[str]:
        """Load the models the control mode selects at start-up and, in poll mode, start polling.
        Returns the names that failed (already logged). Raises RepositoryError when a repository
        itself is unusable."""
        found = find_models(self.options.repositories)
        names = list(found)
        if self.options.model_control_mode == "explicit" and "*" not in self.options.startup_models:
            names = list(dict.fromkeys(self.options.startup_models))
        fingerprints: dict[str, Fingerprint] = {}
        if self.options.model_control_mode == "poll":  # what the first poll compares against
            fingerprints = await asyncio.to_thread(lambda: {n: model_fingerprint(p) for n, p in found.items()})
        results: list[object] = []
        ordered: list[str] = []
        for wave in load_waves(names, found):  # ensembles after the models they compose
            ordered.extend(wave)
            results.extend(await asyncio.gather(
                *(self._exclusive(name, lambda name=name: self._load(name, found.get(name), None,  # type: ignore[misc]
                                                                     fingerprints.get(name)))
                  for name in wave), return_exceptions=True))
        _raise_unexpected(results)
        if self.options.model_control_mode == "poll":
            self._poller = asyncio.ensure_future(self._polling.poll_forever(self.options.poll_seconds))
        return [name for name, result in zip(ordered, results, strict=True) if result is not None]

    async def unload_all(self) -> None:
        """Stop polling, cancel the loads still starting, let the other operations finish, then
        drain and unload every model."""
        self._closing = True
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        self.cancel_loads(None)
        await asyncio.gather(*list(self._operations), return_exceptions=True)
        await asyncio.gather(*(self._unload(name) for name in list(self._table.entries)))

    # -- requests (explicit mode) -----------------------------------------------------------------
    async def load_model(self, name: str, parameters: dict[str, Any] | None = None,
                         _seen: frozenset[str] = frozenset()) -> None:
        """Load (or reload) a model; explicit mode only. `parameters`: `config` (str) and
        `file:<path>` (bytes). Raises ServerError."""
        self._require_explicit()
        # Here what cannot be kept or logged; what a stub cannot carry is checked in _prepare, once
        # the repository was polled for the name (Triton's order: an unknown name is a failed poll).
        check_model_name(name)
        request = parse_load_parameters(parameters or {})
        model_dir = None
        if not request.files:
            try:
                model_dir = find_models(self.options.repositories).get(name)
            except RepositoryError as exc:
                raise ServerError(str(exc), Status.INTERNAL) from None
        await self._load_composing_models(name, model_dir, request, _seen)
        await self._exclusive(name, lambda: self._load(name, model_dir, request, None), load=True)

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
            if dependency in found and dependency not in seen and not self._table.loaded(dependency):
                await self.load_model(dependency, None, seen | {name})

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Drain and unload a model; explicit mode only. With `unload_dependents`, the loaded
        ensembles that compose it are unloaded too. Unloading what is not loaded succeeds."""
        self._require_explicit()
        check_model_name(name)
        dependents = (parameters or {}).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise ServerError("Unload parameter 'unload_dependents' must be a boolean", Status.INVALID_ARG)
        await self._exclusive(name, lambda: self._unload(name))
        if dependents:
            entries = self._table.entries.values()
            for ensemble in [e.name for e in entries if composes(e.versions.values(), name)]:
                await self.unload_model(ensemble, {"unload_dependents": True})

    def _require_explicit(self) -> None:
        if self.options.model_control_mode != "explicit":
            raise ServerError(_NOT_EXPLICIT, Status.UNAVAILABLE)

    async def _exclusive(self, name: str, operation: Callable[[], Awaitable[_T]], load: bool = False) -> _T:
        """Run one load/unload of `name` after the previous one ended, in a task of its own."""
        return await asyncio.shield(self._start_operation(name, operation, load))

    def start_load(self, name: str, path: str, fingerprint: Fingerprint) -> asyncio.Task[None]:
        """Start loading `name` from `path` (poll mode); the task ends when the load did."""
        return self._start_operation(name, lambda: self._load(name, path, None, fingerprint), load=True)

    def start_unload(self, name: str) -> asyncio.Task[None]:
        return self._start_operation(name, lambda: self._unload(name), load=False)

    def cancel_loads(self, name: str | None) -> None:
        """Cancel the loads of `name` (None: of every name) that have not begun swapping versions
        in; each kills the stubs it started."""
        for task, loading in list(self._loads.items()):
            if (name is None or loading == name) and loading not in self._committing:
                task.cancel()

    def _start_operation(self, name: str, operation: Callable[[], Awaitable[_T]], load: bool) -> asyncio.Task[_T]:
        if self._closing:
            raise ServerError("the server is shutting down", Status.UNAVAILABLE)
        lock = self._locks.setdefault(name, _NameLock())
        lock.users += 1

        async def run() -> _T:
            try:
                async with lock.lock:
                    return await operation()
            finally:
                lock.users -= 1
                if lock.users == 0 and self._locks.get(name) is lock:
                    del self._locks[name]  # a name's lock lives while someone uses it, not forever

        task = asyncio.ensure_future(run())
        self._operations.add(task)
        if load:
            self._loads[task] = name
        task.add_done_callback(self._operation_done)
        return task

    def _operation_done(self, task: asyncio.Task[Any]) -> None:
        self._operations.discard(task)
        self._loads.pop(task, None)
        if not task.cancelled():
            task.exception()  # retrieved here: the caller that awaited it may be gone

    # -- loading -----------------------------------------------------------------------------------
    async def _load(self, name: str, model_dir: str | None, request: LoadRequest | None,
                    fingerprint: Fingerprint | None) -> None:
        """Load `name` from `model_dir` (or the request's override files); reload it if loaded.
        A failed reload leaves the loaded versions serving. Raises ServerError (logged). A failed
        load of a name the repository does not hold leaves no entry."""
        created = name not in self._table.entries
        entry = self._table.entries.setdefault(name, ModelEntry(name))
        try:
            await self._load_entry(entry, model_dir, request, fingerprint)
        except asyncio.CancelledError:
            if not entry.versions:
                entry.state, entry.reason = ModelState.UNAVAILABLE, "loading was cancelled"
            raise
        except ServerError:
            if created and model_dir is None:
                self._table.forget_if_unheld(entry, await asyncio.to_thread(self._held, name))
            raise

    def _held(self, name: str) -> bool:
        """Whether a repository has a directory of this name (an unreadable repository counts as yes:
        the entry then stays, as it always did)."""
        try:
            return name in find_models(self.options.repositories)
        except RepositoryError:
            return True

    async def _load_entry(self, entry: ModelEntry, model_dir: str | None, request: LoadRequest | None,
                          fingerprint: Fingerprint | None) -> None:
        name = entry.name
        if fingerprint is not None:
            entry.fingerprint = fingerprint
        source, override = await self._prepare(entry, model_dir, request)
        files = await asyncio.to_thread(version_files, source.model_dir, source.versions,
                                        self.options.model_config_name)
        kept = updatable_versions(entry, source, files, override is not None)  # updated in place
        loaded, failed = await self._start_versions(replace(source, versions=[v for v in source.versions
                                                                              if v not in kept]))
        for version in loaded.values():
            version.stats.loaded()  # nv_model_load_duration_secs
        if failed and (entry.versions or not loaded):
            await stop_versions(loaded, self.options.settings.stub_timeout_seconds)
            if override is not None:
                override.remove()
            if not entry.versions:
                entry.state, entry.reason = ModelState.UNAVAILABLE, "; ".join(failed.values())
                entry.failed, entry.unloaded = failed, []
            raise _load_error(name, _version_failures(failed))
        try:
            async with self._load_slots:
                updates, refused = await prepare_updates(kept, source.config)
        except asyncio.CancelledError:  # superseded or shut down: the updates stopped what they started
            await stop_versions(loaded, self.options.settings.stub_timeout_seconds)
            raise
        await self._install(entry, {**kept, **loaded}, failed, override, (updates, files))
        if failed or refused:
            raise _load_error(name, _version_failures(failed, refused))

    async def _prepare(self, entry: ModelEntry, model_dir: str | None, request: LoadRequest | None
                       ) -> tuple[ModelSource, OverrideDir | None]:
        """The model's source (config, versions) and its override directory. Raises ServerError
        (logged); the entry then shows why, unless versions of it serve on."""
        name, override = entry.name, None
        try:
            config = _override_config(request, name)
            files = request.files if request is not None else None
            if model_dir is None and not files:   # a failed poll, whatever the name (braces too)
                raise PollError(f"model '{name}' is not found in any model repository")
            check_stub_name(name)
            if files:
                override = await OverrideDir.create_off_loop(name, files)
                model_dir = override.model_dir
            assert model_dir is not None  # found in a repository, or made from the request's files
            if not entry.versions:
                entry.state, entry.reason = ModelState.LOADING, ""
            source = await prepare_model(name, model_dir, self.options.settings, self.options.auto_complete, config,
                                         self.options.backend_directory, self.options.model_config_name)
        except (RepositoryError, ConfigError, ServerError) as exc:
            if override is not None:
                override.remove()
            text = exc.message if isinstance(exc, ServerError) else str(exc)
            log.error("failed to load '%s': Internal: %s", name, text)
            if not entry.versions:
                entry.state, entry.reason, entry.failed, entry.unloaded = ModelState.UNAVAILABLE, text, {}, []
            if isinstance(exc, PollError):  # Triton's answer to a failed poll (the reason is logged)
                if model_dir is None and not entry.versions:  # as on Triton: a name the repository
                    self._table.entries.pop(name, None)           # does not have leaves no entry
                raise ServerError(POLL_FAILED.format(name=name), Status.INTERNAL) from None
            raise _load_error(name, text) from None
        return source, override

    async def _start_versions(self, source: ModelSource) -> tuple[dict[int, ModelVersion], dict[int, str]]:
        """`start_versions` in one of the load slots; a failure is retried `load_retry_count` times."""
        if not source.versions:  # every version is updated in place
            return {}, {}
        for attempt in range(self.options.load_retry_count + 1):
            async with self._load_slots:
                loaded, failed = await start_versions(source, self.options.settings, self._context)
            if not failed or attempt == self.options.load_retry_count:
                break
            await stop_versions(loaded, self.options.settings.stub_timeout_seconds)
            log.warning("failed to load '%s' (%s); retrying (%d of %d)", source.name, "; ".join(failed.values()),
                        attempt + 1, self.options.load_retry_count)
        return loaded, failed

    async def _install(self, entry: ModelEntry, serving: dict[int, ModelVersion], failed: dict[int, str],
                       override: OverrideDir | None,
                       updated: tuple[dict[int, PreparedUpdate], dict[int, VersionFiles]]) -> None:
        """Swap the new versions in and apply the prepared instance updates of the kept ones, then
        retire the versions no longer served and the old override directory."""
        self._committing.add(entry.name)  # from here on the swap must finish: retiring is not undone
        updates, files = updated
        try:
            old, old_override = entry.versions, entry.override
            # A version kept (updated in place) never runs from an override directory: a load with
            # files of its own reloads every version (lifecycle.updatable_versions).
            entry.versions, entry.failed, entry.unloaded, entry.override = serving, failed, [], override
            entry.files = {number: files[number] for number in serving if number in files}
            entry.state, entry.reason = (ModelState.READY, "") if not failed else \
                (ModelState.UNAVAILABLE, "; ".join(failed.values()))
            await apply_updates(serving, updates)
            await self._retire(entry, {n: v for n, v in old.items() if serving.get(n) is not v})
            if old_override is not None:
                old_override.remove()
        finally:
            self._committing.discard(entry.name)

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
        entry = self._table.entries.get(name)
        if entry is None:
            return
        versions, entry.versions = entry.versions, {}
        had = sorted(set(versions) | set(entry.failed) | set(entry.unloaded))
        entry.state, entry.reason, entry.failed = ModelState.UNLOADING, "", {}
        await self._retire(entry, versions)
        if entry.override is not None:
            entry.override.remove()
            entry.override = None
        entry.unloaded, entry.fingerprint, entry.files = had, None, {}
        entry.state, entry.reason = ModelState.UNAVAILABLE, UNLOADED_REASON

    # -- repository polling ------------------------------------------------------------------------
    async def poll_repository(self) -> None:
        """One poll now (core.polling): starts the loads and unloads it calls for, without waiting."""
        await self._polling.poll()

    # -- the index -----------------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """See ModelTable.index_rows; a repository that cannot be read adds no rows."""
        try:
            found = find_models(self.options.repositories)
        except RepositoryError:
            found = {}
        return self._table.index_rows(found, ready_only)
