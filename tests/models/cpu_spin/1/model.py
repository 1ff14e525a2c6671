"""Keeps one core busy for SPIN_MS milliseconds (a Python loop, not a sleep), then returns it."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            spin = pb_utils.get_input_tensor_by_name(request, "SPIN_MS").as_numpy()
            deadline = time.monotonic() + int(spin[0]) / 1000
            count = 0
            while time.monotonic() < deadline:
                count += 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", spin)]))
        return responses
