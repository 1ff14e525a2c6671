"""Where the backend's feature frame handlers are installed: one explicit call per feature.

    install_features(handlers)   each feature module's `register(handlers)`, in this order
    feature_services(core)       the StubServices a server hands its stubs (handlers built once)

The stub side mirrors this (pystub_backend.stub.features): every feature exposes `register(...)`
and one install function calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pystub_backend.backend.features import client_shm, custom_metrics, sequence_frames
from pystub_backend.backend.features.bls import handlers as bls
from pystub_backend.backend.scheduling import multiplex
from pystub_backend.backend.supervision.handlers import BackendHandlers
from pystub_backend.backend.supervision.services import StubServices

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.services import StubFacingCore

__all__ = ["install_features", "feature_services"]

_handlers: BackendHandlers | None = None


def install_features(handlers: BackendHandlers) -> BackendHandlers:
    """Register every backend feature's frame handlers in `handlers`; returns it."""
    custom_metrics.register(handlers)  # pb_utils.MetricFamily / Metric from the stubs
    sequence_frames.register(handlers)  # sequence batching: rescheduled requests
    bls.register(handlers)  # BLS calls and model control from stubs
    multiplex.register(handlers)  # model multiplexing: what each stub holds
    client_shm.register(handlers)  # client shared memory: the stubs closed a registration's mappings
    return handlers


def feature_services(core: StubFacingCore | None) -> StubServices:
    """The services of the server whose core is `core` (None: a stub outside a server)."""
    global _handlers
    if _handlers is None:  # the handlers are plain functions: one table serves every server
        _handlers = install_features(BackendHandlers())
    return StubServices(handlers=_handlers, client_regions=client_shm, device_exports=bls.DEVICE_EXPORTS,
                        core=core)
