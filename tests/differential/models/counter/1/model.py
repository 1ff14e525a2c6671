"""Custom metrics: `diff_counter_total` (counter) grows by INPUT0, `diff_last_value` (gauge) is
set to it; TOTAL = the counter's value() after this request. A negative INPUT0 is refused with an
INVALID_ARG error (counters only go up)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "origin": "differential"}
        self.counter_family = pb_utils.MetricFamily("diff_counter_total", "Sum of the inputs",
                                                    pb_utils.MetricFamily.COUNTER)
        self.gauge_family = pb_utils.MetricFamily("diff_last_value", "The last input", pb_utils.MetricFamily.GAUGE)
        self.counter = self.counter_family.Metric(labels=labels)
        self.gauge = self.gauge_family.Metric(labels=labels)

    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            if value < 0:
                error = pb_utils.TritonError("negative increment", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            self.counter.increment(value)
            self.gauge.set(value)
            total = np.array([self.counter.value()], np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", total)]))
        return responses
