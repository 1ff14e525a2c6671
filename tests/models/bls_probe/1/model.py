"""Echoes the request's fields (id, correlation id, flags, timeout, parameters, requested outputs)
and answers with response parameters, so BLS tests can see what crossed."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = args["model_version"]

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = {
                "request_id": request.request_id(), "correlation_id": request.correlation_id(),
                "flags": request.flags(), "timeout": request.timeout(),
                "parameters": json.loads(request.parameters()),
                "requested": sorted(request.requested_output_names()), "version": self.version,
            }
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", data * 2), pb_utils.Tensor("REQUEST", np.array([json.dumps(seen).encode()],
                                                                                     dtype=np.object_))],
                parameters={"answered_by": "bls_probe", "count": 1}))
        return responses
