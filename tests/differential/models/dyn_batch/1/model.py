"""OUTPUT0 = 2 * INPUT0; BATCH = the number of requests in this execute call."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            batch = np.full((data.shape[0], 1), len(requests), dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data * 2),
                                                         pb_utils.Tensor("BATCH", batch)]))
        return responses
