"""Decoupled: each request waits on a thread of its own until it is cancelled (at most 10 s),
then is answered with CANCELLED; one never cancelled gets its input back. Prints when it starts
waiting, so a test knows the request is in the model."""

import threading
import time

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _wait(request):
    sender = request.get_response_sender()
    value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().copy()
    print("wait_cancel: waiting for a cancellation", flush=True)
    deadline = time.monotonic() + 10
    while not sender.is_cancelled() and time.monotonic() < deadline:
        time.sleep(0.01)
    if sender.is_cancelled():
        error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
        sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
    else:
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]), flags=FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=_wait, args=(request,), daemon=True).start()
        return None
