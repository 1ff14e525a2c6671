"""Tells what happens to its instances, for tests/differential/test_instance_updates*.py.

Every instance appends lines to `<repository>/<model>.events` (beside the model directory, so
that writing it changes no file of the model): `init <instance> <pid> <counts>` (`counts`: the
count of each instance group in the `model_config` it was given), `start <instance> <pid>` and
`end <instance> <pid>` around each request, `fini <instance> <pid>`. `execute` sleeps DELAY
seconds per request and answers `<instance> <pid>`.

Marker files beside the model directory steer `initialize`: `<model>.slow` (it logs `slow` and
sleeps the seconds the file holds first), `<model>.fail` (the instances it names, or every one when
it is empty, raise).
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.base = args["model_repository"].rstrip("/")  # <repository>/<model>: the markers are beside it
        counts = ",".join(str(group["count"]) for group in json.loads(args["model_config"])["instance_group"])
        if os.path.exists(self.base + ".slow"):
            self._log("slow")
            with open(self.base + ".slow") as marker:
                time.sleep(float(marker.read() or "3"))
        if os.path.exists(self.base + ".fail"):
            with open(self.base + ".fail") as marker:
                refused = marker.read().split()
            if not refused or self.name in refused:
                raise RuntimeError(f"instance {self.name} refuses to start")
        self._log("init", counts)

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            self._log("start")
            time.sleep(float(delay.reshape(-1)[0]))
            self._log("end")
            answer = np.array([f"{self.name} {os.getpid()}".encode()] * delay.size, np.object_).reshape(delay.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INSTANCE", answer)]))
        return responses

    def finalize(self):
        self._log("fini")

    def _log(self, what, *details):
        with open(self.base + ".events", "a") as events:
            events.write(" ".join([what, self.name, str(os.getpid()), *details]) + "\n")
