"""OUT = arange(N) in an arena array; with N < 0, the same array is also sent as AGAIN (so it must be
copied once, never freed twice); every request also allocates one array it never sends."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            out = pb_utils.new_output_array((abs(n),), np.float32)
            out[:] = np.arange(abs(n), dtype=np.float32)
            pb_utils.new_output_array((1024,), np.float32)  # dropped unsent: freed when collected
            tensors = [pb_utils.Tensor("OUT", out)]
            if n < 0:
                tensors.append(pb_utils.Tensor("AGAIN", out))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
