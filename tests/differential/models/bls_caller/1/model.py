"""BLS: exec() on the model named by MODEL; an error of the inner call becomes this response's
error, with the inner message prefixed by "inner: "."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0].decode()
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("INPUT0", "INPUT1")]
            inner = pb_utils.InferenceRequest(model_name=target, inputs=inputs,
                                              requested_output_names=["OUTPUT0", "OUTPUT1"]).exec()
            if inner.has_error():
                error = pb_utils.TritonError("inner: " + inner.error().message())
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            outputs = [pb_utils.get_output_tensor_by_name(inner, name) for name in ("OUTPUT0", "OUTPUT1")]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(t.name(), t.as_numpy()) for t in outputs]))
        return responses
