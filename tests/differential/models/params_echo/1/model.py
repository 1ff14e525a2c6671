"""PARAMS = request.parameters() (a JSON string) re-serialised with sorted keys. When INPUT0 is
1 the response also carries parameters {"echo": true, "count": 3, "word": "ok"}. The model
config's `greeting` parameter is returned under "_config"."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.greeting = config["parameters"]["greeting"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            params["_config"] = self.greeting
            text = json.dumps(params, sort_keys=True).encode()
            output = pb_utils.Tensor("PARAMS", np.array([text], dtype=np.object_))
            flag = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            if flag == 1:
                responses.append(pb_utils.InferenceResponse([output],
                                                            parameters={"echo": True, "count": 3, "word": "ok"}))
            else:
                responses.append(pb_utils.InferenceResponse([output]))
        return responses
