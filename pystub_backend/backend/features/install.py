"""Imports every backend feature module that registers frame handlers (see stub_features)."""
from pystub_backend.backend.features import (
    custom_metrics,  # noqa: F401,E402 - pb_utils.MetricFamily / Metric from the stubs
    sequence_frames,  # noqa: F401,E402 - sequence batching: rescheduled requests
)
from pystub_backend.backend.features.bls import handlers as bls  # noqa: F401 - BLS calls and model control from stubs (payload registry)
from pystub_backend.backend.scheduling import multiplex as multiplex_router  # noqa: F401 - model multiplexing: what each stub holds
