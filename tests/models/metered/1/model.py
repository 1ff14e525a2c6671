"""Custom metrics: counts the requests it answers (COUNT returns the counter's value() after
this request), observes every input value in a histogram, sets a gauge to the number of requests
in the batch. A request holding a negative value gets an error response of its own (its values
are still observed)."""

import numpy as np
import triton_python_backend_utils as pb_utils

BUCKETS = [0.5, 1.0, 2.5]


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        # Families must outlive their metrics (docs/reference/model-api.md#custom-metrics), so the model keeps both.
        self.families = [
            pb_utils.MetricFamily("metered_requests", "Requests the model answered", pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily("metered_input_values", "Input values seen", pb_utils.MetricFamily.HISTOGRAM),
            pb_utils.MetricFamily("metered_last_batch", "Requests in the last execute", pb_utils.MetricFamily.GAUGE),
        ]
        self.requests = self.families[0].Metric(labels=labels)
        self.values = self.families[1].Metric(labels=labels, buckets=BUCKETS)
        self.batch = self.families[2].Metric(labels=labels)

    def execute(self, requests):
        self.batch.set(len(requests))
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            for value in data.flat:
                self.values.observe(float(value))
            if (data < 0).any():
                error = pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            self.requests.increment(1)
            count = np.full((data.shape[0], 1), self.requests.value(), dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data),
                                                         pb_utils.Tensor("COUNT", count)]))
        return responses
