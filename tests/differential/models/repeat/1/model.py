"""Decoupled: for IN = [n] sends n responses (OUT = [i]); n < 0 sends an error response, then the
final flag. Responses go out from execute itself, before it returns None."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if count < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative count")))
            for i in range(max(count, 0)):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
