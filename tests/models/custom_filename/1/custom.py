import triton_python_backend_utils as pb_utils

from helper import plus_one  # a sibling file in the version directory


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", plus_one(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()))]) for r in requests]
