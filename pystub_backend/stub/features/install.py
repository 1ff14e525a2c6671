"""Imports every stub feature module that registers frame handlers (see stub_features)."""
from pystub_backend.stub.features import multiplex  # noqa: F401 - model multiplexing: the sub-model cache
from pystub_backend.stub.features import client_shm  # noqa: F401 - client shared memory: forget unregistered regions
from pystub_backend.stub.features import metrics  # noqa: F401 - custom metrics: pb_utils.MetricFamily mirrored to /metrics
from pystub_backend.stub.features import sequences  # noqa: F401 - sequence batching: sequence_evicted hook, rescheduling
from pystub_backend.stub.features import bls  # noqa: F401 - BLS (InferenceRequest.exec) and model control from a model
from pystub_backend.stub.features import model_control  # noqa: F401 - BLS (InferenceRequest.exec) and model control from a model
