"""Supervision of stub processes: one stub incarnation and the supervisor that replaces it.

    instance.ModelInstance     the supervisor of one instance: death, hangs, restarts, readiness
    stub_process.StubProcess   one incarnation: spawn, handshake, the shutdown ladder
    exit_watch.ExitWatch       whether its process exited, from a pidfd the loop watches
    restart_policy.RestartPolicy  the back-off before a process is started again (stubs, workers)
    stop_ladder.climb          the signals and waits that stop a process (stubs, workers)
    exchange.RequestExchange   its requests in flight (one record per request id)
    frames.FrameLink           its frames: `send(message, timeout)`, `send_soon`, dispatch
    services.StubServices      what feature frame handlers may use (handlers, core, registries)
    handlers.BackendHandlers     the frame table features register into (features.install)
    template.WeightsTemplate   shared weights: the stub that runs initialize once and forks instances
    forked.ForkedStub          an instance's stub forked from that template (the StubProcess face)

The names below load on first use: the feature modules this package dispatches to import its
handler and service types, so importing everything here eagerly would be an import cycle.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.errors import StubStartError
    from pystub_backend.backend.supervision.forked import ForkedStub
    from pystub_backend.backend.supervision.handlers import BackendHandlers, Handler
    from pystub_backend.backend.supervision.instance import (
        InstanceSpec,
        InstanceState,
        ModelInstance,
        watch_health,
    )
    from pystub_backend.backend.supervision.restart_policy import RestartPolicy
    from pystub_backend.backend.supervision.services import StubFacingCore, StubServices
    from pystub_backend.backend.supervision.settings import BackendConfigError, StubSettings, parse_backend_config
    from pystub_backend.backend.supervision.stub_process import StubProcess
    from pystub_backend.backend.supervision.template import WeightsTemplate

_HOMES = {
    "StubStartError": "errors", "Handler": "handlers", "BackendHandlers": "handlers",
    "InstanceSpec": "instance", "InstanceState": "instance", "ModelInstance": "instance",
    "RestartPolicy": "restart_policy", "watch_health": "instance",
    "StubFacingCore": "services", "StubServices": "services", "BackendConfigError": "settings",
    "StubSettings": "settings", "parse_backend_config": "settings", "StubProcess": "stub_process",
    "ForkedStub": "forked", "WeightsTemplate": "template",
}

__all__ = [
    "BackendConfigError", "ForkedStub", "Handler", "BackendHandlers", "InstanceSpec", "InstanceState", "ModelInstance",
    "RestartPolicy", "StubFacingCore", "StubProcess", "StubServices", "StubSettings",
    "StubStartError", "WeightsTemplate", "parse_backend_config", "watch_health",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
