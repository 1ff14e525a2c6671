"""Initializes once per repository copy: the first initialize leaves a marker next to the model,
every later one raises (as a model whose weights went missing would). MODE 2 exits the stub
(os._exit(3)); anything else echoes MODE."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], "booted")
        if os.path.exists(marker):
            raise RuntimeError("refusing to boot twice: the weights are gone")
        with open(marker, "w") as handle:
            handle.write("1")

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 2:
                os._exit(3)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([mode], np.int32))]))
        return responses
