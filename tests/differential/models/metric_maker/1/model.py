"""Creates a histogram, a counter and a gauge series labelled LABEL and reads /metrics right away
(see config.pbtxt); keeps the metrics, so that they stay on /metrics."""

import urllib.request

import numpy as np
import triton_python_backend_utils as pb_utils


def _text(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0].decode()


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily
        self.histogram = family("diff_made_seconds", "A histogram made on request", family.HISTOGRAM)
        self.counter = family("diff_made_total", "A counter made on request", family.COUNTER)
        self.gauge = family("diff_made_level", "A gauge made on request", family.GAUGE)
        self.unused = family("diff_made_unused", "A family that never gets a metric", family.COUNTER)
        self.metrics = []

    def execute(self, requests):
        responses = []
        for request in requests:
            label = _text(request, "LABEL")
            labels = {"made": label}
            self.metrics += [self.histogram.Metric(labels=labels, buckets=[1.0, 2.0, 5.0]),
                             self.counter.Metric(labels=labels), self.gauge.Metric(labels=labels)]
            with urllib.request.urlopen(_text(request, "METRICS_URL"), timeout=30) as reply:
                text = reply.read().decode()
            lines = sorted(line for line in text.splitlines() if f'made="{label}"' in line)
            encoded = np.array([line.encode() for line in lines], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LINES", encoded)]))
        return responses
