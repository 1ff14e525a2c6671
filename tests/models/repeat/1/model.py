"""Streams COUNT responses from a thread; stops early when the request is cancelled and logs when
it noticed (for the cancellation-latency test)."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        counts = [int(pb_utils.get_input_tensor_by_name(r, "COUNT").as_numpy()[0]) for r in requests]
        if min(counts) == -1:
            return [None] * len(requests)  # breaks the decoupled rule on purpose
        if min(counts) == -2:  # sends after FINAL on purpose
            sender = requests[0].get_response_sender()
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            try:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))]))
            except pb_utils.TritonModelException as error:
                print(f"repeat: {error}", flush=True)
            return None
        for request in requests:
            threading.Thread(target=self._stream, args=(request,), daemon=True).start()
        return None

    def _stream(self, request):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
        delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]) / 1000
        for index in range(count):
            if request.is_cancelled():
                print(f"repeat: cancelled at {time.monotonic():.6f} after {index} responses", flush=True)
                error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            out = pb_utils.Tensor("OUT", np.array([index], np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
            if delay:
                time.sleep(delay)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
