"""Tracing: a BLS call to bls_leaf that keeps the caller's trace (see config.pbtxt)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            untraced = json.loads(request.parameters() or "{}").get("untraced", False)
            options = {} if untraced else {"trace": request.trace()}
            inner = pb_utils.InferenceRequest(model_name="bls_leaf", requested_output_names=["OUT"],
                                              inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                                              **options).exec()
            if inner.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(inner.error().message())))
                continue
            out = pb_utils.get_output_tensor_by_name(inner, "OUT").as_numpy()
            context = request.trace().get_context() or ""
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", out), pb_utils.Tensor("CONTEXT", np.array([context.encode()], dtype=object))]))
        return responses
