"""MLServer custom runtimes equivalent to examples/models/identity_fp32 and add_sub.

Copied next to MLServer's settings.json by the comparison harness and imported by MLServer (in
its bench venv), never by pystub. Like the Triton models they decode the inputs to numpy arrays
and encode numpy outputs: what a real model on MLServer does.
"""

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


def _inputs(payload: InferenceRequest) -> dict:
    return {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}


def _output(name: str, data):  # noqa: ANN001, ANN202 - numpy in, ResponseOutput out
    output = NumpyCodec.encode_output(name, data)
    output.shape = list(data.shape)  # the codec turns a 1-D array into [n, 1]
    return output


class Identity(MLModel):
    """OUTPUT0 = INPUT0."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        data = _inputs(payload)["INPUT0"]
        return InferenceResponse(model_name=self.name, outputs=[_output("OUTPUT0", data)])


class AddSub(MLModel):
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        data = _inputs(payload)
        outputs = [_output("OUTPUT0", data["INPUT0"] + data["INPUT1"]),
                   _output("OUTPUT1", data["INPUT0"] - data["INPUT1"])]
        return InferenceResponse(model_name=self.name, outputs=outputs)
