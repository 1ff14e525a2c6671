"""initialize sleeps INIT_SECONDS (config parameter, default 6); execute echoes INPUT0."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        time.sleep(float(parameters.get("INIT_SECONDS", {}).get("string_value", "6")))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())]) for request in requests]
