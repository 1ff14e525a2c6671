import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            if seconds[0] < 0:
                raise ValueError("negative sleep requested")
            await asyncio.sleep(float(seconds[0]))
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", seconds)]),
                                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    async def is_ready(self):
        await asyncio.sleep(0)
        return True
