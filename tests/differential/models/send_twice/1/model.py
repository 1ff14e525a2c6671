"""A non-decoupled model that sends a second response before execute returns (see config.pbtxt)."""

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _response(text):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], dtype=np.object_))])


class TritonPythonModel:
    def initialize(self, args):
        self.second_send = "nothing sent yet"

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 2:
                responses.append(_response(self.second_send))
                continue
            sender = request.get_response_sender()
            flags = FINAL if mode == 1 else 0
            sender.send(_response("first"), flags=flags)
            try:
                sender.send(_response("second"), flags=flags)
                self.second_send = "ok"
            except Exception as error:  # noqa: BLE001 - what the second send raised is the answer of MODE 2
                self.second_send = f"{type(error).__name__}: {error}"
            responses.append(None)
        return None if all(r is None for r in responses) else responses
