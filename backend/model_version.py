"""One loaded version of a model: its config, its instances (stubs), its scheduler, its statistics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from backend.errors import ServerError
from backend.inference import InferRequest, InferResponse
from backend.model_config import ModelConfig, config_to_json, instance_names, is_decoupled
from backend.scheduler import DefaultScheduler
from backend.statistics import ModelStatistics
from backend.stub_process import StubProcess, StubStartError
from backend.stub_settings import StubSettings
from ipc.status import Status

__all__ = ["ModelVersion", "ModelLoadError", "instance_args"]

log = logging.getLogger("pystub.model")


class ModelLoadError(Exception):
    """A model version failed to load; the message is what the log and the repository index show."""


def instance_args(config: ModelConfig, config_json: str, instance_name: str, kind: str,
                  model_dir: str, version: int) -> dict[str, str]:
    """The seven keys `initialize(args)` receives (API.md 2.1)."""
    return {
        "model_config": config_json,
        "model_instance_kind": kind,
        "model_instance_name": instance_name,
        "model_instance_device_id": "0",
        "model_repository": model_dir,
        "model_version": str(version),
        "model_name": config.name,
    }


class ModelVersion:
    def __init__(self, config: ModelConfig, version: int, model_dir: str, model_path: str,
                 settings: StubSettings) -> None:
        self.config = config
        self.name = config.name
        self.version = version
        self.model_dir = model_dir
        self.model_path = model_path
        self.settings = settings
        self.config_json = config_to_json(config)
        self.decoupled = is_decoupled(config)
        self.stats = ModelStatistics(self.name, str(version))
        self.instances: list[StubProcess] = []
        self.scheduler: DefaultScheduler | None = None
        self.state = "UNAVAILABLE"
        self.reason = ""

    @property
    def ready(self) -> bool:
        return self.state == "READY" and any(instance.alive for instance in self.instances)

    async def load(self) -> None:
        """Start and initialize every instance. Raises ModelLoadError (and stops what started)."""
        self.state = "LOADING"
        config_json = json.dumps(self.config_json)
        try:
            await asyncio.gather(*(self._start_instance(name, kind, config_json)
                                   for _, name, kind in instance_names(self.config)))
        except (StubStartError, OSError) as exc:
            await self._stop_instances(self.settings.stub_timeout_seconds)
            self.state, self.reason = "UNAVAILABLE", str(exc)
            raise ModelLoadError(str(exc)) from exc
        self.scheduler = DefaultScheduler(self.instances, self.stats)
        self.scheduler.start()
        self.state, self.reason = "READY", ""

    async def _start_instance(self, instance_name: str, kind: str, config_json: str) -> None:
        if not os.path.isfile(self.model_path):
            raise StubStartError(f"Failed to preinitialize Python stub: Python model file not found in "
                                 f"'{os.path.abspath(self.model_path)}'")
        instance = StubProcess(instance_name, self.settings, self.name)
        self.instances.append(instance)
        instance.spawn()
        args = instance_args(self.config, config_json, instance_name, "CPU" if kind == "GPU" else kind,
                             self.model_dir, self.version)
        await instance.initialize(self.model_path, args, {"decoupled": self.decoupled})

    async def infer(self, request: InferRequest, batch_size: int) -> InferResponse:
        """Schedule the (validated) request. Raises ServerError."""
        if self.scheduler is None or self.state != "READY":
            raise ServerError(f"Request for unknown model: '{self.name}' version {self.version} is not at "
                              f"ready state", Status.UNAVAILABLE)
        response = await self.scheduler.schedule(request, batch_size)
        response.model_version = str(self.version)
        return response

    async def unload(self, timeout: float) -> None:
        """Fail queued requests, finalize and stop every instance."""
        self.state = "UNLOADING"
        if self.scheduler is not None:
            await self.scheduler.stop(f"Model '{self.name}' version {self.version} is unloading.")
        await self._stop_instances(timeout)
        self.state, self.reason = "UNAVAILABLE", "unloaded"

    async def _stop_instances(self, timeout: float) -> None:
        instances, self.instances = self.instances, []
        await asyncio.gather(*(instance.stop(timeout) for instance in instances))

    def metadata_versions(self) -> list[str]:
        return [str(self.version)]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": str(self.version), "state": self.state, "reason": self.reason}
