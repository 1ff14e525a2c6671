import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        responses = []
        for request in requests:
            if json.loads(request.parameters()).get("drop"):
                self.kept.clear()
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            answer = pb_utils.InferenceRequest(model_name="bls_leaf", inputs=[pb_utils.Tensor("IN", data)],
                                               requested_output_names=["OUT"]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()
            self.kept.append(out)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array(out)), pb_utils.Tensor("KEPT", np.array([len(self.kept)], np.int64))]))
        return responses
