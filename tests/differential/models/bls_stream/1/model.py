"""BLS with decoupled=True: OUTS = the OUT values `repeat` streamed, RESPONSES = responses
received (the last, empty one with the final flag included). An inner error is returned as this
request's error ("inner: <message>")."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "IN")
            inner = pb_utils.InferenceRequest(model_name="repeat", inputs=[count], requested_output_names=["OUT"])
            values, received, error = [], 0, None
            for response in inner.exec(decoupled=True):
                received += 1
                if response.has_error():
                    error = response.error().message()
                    continue
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    values.extend(int(v) for v in out.as_numpy())
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("inner: " + error)))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTS", np.array(values, np.int32)),
                pb_utils.Tensor("RESPONSES", np.array([received], np.int32))]))
        return responses
