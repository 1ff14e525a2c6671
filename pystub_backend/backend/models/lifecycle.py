"""One model's versions over time: starting a set of versions, and retiring (draining, then
unloading) a version that is being replaced or unloaded (docs/reference/protocol.md#model-repository-extension).

    load:    prepare_model → start_versions (new stubs) → swap them into the entry → retire the old
    update:  a loaded version whose files are unchanged and whose config differs only in its
             instances (models.instance_update) is not replaced: prepare_updates starts the instances
             it adds, apply_updates makes them serve and drains and stops the ones it removes
    unload:  take the versions out of the entry → retire each
    retire:  (already unreachable by lookups) fail its queued requests → wait for the ones in
             flight, up to the exit timeout → fail whatever is left → ModelVersion.unload

A version leaves the lookups before it is drained, so no new request reaches it; requests for
the model go to the new versions at once during a reload.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.models.config_support import log_unused_fields
from pystub_backend.backend.models.ensemble import EnsembleVersion
from pystub_backend.backend.models.ensemble_config import is_ensemble
from pystub_backend.backend.models.instance_keeper import PreparedUpdate
from pystub_backend.backend.models.overrides import OverrideDir
from pystub_backend.backend.models.repository import ModelSource
from pystub_backend.backend.models.state import UNLOADED_REASON, ModelState
from pystub_backend.backend.models.version import ModelLoadError, ModelVersion, failure_with_status
from pystub_backend.backend.models.version_files import VersionFiles
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.supervision.services import StubFacingCore
from pystub_backend.backend.supervision.settings import StubSettings

__all__ = ["ModelEntry", "InFlight", "start_versions", "stop_versions", "retire", "updatable_versions",
           "prepare_updates", "apply_updates"]

log = logging.getLogger("pystub.core")

_DRAIN_POLL_SECONDS = 0.01


class ModelEntry:
    """A model the server knows of: its serving versions and what the repository index shows."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.versions: dict[int, ModelVersion] = {}
        self.failed: dict[int, str] = {}  # versions that failed to load, with the reason
        self.retiring: dict[int, ModelVersion] = {}  # being drained and unloaded
        self.unloaded: list[int] = []
        self.state = ModelState.UNAVAILABLE  # for the index when no version row says more
        self.reason = ""
        self.override: OverrideDir | None = None  # the file-override directory the versions run from
        self.fingerprint: frozenset[Any] | None = None  # of the directory it was loaded from (polling)
        self.files: dict[int, VersionFiles] = {}  # each serving version's files when it loaded

    @property
    def is_unloaded(self) -> bool:
        """Unloaded on purpose: it does not count against strict readiness (as in Triton)."""
        return not self.versions and self.state == ModelState.UNAVAILABLE and self.reason == UNLOADED_REASON

    def index_rows(self) -> list[dict[str, str]]:
        rows = {version: model_version.describe() for version, model_version in self.versions.items()}
        for version in self.retiring:
            rows.setdefault(version, self._row(version, ModelState.UNLOADING, ""))
        for version, reason in self.failed.items():
            rows.setdefault(version, self._row(version, ModelState.UNAVAILABLE, reason))
        for version in self.unloaded:
            rows.setdefault(version, self._row(version, ModelState.UNAVAILABLE, UNLOADED_REASON))
        if not rows:
            return [{"name": self.name, "version": "", "state": self.state.value, "reason": self.reason}]
        return [rows[version] for version in sorted(rows)]

    def _row(self, version: int, state: ModelState, reason: str) -> dict[str, str]:
        return {"name": self.name, "version": str(version), "state": state.value, "reason": reason}


class InFlight:
    """The requests of each model version that are in flight: what retiring a version waits for.

    A request is tracked as the task serving it while it waits for the scheduler, then (for
    streamed requests) as its `ResponseStream` until the final response is in. A request still
    in flight when its version's drain times out is "abandoned": a task is cancelled and
    `Core` turns that cancellation into the recorded error; a stream is ended with that error.
    Either way the client gets an answer instead of waiting on a stopped stub.

    The tracked items live in each version's own `in_flight` set, so that the serving path adds
    and discards its task there itself (core.serving: no call into this class per request);
    `abandoned` maps the tasks `abandon` cancelled to the error they answer with.
    """

    def __init__(self) -> None:
        self.abandoned: dict[asyncio.Task[Any], ServerError] = {}

    def enter(self, version: ModelVersion) -> asyncio.Task[Any] | None:
        task = asyncio.current_task()
        if task is not None:
            version.in_flight.add(task)
        return task

    def leave(self, version: ModelVersion, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self.abandoned.pop(task, None)
            version.in_flight.discard(task)

    def enter_stream(self, version: ModelVersion, stream: ResponseStream) -> None:
        """Track `stream` until its final response."""
        version.in_flight.add(stream)
        stream.when_final(version.in_flight.discard)

    def count(self, version: ModelVersion) -> int:
        return len(version.in_flight)

    async def drain(self, version: ModelVersion, timeout: float) -> int:
        """Wait until no request of `version` is in flight, at most `timeout` s; returns how many
        still are."""
        deadline = time.monotonic() + timeout
        while self.count(version) and time.monotonic() < deadline:
            await asyncio.sleep(_DRAIN_POLL_SECONDS)
        return self.count(version)

    def abandon(self, version: ModelVersion, error: ServerError) -> None:
        for item in list(version.in_flight):
            if isinstance(item, asyncio.Task):
                if not item.done():
                    self.abandoned[item] = error
                    item.cancel()
            else:
                item.fail(error)

    def abandoned_error(self, task: asyncio.Task[Any] | None) -> ServerError | None:
        """The error to answer with if `task` was cancelled by `abandon` (None: a real cancel)."""
        return self.abandoned.get(task) if task is not None else None


async def start_versions(source: ModelSource, settings: StubSettings, context: StubFacingCore
                         ) -> tuple[dict[int, ModelVersion], dict[int, str]]:
    """Load every version `source` selects, concurrently. Returns the loaded versions and the
    reasons of those that failed (already logged). `context` (the core) reaches the stubs'
    feature handlers."""

    made: list[Any] = []

    async def start(version: int) -> Any:
        model_version = _make_version(source, version, settings, context)
        made.append(model_version)
        fields = {"model": source.name, "version": version}
        # Said before the stubs start: a slow initialize must not look like a hung server.
        log.info("loading '%s' version %d", source.name, version, extra=fields)
        started = time.monotonic()
        try:
            await model_version.load()
        except ModelLoadError as exc:
            log.error("failed to load '%s' version %d: %s", source.name, version, failure_with_status(str(exc)),
                      extra=fields)
            return str(exc)
        seconds = time.monotonic() - started
        log.info("successfully loaded '%s' version %d in %.3f s", source.name, version, seconds,
                 extra={**fields, "duration_ms": round(seconds * 1000, 3)})
        return model_version

    log_unused_fields(source.config)  # config-sections hook: name the fields pystub ignores, once per load
    try:
        results = await asyncio.gather(*(start(version) for version in source.versions))
    except asyncio.CancelledError:  # the versions still starting stopped themselves; stop the started ones
        await stop_versions({v.version: v for v in made if v.loaded}, settings.stub_timeout_seconds)
        raise
    loaded = {v: r for v, r in zip(source.versions, results, strict=True) if not isinstance(r, str)}
    failed = {v: r for v, r in zip(source.versions, results, strict=True) if isinstance(r, str)}
    return loaded, failed


def _make_version(source: ModelSource, version: int, settings: StubSettings, context: StubFacingCore
                  ) -> ModelVersion | EnsembleVersion:
    if is_ensemble(source.config):  # no model.py and no instances: the steps run on other models
        return EnsembleVersion(source.config, version, source.model_dir, context)
    return ModelVersion(source.config, version, source.model_dir, source.model_path(version), settings, context)


def updatable_versions(entry: ModelEntry, source: ModelSource, files: dict[int, VersionFiles],
                       from_files: bool) -> dict[int, ModelVersion]:
    """The serving versions a load of `source` updates in place instead of reloading (Triton 2.51's
    rule): still selected, loaded from the same directory (`from_files`: the load brings files of
    its own), their files unchanged since they loaded, their config different in the instances
    alone (or not at all)."""
    if from_files:
        return {}
    return {number: version for number, version in entry.versions.items()
            if number in files and isinstance(version, ModelVersion) and version.model_dir == source.model_dir
            and entry.files.get(number) == files[number] and version.updatable_to(source.config)}


async def prepare_updates(versions: dict[int, ModelVersion], config: ModelConfig
                          ) -> tuple[dict[int, PreparedUpdate], dict[int, str]]:
    """Start the instances each version's update adds, concurrently. Returns the prepared updates
    and the reasons of those that failed (logged; those versions serve on unchanged)."""

    async def prepare(version: ModelVersion) -> PreparedUpdate | str:
        fields = {"model": version.name, "version": version.version}
        log.info("loading '%s' version %d: updating its instances in place", version.name, version.version,
                 extra=fields)
        try:
            return await version.prepare_instances(config)
        except ModelLoadError as exc:
            log.error("failed to update the instances of '%s' version %d: %s", version.name, version.version,
                      failure_with_status(str(exc)), extra=fields)
            return str(exc)

    results = await asyncio.gather(*(prepare(version) for version in versions.values()))
    prepared = {n: r for n, r in zip(versions, results, strict=True) if not isinstance(r, str)}
    return prepared, {n: r for n, r in zip(versions, results, strict=True) if isinstance(r, str)}


async def apply_updates(versions: dict[int, ModelVersion], updates: dict[int, PreparedUpdate]) -> None:
    """Make each prepared update serve (models.version.ModelVersion.apply_instances)."""

    async def apply(version: ModelVersion, update: PreparedUpdate) -> None:
        await version.apply_instances(update)
        log.info("successfully loaded '%s' version %d (%d instance(s) added, %d removed)", version.name,
                 version.version, len(update.created), len(update.removed),
                 extra={"model": version.name, "version": version.version})

    await asyncio.gather(*(apply(versions[number], update) for number, update in updates.items()))


async def stop_versions(versions: dict[int, ModelVersion], timeout: float) -> None:
    """Unload versions that never served (a reload that failed part-way)."""
    await asyncio.gather(*(version.unload(timeout) for version in versions.values()))


def _fail_queued(version: ModelVersion, error: ServerError) -> int:
    """Fail the requests still waiting in the version's scheduler; returns how many."""
    return version.scheduler.fail_queued(error) if version.scheduler is not None else 0


async def retire(version: ModelVersion, in_flight: InFlight, timeout: float) -> None:
    """Drain and unload a version that lookups no longer reach. Bounded by about twice `timeout`
    (the drain, then the stub's finalize) plus the kill ladder; never raises."""
    label = f"'{version.name}' version {version.version}"
    queued = _fail_queued(version, ServerError(
        f"Model {label} is unloading; the queued request was not executed.", Status.UNAVAILABLE))
    if queued:
        log.info("unloading %s: failed %d queued request(s)", label, queued)
    started = time.monotonic()
    left = await in_flight.drain(version, timeout)
    if left:
        log.warning("unloading %s: %d request(s) still in flight after %g s; failing them", label, left, timeout)
        in_flight.abandon(version, ServerError(
            f"Model {label} was unloaded before the request completed (waited {timeout:g} s).",
            Status.UNAVAILABLE))
    try:
        await version.unload(max(timeout - (time.monotonic() - started), 1.0))
    except Exception:  # one version failing to stop must not keep the others running
        log.exception("error while unloading %s", label)
    log.info("successfully unloaded %s", label)
