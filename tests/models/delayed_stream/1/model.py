import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._answer, args=(request,), daemon=True).start()

    def _answer(self, request):
        seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
        time.sleep(float(seconds[0]))
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", seconds)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
