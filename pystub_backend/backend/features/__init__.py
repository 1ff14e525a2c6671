"""The backend side of the stub features: BLS and model control, custom metrics, client shared
memory, sequence frames, multiplexing. Each feature module exposes `register(handlers)`;
`install.install_features` calls them all and `install.feature_services` builds the StubServices
a server hands its stubs.

The names below load on first use (the features import supervision, which imports install).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pystub_backend.backend.features.client_shm import ClientShmRegistry
    from pystub_backend.backend.features.custom_metrics import CustomMetrics, registry_for
    from pystub_backend.backend.features.install import feature_services, install_features

_HOMES = {
    "ClientShmRegistry": "client_shm", "CustomMetrics": "custom_metrics", "registry_for": "custom_metrics",
    "feature_services": "install", "install_features": "install",
}

__all__ = ["ClientShmRegistry", "CustomMetrics", "feature_services", "install_features", "registry_for"]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
