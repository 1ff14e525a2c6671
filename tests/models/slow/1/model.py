"""Sleeps DELAY_MS milliseconds, then returns it; logs its finalize."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            time.sleep(int(delay[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", delay)]))
        return responses

    def finalize(self):
        print("slow: finalize called", flush=True)
