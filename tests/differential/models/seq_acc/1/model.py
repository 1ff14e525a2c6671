"""OUTPUT = the sequence's sum so far (a START control value of 1 resets it), FLAGS = START*1 +
END*2 + READY*4 as the control inputs said."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            start, end, ready = (int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])
                                 for name in ("START", "END", "READY"))
            cid = request.correlation_id()
            if start:
                self.sums[cid] = 0
            self.sums[cid] = self.sums.get(cid, 0) + value
            total = self.sums[cid]
            if end:
                self.sums.pop(cid, None)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([[total]], np.int32)),
                pb_utils.Tensor("FLAGS", np.array([[start + 2 * end + 4 * ready]], np.int32))]))
        return responses
