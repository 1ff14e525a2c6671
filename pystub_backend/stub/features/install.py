"""The one place the stub's features are wired in: `install_features(handlers)` calls each
feature module's `register(handlers)` (see pystub_backend.stub.handlers)."""

from __future__ import annotations

from pystub_backend.stub.features import bls, client_shm, device_ipc, metrics, model_control, multiplex, sequences
from pystub_backend.stub.handlers import StubHandlers

__all__ = ["install_features", "FEATURES"]

# In registration order; the order of phase and send hooks follows it.
FEATURES = (
    bls,  # BLS (InferenceRequest.exec) from a model
    client_shm,  # client shared memory: forget unregistered regions
    device_ipc,  # GPU outputs exported to BLS callers: drop those nobody maps any more
    metrics,  # custom metrics: pb_utils.MetricFamily mirrored to /metrics
    model_control,  # model control (load/unload/ready) from a model
    multiplex,  # model multiplexing: the sub-model cache
    sequences,  # sequence batching: sequence_evicted hook, rescheduling
)


def install_features(handlers: StubHandlers) -> None:
    """Register every stub feature's frame handlers and hooks in `handlers`."""
    for feature in FEATURES:
        feature.register(handlers)
