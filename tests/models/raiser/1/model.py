"""Raises ValueError when INPUT0 is negative; otherwise returns it."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if value[0] < 0:
                raise ValueError(f"boom: negative input {int(value[0])}")
            if value[0] == 1:
                error = pb_utils.TritonError("this request alone fails", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses
