"""Decoupled: one response per whitespace-separated word of text_input, then the final flag."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = bytes(pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            for word in text.split():
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([word], np.object_))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
