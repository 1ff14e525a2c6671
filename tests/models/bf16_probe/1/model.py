import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            info = {"dtype": tensor.triton_dtype(), "as_numpy": None}
            try:
                tensor.as_numpy()
            except pb_utils.TritonModelException as error:
                info["as_numpy"] = str(error)
            back = pb_utils.Tensor.from_dlpack("OUT", tensor.to_dlpack())
            info["dlpack_dtype"] = back.triton_dtype()
            responses.append(pb_utils.InferenceResponse([
                back, pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_))]))
        return responses
