"""Sleeps DELAY_MS and answers SPAN = [start, end] of its execute (wall-clock seconds)."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        started = time.time()
        for request in requests:
            time.sleep(int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]) / 1000)
        span = np.array([started, time.time()], np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
