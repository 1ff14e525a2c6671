"""OUTPUT = INPUT + INPUT_STATE, returned as OUTPUT_STATE too (the next state, were it kept).
SEEN (JSON) tells what the model received: its input names and the state's value."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE")
            value = np.zeros(1, np.float32) if state is None else state.as_numpy().reshape(-1)
            total = (pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy() + value).astype(np.float32)
            seen = {"inputs": sorted(tensor.name() for tensor in request.inputs()),
                    "state": None if state is None else value.tolist()}
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("OUTPUT_STATE", total),
                pb_utils.Tensor("SEEN", np.array([json.dumps(seen).encode()], dtype=np.object_))]))
        return responses
