import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        print("unary_cancel: waiting for a cancellation", flush=True)
        deadline = time.monotonic() + 10
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.005)
        if request.is_cancelled():
            print(f"unary_cancel: cancelled at {time.monotonic():.6f}", flush=True)
            error = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
            return [pb_utils.InferenceResponse(error=error)]
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(request, "INPUT0")])]
