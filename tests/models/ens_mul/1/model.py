"""PRODUCT = A * B; a NaN in A is answered with an error response (ensemble failure tests)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            if np.isnan(a).any():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("ens_mul: NaN in A", pb_utils.TritonError.INVALID_ARG)))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PRODUCT", a * b)]))
        return responses
