"""BATCH = how many requests this execute got (the dynamic batcher gathers them)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        count = np.array([len(requests)], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("BATCH", count.reshape(1, 1))]) for _ in requests]
