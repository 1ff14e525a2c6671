"""What the server core is started with, and the facts it tells clients about itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from pystub_backend.backend.scheduling.rate_limiter import ResourceLimit
from pystub_backend.backend.supervision.settings import StubSettings

__all__ = ["CoreOptions", "SERVER_NAME", "SERVER_VERSION", "EXTENSIONS", "SYSTEM_SHARED_MEMORY", "CUDA_SHARED_MEMORY",
           "MODEL_CONTROL_MODES"]

SERVER_NAME = "pystub"
SERVER_VERSION = "0.1.0"
# Only what is implemented: perf_analyzer reads this list (docs/reference/protocol.md#server-metadata-extensions).
EXTENSIONS = ["binary_tensor_data", "parameters", "statistics", "model_configuration", "model_repository",
              "model_repository(unload_dependents)", "logging", "schedule_policy", "sequence",
              "classification", "trace"]
SYSTEM_SHARED_MEMORY = "system_shared_memory"  # listed only with --allow-client-shm=true
CUDA_SHARED_MEMORY = "cuda_shared_memory"  # ... and a visible GPU
MODEL_CONTROL_MODES = ("none", "poll", "explicit")


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
    cache_config: dict[str, dict[str, str]] = field(default_factory=dict)  # --cache-config; empty: no cache
    rate_limit: str = "off"  # --rate-limit
    rate_limit_resources: list[ResourceLimit] = field(default_factory=list)  # --rate-limit-resource
