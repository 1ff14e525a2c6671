"""The server core: the loaded models and what the frontends ask of them (`FrontendCore`).

    Core ── Serving       lookups, metadata, statistics, inference      (core/serving.py)
         └─ ModelControl  load / unload / poll, the repository index    (core/control.py)
    both over one ModelTable (core/table.py): model name -> ModelEntry -> its ModelVersions

`Core` is the face the frontends, the server and the stubs' feature handlers hold: serving is
its own (the hot path goes through no extra layer); model control is delegated.
"""

from __future__ import annotations

from typing import Any

from pystub_backend.backend.core.control import ModelControl
from pystub_backend.backend.core.options import (
    CUDA_SHARED_MEMORY,
    EXTENSIONS,
    MODEL_CONTROL_MODES,
    SERVER_NAME,
    SERVER_VERSION,
    SYSTEM_SHARED_MEMORY,
    CoreOptions,
)
from pystub_backend.backend.core.serving import Serving
from pystub_backend.backend.core.table import ModelTable
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.client_shm import ClientShmRegistry
from pystub_backend.backend.features.response_cache import cache_from_config
from pystub_backend.backend.models.lifecycle import InFlight
from pystub_backend.backend.scheduling.rate_limiter import RateLimiter
from pystub_backend.backend.telemetry.tracing import Tracer
from pystub_backend.ipc.status import Status

__all__ = ["Core", "CoreOptions", "ModelTable", "SERVER_NAME", "SERVER_VERSION", "EXTENSIONS",
           "MODEL_CONTROL_MODES"]


class Core(Serving):
    def __init__(self, options: CoreOptions) -> None:
        """Raises CacheConfigError (before anything is opened) for a cache pystub cannot make."""
        # Server-wide services the model versions find on the core they receive (response cache and
        # rate limiter hooks): the cache is None without --cache-config, the limiter None when off.
        self.response_cache = cache_from_config(options.cache_config)
        client_shm = ClientShmRegistry(options.allow_client_shm, options.settings.shm_prefix, options.settings.gpus)
        in_flight = InFlight()
        self.models = ModelTable()
        super().__init__(self.models, client_shm, in_flight)
        self.options = options
        self.rate_limiter = (RateLimiter(options.rate_limit_resources)
                             if options.rate_limit == "execution_count" else None)
        self.control = ModelControl(options, self.models, in_flight, self)
        self.server_name = options.server_id
        self.server_version = SERVER_VERSION
        self.extensions = list(EXTENSIONS)
        # Tracing hook: the server replaces this disabled tracer with the --trace-config one; the
        # BLS handler asks it for the child traces of traced calls.
        self.tracer = Tracer()
        if client_shm.enabled:
            self.extensions.append(SYSTEM_SHARED_MEMORY)
            if client_shm.gpus:  # a server without a GPU does not list it (as Triton)
                self.extensions.append(CUDA_SHARED_MEMORY)
        self._live = True

    # -- health ----------------------------------------------------------------------------------
    def is_live(self) -> bool:
        return self._live

    def is_ready(self) -> bool:
        if not self._live or self._shutting_down:
            return False
        if not self.options.strict_readiness:
            return True
        # As in Triton, a model unloaded on purpose does not make the server unready.
        return all(any(v.ready for v in entry.versions.values())
                   for entry in self.models.entries.values() if not entry.is_unloaded)

    # -- start-up and shutdown -------------------------------------------------------------------
    async def load_repository(self) -> list[str]:
        """See ModelControl.load_repository."""
        return await self.control.load_repository()

    def begin_shutdown(self) -> None:
        """Refuse new inference and fail what waits in queues; running requests go on."""
        self._shutting_down = True
        error = ServerError("Server is shutting down; the queued request was not executed.", Status.UNAVAILABLE)
        for version in self.models.versions():
            if version.scheduler is not None:
                version.scheduler.fail_queued(error)

    async def unload_all(self) -> None:
        """Stop polling, let running loads finish, then drain and unload every model."""
        self._live = False
        await self.control.unload_all()
        self.client_shm.close()  # the stubs are gone: unmap the clients' regions (never unlink)

    # -- model control (docs/reference/protocol.md#model-repository-extension) -----------------------------------------
    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """See ModelControl.load_model."""
        await self.control.load_model(name, parameters)

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """See ModelControl.unload_model."""
        await self.control.unload_model(name, parameters)

    async def poll_repository(self) -> None:
        await self.control.poll_repository()

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.control.repository_index(ready_only)
