"""Streams COUNT responses from a thread; stops early when cancelled (and says so in the log)."""

import threading
import time

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._stream, args=(request,), daemon=True).start()
        return None

    def _stream(self, request):
        sender = request.get_response_sender()
        data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
        count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
        delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]) / 1000
        for index in range(count):
            if request.is_cancelled():
                print(f"ens_stream: cancelled after {index} responses", flush=True)
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "cancelled", pb_utils.TritonError.CANCELLED)), flags=FINAL)
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data + 10 * index)]))
            if delay:
                time.sleep(delay)
        sender.send(flags=FINAL)
