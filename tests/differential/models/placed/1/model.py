"""Each instance's initialize appends [kind, name, device id] to placed.jsonl in the model's
directory; OUTPUT0 = INPUT0. Loaded by tests/differential/test_placement.py with config overrides."""

import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        keys = ("model_instance_kind", "model_instance_name", "model_instance_device_id")
        with open(os.path.join(args["model_repository"], "placed.jsonl"), "a") as out:
            out.write(json.dumps([args[key] for key in keys]) + "\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            request, "INPUT0").as_numpy())]) for request in requests]
