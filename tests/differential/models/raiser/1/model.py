"""MODE selects what execute does with the (single) request:

 0 answers OUTPUT0 = [0]                     1 raises ValueError("mode one")
 2 error response TritonError("custom failure")           3 ... with code INVALID_ARG
 4 an output named NOPE                      5 returns no responses at all ([])
 6 OUTPUT0 as FP64 instead of INT32          7 raises TritonModelException("model exception")
 8 error code UNAVAILABLE                    9 error code NOT_FOUND
10 error code UNSUPPORTED                   11 returns None
12 returns the string "nonsense"            13 error code ALREADY_EXISTS
14 raises KeyError in a helper two calls deep (the "At:" tail's frame order)
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _inner(mode):
    raise KeyError(f"mode {mode}")


def _outer(mode):
    return _inner(mode)


CODES = {3: "INVALID_ARG", 8: "UNAVAILABLE", 9: "NOT_FOUND", 10: "UNSUPPORTED", 13: "ALREADY_EXISTS"}


class TritonPythonModel:
    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0])
        if mode == 1:
            raise ValueError("mode one")
        if mode == 7:
            raise pb_utils.TritonModelException("model exception")
        if mode == 14:
            _outer(mode)
        if mode == 5:
            return []
        if mode == 11:
            return None
        if mode == 12:
            return "nonsense"
        if mode == 2:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("custom failure"))]
        if mode in CODES:
            code = getattr(pb_utils.TritonError, CODES[mode])
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(f"coded {CODES[mode]}", code))]
        if mode == 4:
            return [pb_utils.InferenceResponse([pb_utils.Tensor("NOPE", np.array([0], np.int32))])]
        if mode == 6:
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([0.5], np.float64))])]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([mode], np.int32))])]
