"""MODE 1: FINAL before any response; 2: a second response; 3: send after FINAL; 4: async execute
in default mode (awaited); 5: answer through the sender and return None."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def text_response(text):
    return pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=np.object_))])


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
        sender = request.get_response_sender()
        if mode == 4:
            return self._async(requests)
        if mode == 5:
            sender.send(text_response("sent through the sender"), flags=FINAL)
            return [None]
        try:
            if mode == 1:
                sender.send(flags=FINAL)
            elif mode == 2:
                sender.send(text_response("first"))
                sender.send(text_response("second"))
            elif mode == 3:
                sender.send(text_response("first"), flags=FINAL)
                sender.send(text_response("after final"))
        except pb_utils.TritonModelException as error:
            if mode == 1:
                return [text_response(str(error))]
            sender.send(flags=FINAL) if mode == 2 else None
            print(f"sender_rules: {error}", flush=True)
            return [None]
        return [text_response("no error")]

    async def _async(self, requests):
        await asyncio.sleep(0.01)
        return [text_response("async default mode")]
