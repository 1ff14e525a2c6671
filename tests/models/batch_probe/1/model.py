"""Reports how its requests were batched.

Per request: OUTPUT0 = 2 * INPUT0, and per batch row REQUESTS (requests in this execute call),
BATCH (their total batch size) and CALL (1 for the instance's first execute call, 2 for the next...).
A request whose first value is negative gets an error response of its own; a first value of 666
makes execute raise (the whole batch fails); a first value above 1000 makes the call sleep
(value - 1000) ms first.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        firsts = [float(x.reshape(-1)[0]) if x.size else 0.0 for x in inputs]
        if 666.0 in firsts:
            raise ValueError("poisoned batch")
        sleep_ms = max([f - 1000 for f in firsts if f > 1000], default=0)
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        total = sum(x.shape[0] for x in inputs)
        responses = []
        for x, first in zip(inputs, firsts):
            if first < 0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)))
                continue
            rows = x.shape[0]
            column = lambda v: np.full((rows, 1), v, np.int32)  # noqa: E731
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32)),
                pb_utils.Tensor("REQUESTS", column(len(requests))),
                pb_utils.Tensor("BATCH", column(total)),
                pb_utils.Tensor("CALL", column(self.calls)),
            ]))
        return responses
