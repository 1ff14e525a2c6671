"""A model written with `execute_batch` (pystub extension): Y = X * SCALE + BIAS (+ EXTRA).

SCALE, BIAS and TAG default from the config; EXTRA has no default, so it is left out of `inputs`
when the requests did not send it. ROWS is the number of rows of the call, CALL its number.
A first X value of 666 makes the call raise.
"""

import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute_batch(self, inputs):
        self.calls += 1
        x = inputs["X"]
        if x[0, 0] == 666:
            raise RuntimeError("execute_batch failed on purpose")
        y = x * inputs["SCALE"] + inputs["BIAS"]
        if "EXTRA" in inputs:
            y = y + inputs["EXTRA"]
        rows = x.shape[0]
        return {
            "Y": y.astype(np.float32),
            "TAG_OUT": inputs["TAG"],
            "ROWS": np.full((rows, 1), rows, np.int32),
            "CALL": np.full((rows, 1), self.calls, np.int32),
        }
