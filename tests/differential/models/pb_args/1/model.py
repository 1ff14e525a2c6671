"""Runs one row of argument_cases.CASES and answers RESULT = JSON [type name, message] of what it
raised (["ok", repr] when it raised nothing). Rows whose case id starts with "initialize/" ran in
initialize; their results are kept and answered the same way."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

_spec = importlib.util.spec_from_file_location("argument_cases", Path(__file__).with_name("argument_cases.py"))
argument_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(argument_cases)


def _outcome(call):
    try:
        value = call()
    except Exception as error:  # noqa: BLE001 - what was raised is the answer
        return [type(error).__name__, str(error)]
    return ["ok", type(value).__name__]


class TritonPythonModel:
    def initialize(self, args):
        self.context = argument_cases.Context(pb_utils, np, json.loads(args["model_config"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            case = pb_utils.get_input_tensor_by_name(request, "CASE").as_numpy()[0].decode()
            self.context.request = request
            call = argument_cases.CASES.get(case)
            result = ["unknown case", case] if call is None else _outcome(lambda c=call: c(self.context))
            encoded = np.array([json.dumps(result).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", encoded)]))
        return responses
