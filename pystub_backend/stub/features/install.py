"""Imports every stub feature module that registers frame handlers (see stub_features)."""
from pystub_backend.stub.features import (
    bls,  # noqa: F401 - BLS (InferenceRequest.exec) and model control from a model
    client_shm,  # noqa: F401 - client shared memory: forget unregistered regions
    metrics,  # noqa: F401 - custom metrics: pb_utils.MetricFamily mirrored to /metrics
    model_control,  # noqa: F401 - BLS (InferenceRequest.exec) and model control from a model
    multiplex,  # noqa: F401 - model multiplexing: the sub-model cache
    sequences,  # noqa: F401 - sequence batching: sequence_evicted hook, rescheduling
)
