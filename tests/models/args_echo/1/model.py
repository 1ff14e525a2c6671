"""Returns the JSON of the `initialize` args its instance received."""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.args["pid"] = os.getpid()
        self.args["sys_path_tail"] = sys.path[-3:]
        self.args["module"] = __name__

    def execute(self, requests):
        text = json.dumps(self.args).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", np.array([text], dtype=np.object_))])
                for _ in requests]
