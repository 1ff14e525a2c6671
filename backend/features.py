"""Imports every backend feature module that registers frame handlers (see stub_features)."""
from backend import multiplex_router  # noqa: F401 - model multiplexing: what each stub holds
from backend import custom_metrics  # noqa: F401,E402 - pb_utils.MetricFamily / Metric from the stubs
from backend import sequence_frames  # noqa: F401,E402 - sequence batching: rescheduled requests
from backend import bls  # noqa: F401 - BLS calls and model control from stubs (payload registry)
