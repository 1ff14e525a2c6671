"""Weights made once in `initialize`, an identity per instance from `initialize_instance`.

Every call of either hook appends a line to `calls.log` in the model's directory (or the file the
CALLS_LOG parameter names: a log in the directory is a change of the model's files), so a test
counts how often each ran and in which process. `execute` reads every page of the weights (their
sum), sleeps INPUT0 milliseconds (so that concurrent requests reach every instance) and answers
the instance's name, its pid and the sum. Config parameters: WEIGHTS_MIB (the
size), LEAVE_THREAD ("yes": initialize leaves a thread running, which no fork survives).
"""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _record(args, *words):
    chosen = json.loads(args["model_config"]).get("parameters", {}).get("CALLS_LOG", {}).get("string_value")
    with open(chosen or os.path.join(args["model_repository"], "calls.log"), "a") as log:
        log.write(" ".join(str(word) for word in words) + "\n")


class TritonPythonModel:
    def initialize(self, args):
        parameters = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        size = int(parameters.get("WEIGHTS_MIB", "64")) << 20
        self.weights = np.arange(size // 8, dtype=np.float64)  # written once, here: every page is touched
        self.expected = float(self.weights.sum())
        self.name = args["model_instance_name"]
        if parameters.get("LEAVE_THREAD") == "yes":
            self._stop = threading.Event()
            threading.Thread(target=self._stop.wait, name="left-running", daemon=True).start()
        _record(args, "initialize", os.getpid(), self.name)

    def initialize_instance(self, args):
        self.name = args["model_instance_name"]
        _record(args, "initialize_instance", os.getpid(), self.name)

    def execute(self, requests):
        total = float(self.weights.sum())
        responses = []
        for request in requests:
            time.sleep(int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("INSTANCE", np.array([self.name.encode()], dtype=np.object_)),
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                pb_utils.Tensor("TOTAL", np.array([total], dtype=np.float64))]))
        return responses
