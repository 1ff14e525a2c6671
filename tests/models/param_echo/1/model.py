"""Returns PAD_BYTES as OUTPUT0, with a response parameter "pad" of PAD_BYTES characters and the
request's own parameters echoed as "echo" (their JSON): large responses leave the stub spilled."""


import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            pad = pb_utils.get_input_tensor_by_name(request, "PAD_BYTES").as_numpy()
            parameters = {"pad": "p" * int(pad[0]), "echo": request.parameters()}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pad)], parameters=parameters))
        return responses
