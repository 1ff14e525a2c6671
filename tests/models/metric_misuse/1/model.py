"""Tries every misuse of the custom metrics API it knows and answers with what each one raised
(in order; "no error" when a call did not raise). `metered_requests` is another model's COUNTER."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _attempt(call):
    try:
        call()
    except Exception as exc:  # the test reads the texts
        return f"{type(exc).__name__}: {exc}"
    return "no error"


class TritonPythonModel:
    def execute(self, requests):
        counter_family = pb_utils.MetricFamily("misuse_counter", "a counter", pb_utils.MetricFamily.COUNTER)
        histogram_family = pb_utils.MetricFamily("misuse_histogram", "a histogram", pb_utils.MetricFamily.HISTOGRAM)
        counter = counter_family.Metric(labels={"k": "v"})
        histogram = histogram_family.Metric(labels={"k": "v"}, buckets=[1.0])
        errors = [
            _attempt(lambda: pb_utils.MetricFamily("metered_requests", "same name, other kind",
                                                   pb_utils.MetricFamily.GAUGE)),
            _attempt(lambda: pb_utils.MetricFamily("nv_inference_count", "a server name",
                                                   pb_utils.MetricFamily.COUNTER)),
            _attempt(lambda: pb_utils.MetricFamily("bad name", "invalid", pb_utils.MetricFamily.GAUGE)),
            _attempt(lambda: counter_family.Metric(labels=["k", "v"])),
            _attempt(lambda: counter_family.Metric(labels={"bad-label": "v"})),
            _attempt(lambda: histogram_family.Metric(labels={"k": "v"})),
            _attempt(lambda: counter_family.Metric(labels={"k": "v"}, buckets=[1.0])),
            _attempt(lambda: counter.set(1)),
            _attempt(lambda: counter.increment(-1)),
            _attempt(lambda: counter.observe(1)),
            _attempt(lambda: histogram.increment(1)),
            _attempt(lambda: histogram.value()),
        ]
        output = pb_utils.Tensor("ERRORS", np.array([e.encode() for e in errors], dtype=np.object_))
        return [pb_utils.InferenceResponse([output]) for _ in requests]
