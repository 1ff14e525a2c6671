import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            call = pb_utils.InferenceRequest(model_name="delayed_stream", requested_output_names=["OUT"],
                                             inputs=[pb_utils.Tensor("SECONDS", seconds)])
            started = time.monotonic()
            iterator = await call.async_exec(decoupled=True)
            waited = time.monotonic() - started
            values = [float(r.output_tensors()[0].as_numpy()[0]) for r in iterator if r.output_tensors()]
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([waited, *values], np.float32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
