"""Every shape_* model runs this file (their model.py is a link to it): INFO is a JSON list with,
for each input of the config, [name, numpy dtype, shape, its first 8 values] ([name, null] when
the request left an optional input out), so a test sees exactly what the model was handed."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _describe(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return [name, None]
    array = tensor.as_numpy()
    values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]
    return [name, str(array.dtype), list(array.shape), values[:8]]


class TritonPythonModel:
    def initialize(self, args):
        self.names = [tensor["name"] for tensor in json.loads(args["model_config"])["input"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            info = json.dumps([_describe(request, name) for name in self.names]).encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", np.array([info], np.object_))]))
        return responses
