"""OUTPUT0 = INPUT0 + 1."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            data = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
