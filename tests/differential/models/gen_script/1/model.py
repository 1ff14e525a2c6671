"""Decoupled: MODE picks the responses one request gets (then the final flag):

 0 an error response             1 OUT, then an error response     2 OUT, then an FP16 output
 3 an FP16 output                4 no response at all              5 OUT, OUT
 6 a 2x2 INT32 output            7 BOOL [true, false]              8 BYTES that are not UTF-8
 9 an empty FP32 output         10 FP64 infinity                  11 UINT64's largest value
12 two outputs (6 and 7)
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _response(*outputs):
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in outputs])


def _error(text):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(text))


def _out(text):
    return ("OUT", np.array([text], np.object_))


def _half():
    return ("HALF", np.array([1.5], np.float16))


def _script(mode):
    two_d = ("O_2D", np.arange(4, dtype=np.int32).reshape(2, 2))
    booleans = ("O_BOOL", np.array([True, False]))
    scripts = {
        0: lambda: [_error("first failed")],
        1: lambda: [_response(_out(b"one")), _error("second failed")],
        2: lambda: [_response(_out(b"one")), _response(_half())],
        3: lambda: [_response(_half())],
        4: lambda: [],
        5: lambda: [_response(_out(b"one")), _response(_out(b"two"))],
        6: lambda: [_response(two_d)],
        7: lambda: [_response(booleans)],
        8: lambda: [_response(("O_BYTES", np.array([b"\xff\xfeok"], np.object_)))],
        9: lambda: [_response(("O_EMPTY", np.zeros((0,), np.float32)))],
        10: lambda: [_response(("O_FP64", np.array([np.inf], np.float64)))],
        11: lambda: [_response(("O_U64", np.array([2**64 - 1], np.uint64)))],
        12: lambda: [_response(two_d, booleans)],
    }
    return scripts[mode]()


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            for response in _script(mode):
                sender.send(response)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
