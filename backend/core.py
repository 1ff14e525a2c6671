"""The server core: the loaded models and what the frontends ask of them (`ServerCore`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from backend.errors import ServerError
from backend.inference import InferRequest, InferResponse
from backend.model_config import ModelConfig, model_metadata
from backend.model_version import ModelLoadError, ModelVersion
from backend.repository import ModelSource, RepositoryError, find_models, prepare_model
from backend.stub_settings import StubSettings
from backend.validation import validate_request
from ipc.status import Status

__all__ = ["Core", "CoreOptions", "SERVER_NAME", "SERVER_VERSION", "EXTENSIONS"]

log = logging.getLogger("pystub.core")

SERVER_NAME = "pystub"
SERVER_VERSION = "0.1.0"
# Only what is implemented: perf_analyzer reads this list (PROTOCOL.md section 15).
EXTENSIONS = ["binary_tensor_data", "parameters", "statistics", "model_configuration"]


@dataclass
class CoreOptions:
    repositories: list[str]
    settings: StubSettings = field(default_factory=StubSettings)
    auto_complete: bool = True
    strict_readiness: bool = True
    server_id: str = SERVER_NAME


@dataclass
class _ModelEntry:
    name: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    state: str = "UNAVAILABLE"
    reason: str = ""


class Core:
    def __init__(self, options: CoreOptions) -> None:
        self.options = options
        self.server_name = options.server_id
        self.server_version = SERVER_VERSION
        self.extensions = list(EXTENSIONS)
        self._models: dict[str, _ModelEntry] = {}
        self._live = True

    # -- loading ---------------------------------------------------------------------------------
    async def load_repository(self) -> list[str]:
        """Load every model; returns the names that failed (already logged). Raises RepositoryError
        when a repository itself is unusable."""
        found = find_models(self.options.repositories)
        results = await asyncio.gather(*(self.load_model(name, path) for name, path in found.items()))
        return [name for name, ok in zip(found, results) if not ok]

    async def load_model(self, name: str, model_dir: str) -> bool:
        """Load one model (every selected version). Logs and records failures; returns success."""
        entry = self._models.setdefault(name, _ModelEntry(name))
        entry.state, entry.reason = "LOADING", ""
        try:
            source = await prepare_model(name, model_dir, self.options.settings, self.options.auto_complete)
        except RepositoryError as exc:
            self._record_failure(entry, None, str(exc))
            return False
        return await self._load_versions(entry, source)

    async def _load_versions(self, entry: _ModelEntry, source: ModelSource) -> bool:
        ok = True
        for version in source.versions:
            model_version = ModelVersion(source.config, version, source.model_dir, source.model_path(version),
                                         self.options.settings)
            try:
                await model_version.load()
            except ModelLoadError as exc:
                self._record_failure(entry, version, str(exc))
                ok = False
                continue
            entry.versions[version] = model_version
            log.info("successfully loaded '%s' version %d", entry.name, version)
        if ok:
            entry.state, entry.reason = "READY", ""
        return ok

    def _record_failure(self, entry: _ModelEntry, version: int | None, text: str) -> None:
        entry.state, entry.reason = "UNAVAILABLE", text
        where = f" version {version}" if version is not None else ""
        log.error("failed to load '%s'%s: Internal: %s", entry.name, where, text)

    async def unload_all(self) -> None:
        self._live = False
        timeout = self.options.settings.exit_timeout_seconds
        await asyncio.gather(*(version.unload(timeout) for entry in self._models.values()
                               for version in entry.versions.values()))
        for entry in self._models.values():
            entry.versions.clear()
            entry.state, entry.reason = "UNAVAILABLE", "unloaded"

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
            if require_ready and not found.ready:
                raise ServerError(f"Request for unknown model: '{name}' version {version} is not at ready state",
                                  Status.UNAVAILABLE)
            return found
        candidates = [v for _, v in sorted(entry.versions.items(), reverse=True) if v.ready or not require_ready]
        if not candidates:
            raise ServerError(f"Request for unknown model: '{name}' has no available versions", Status.NOT_FOUND)
        return candidates[0]

    # -- ServerCore --------------------------------------------------------------------------------
    def is_live(self) -> bool:
        return self._live

    def is_ready(self) -> bool:
        if not self._live:
            return False
        if not self.options.strict_readiness:
            return True
        return all(any(v.ready for v in entry.versions.values()) for entry in self._models.values())

    async def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self._lookup(name, version)
        except ServerError:
            return False
        return True

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        found = self._lookup(name, version, require_ready=False)
        entry = self._models[name]
        return model_metadata(found.config, [str(v) for v in sorted(entry.versions)])

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._lookup(name, version, require_ready=False).config

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        return self._lookup(name, version, require_ready=False).config_json

    async def infer(self, request: InferRequest) -> InferResponse:
        model_version = self._lookup(request.model_name, request.model_version)
        batch_size = validate_request(request, model_version.config)
        return await model_version.infer(request, batch_size)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        index = []
        for name, entry in sorted(self._models.items()):
            if entry.versions:
                rows = [v.describe() for _, v in sorted(entry.versions.items())]
            else:
                rows = [{"name": name, "version": "", "state": entry.state, "reason": entry.reason}]
            index.extend(row for row in rows if not ready_only or row["state"] == "READY")
        return index

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
