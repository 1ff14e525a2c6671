"""OUTPUT0 = each element reversed (bytes), LENGTH = each element's byte length."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            flipped = np.array([bytes(v)[::-1] for v in data.reshape(-1)], dtype=np.object_).reshape(data.shape)
            lengths = np.array([len(bytes(v)) for v in data.reshape(-1)], dtype=np.int64).reshape(data.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", flipped),
                                                         pb_utils.Tensor("LENGTH", lengths)]))
        return responses
