"""OUTPUT0 = INPUT0, handed over through to_dlpack / from_dlpack."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUTPUT0", tensor.to_dlpack())]))
        return responses
