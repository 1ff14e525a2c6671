"""Keeps a running sum per client sequence, and frees it however the sequence ends.

START resets the sum, END frees it. Under pystub, `sequence_evicted` frees it too when a sequence
ends without END: idle for too long, its client gone, a request cancelled, the model unloading.
(Triton never calls `sequence_evicted`; the model stays valid there.)
"""

import numpy as np
import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}  # correlation id -> running sum: the per-client state

    def execute(self, requests):
        responses = []
        for request in requests:
            cid = request.correlation_id()
            value = int(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy().sum())
            if request.flags() & START:
                self.sums[cid] = 0
            self.sums[cid] = self.sums.get(cid, 0) + value
            total = np.array([[self.sums[cid]]], dtype=np.int64)
            if request.flags() & END:
                del self.sums[cid]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses

    def sequence_evicted(self, correlation_id, reason):
        """The sequence ended without END; reason: idle_timeout, client_disconnected, cancelled or
        unloading. May also be `async def`."""
        self.sums.pop(correlation_id, None)
        pb_utils.Logger.log_info(f"accumulate: freed the state of sequence {correlation_id} ({reason}); "
                                 f"{len(self.sums)} sequence(s) left")
