"""Serving: what a request needs from the core, one lookup each
(docs/reference/protocol.md#listeners-limits-and-errors, #http-routes, #http-inference-and-binary-tensors,
#grpc-service, #model-configuration-and-metadata, #streaming-and-decoupled-models, #request-parameters,
#statistics-extension).

    frontend ──target(name, version)──▶ the ModelVersion (decoupled? asked once, by the frontend)
             ──infer(request, target)──▶ client shm (only when the request names a region)
                                         ──▶ validate (a failure is a REJECTED failure)
                                         ──▶ in flight (what unloading drains) ──▶ version.infer
                                             ──▶ its scheduler

`infer` takes the frontend's target as it is while it serves; if it was replaced meanwhile (a
reload), the request goes to what the model serves now, as a fresh lookup would.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

from pystub_backend.backend.config.model_config import ModelConfig, model_metadata
from pystub_backend.backend.core.table import ModelTable, check_model_name
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.bls.device_inputs import check_device_inputs
from pystub_backend.backend.features.classification import class_counts, classify
from pystub_backend.backend.features.client_shm import REGION, ClientShmRegistry
from pystub_backend.backend.inference import InferRequest, InferResponse, RequestedOutput, ServingTarget
from pystub_backend.backend.models.lifecycle import InFlight, ModelEntry
from pystub_backend.backend.models.state import ModelState
from pystub_backend.backend.models.version import ModelVersion
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.telemetry.statistics import REJECTED
from pystub_backend.ipc.status import Status

__all__ = ["Serving"]

log = logging.getLogger("pystub.core")
_T = TypeVar("_T")


def _has_parameters(outputs: list[RequestedOutput]) -> bool:
    for output in outputs:  # noqa: SIM110 - a loop: no generator per request on the hot path
        if output.parameters:
            return True
    return False


def _names_a_region(request: InferRequest) -> bool:
    # Checked here, not in the registry: most requests name none and skip it altogether (and most
    # tensors carry no parameters at all).
    for tensor in request.inputs:
        if tensor.parameters and REGION in tensor.parameters:
            return True
    for output in request.outputs:  # noqa: SIM110 - a loop: no generator per request on the hot path
        if output.parameters and REGION in output.parameters:
            return True
    return False


class Serving:
    """Lookups, metadata and inference over a ModelTable."""

    def __init__(self, table: ModelTable, client_shm: ClientShmRegistry, in_flight: InFlight) -> None:
        self._table = table
        self.client_shm = client_shm
        self._in_flight = in_flight
        self._shutting_down = False

    # -- lookups ---------------------------------------------------------------------------------
    def _known_entry(self, name: str) -> ModelEntry | None:
        """The model's entry, None when the server never knew it. Raises ServerError (INVALID_ARG)
        for a name no model can have, so it is refused as such and never echoed raw."""
        entry = self._table.entries.get(name)
        if entry is None:
            check_model_name(name)
        return entry

    def _entry(self, name: str) -> ModelEntry:
        """The model's entry. Raises ServerError (NOT_FOUND) when the server never knew it."""
        entry = self._known_entry(name)
        if entry is None:
            raise ServerError(f"Request for unknown model: '{name}' is not found", Status.NOT_FOUND)
        return entry

    @staticmethod
    def _version_named(entry: ModelEntry, version: str) -> ModelVersion | None:
        return entry.versions.get(int(version)) if version.isdigit() else None

    def _lookup(self, name: str, version: str = "", require_ready: bool = True) -> ModelVersion:
        """The model version a request names (docs/reference/protocol.md#listeners-limits-and-errors). Raises
        ServerError."""
        entry = self._entry(name)
        if version:
            found = self._version_named(entry, version)
            if found is None:
                raise ServerError(f"Request for unknown model: '{name}' version {version} is not found",
                                  Status.NOT_FOUND)
            if require_ready and found.state is not ModelState.READY:
                raise ServerError(f"Request for unknown model: '{name}' version {version} is not at ready state",
                                  Status.UNAVAILABLE)
            return found
        # "loaded", not "healthy": a version whose stub is restarting answers with the stub's error
        versions = entry.versions  # one, for nearly every model: no sort
        newest_first = versions.values() if len(versions) == 1 else \
            [v for _, v in sorted(versions.items(), reverse=True)]
        for candidate in newest_first:
            if not require_ready or candidate.state is ModelState.READY:
                return candidate
        raise ServerError(f"Request for unknown model: '{name}' has no available versions", Status.NOT_FOUND)

    def target(self, name: str, version: str = "") -> ModelVersion | None:
        """The version a request for `name` would be served by now (None when there is none: the
        request then fails with the lookup's own error)."""
        try:
            return self._lookup(name, version)
        except ServerError:
            return None

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model uses the decoupled transaction policy (False when it is unknown: the
        request then fails with the lookup's own error)."""
        try:
            return self._lookup(name, version, require_ready=False).decoupled
        except ServerError:
            return False

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
        return model_metadata(found.config, [str(v) for v in sorted(self._entry(name).versions)])

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self.version_for(name, version).config

    def version_for(self, name: str, version: str = "") -> ModelVersion:
        """The version that `name` and `version` name, ready or not (the highest when `version` is
        empty). Raises ServerError."""
        return self._lookup(name, version, require_ready=False)

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        return self._lookup(name, version, require_ready=False).config_json

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if not name:
            return [v.stats.as_dict() for v in self._table.versions()]
        # Triton's texts and status (400 / INVALID_ARGUMENT), not the inference lookup's 404
        entry = self._known_entry(name)
        if entry is None or not entry.versions:
            raise ServerError(f"requested model '{name}' is not available", Status.INVALID_ARG)
        if version:
            found = self._version_named(entry, version)
            if found is None:
                raise ServerError(f"requested model version is not available for model '{name}'", Status.INVALID_ARG)
            return [found.stats.as_dict()]
        return [v.stats.as_dict() for _, v in sorted(entry.versions.items())]

    def model_versions(self) -> list[ModelVersion]:
        """Every loaded model version, by name then version (for stubctl and metrics)."""
        return self._table.versions()

    def versions_of(self, name: str) -> list[ModelVersion]:
        """The loaded versions of one model, by version (what a BLS call's checks read: one
        lookup, not a scan of every model)."""
        return self._table.versions_of(name)

    # -- inference -------------------------------------------------------------------------------
    def _serving(self, request: InferRequest, target: ServingTarget | None) -> ModelVersion:
        if self._shutting_down:
            raise ServerError("Server is shutting down; it accepts no new inference requests.", Status.UNAVAILABLE)
        if target is not None and getattr(target, "state", None) is ModelState.READY:
            return cast(ModelVersion, target)  # what `target` gave: still serving
        return self._lookup(request.model_name, request.model_version)

    async def infer(self, request: InferRequest, target: ServingTarget | None = None) -> InferResponse:
        """The request's single response. `target`: the frontend's `target(...)` for the request,
        if it asked. Raises ServerError."""
        model_version = self._serving(request, target)
        counts = class_counts(request) if _has_parameters(request.outputs) else None  # the classification extension
        if not _names_a_region(request):
            batch_size = self._validate(model_version, request)
            request.model_version = model_version.version_text  # responses name the version that serves
            response = await self._tracked(model_version, model_version.serve(request, batch_size))
        else:
            with self.client_shm.resolve(request):  # before validation: shm inputs get their data
                batch_size = self._validate(model_version, request)
                request.model_version = model_version.version_text
                response = await self._tracked(model_version, model_version.serve(request, batch_size))
        if counts:  # the outputs' top classes instead of their values (features.classification)
            try:
                response = classify(response, counts, model_version.config, model_version.model_dir)
            except ServerError:
                response.release()
                raise
        return response

    async def infer_stream(self, request: InferRequest, target: ServingTarget | None = None) -> ResponseStream:
        """The request's responses, as they come (decoupled models, streaming frontends)."""
        model_version = self._serving(request, target)
        if any(tensor.device is not None for tensor in request.inputs):
            check_device_inputs(request, model_version.config)  # BLS GPU inputs: before anything reads them
        lease = self.client_shm.resolve(request) if _names_a_region(request) else None
        try:
            batch_size = self._validate(model_version, request)
            stream = await self._tracked(model_version, model_version.infer_stream(request, batch_size))
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        if lease is not None:
            stream.when_final(lambda _: lease.release())
        self._in_flight.enter_stream(model_version, stream)  # until its final response
        return stream

    @staticmethod
    def _validate(model_version: ModelVersion, request: InferRequest) -> int:
        """The request's batch size. Raises ServerError, counted (as in Triton) as a REJECTED
        failure of the model version."""
        started = time.monotonic_ns()
        try:
            return model_version.checks.validate(request)
        except ServerError:
            model_version.stats.record_failure(time.monotonic_ns() - started, REJECTED)
            raise

    async def _tracked(self, model_version: ModelVersion, call: Awaitable[_T]) -> _T:
        """Await `call` as an in-flight request of `model_version`: what unloading it drains
        (InFlight.enter and leave, written out here: this runs for every request)."""
        task = asyncio.current_task()
        tracked = model_version.in_flight
        if task is not None:
            tracked.add(task)
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
            if task is not None:
                tracked.discard(task)
                if self._in_flight.abandoned:
                    self._in_flight.abandoned.pop(task, None)
