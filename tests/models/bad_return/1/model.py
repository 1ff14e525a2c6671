"""Breaks execute's return rules on purpose: MODE 1 not a list, 2 wrong length, 3 wrong type."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0])
        if mode == 1:
            return 42
        if mode == 2:
            return []
        if mode == 3:
            return ["not a response"] * len(requests)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "MODE").as_numpy())]) for r in requests]
