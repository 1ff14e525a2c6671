"""pb_utils.load_model / unload_model / is_model_ready on the model named after the colon; READY =
is_model_ready(model) after the action. An exception from the call fails the request."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            action, _, model = text.partition(":")
            if action == "load":
                pb_utils.load_model(model_name=model)
            elif action == "unload":
                pb_utils.unload_model(model_name=model)
            ready = pb_utils.is_model_ready(model_name=model)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("READY", np.array([ready], np.bool_))]))
        return responses
