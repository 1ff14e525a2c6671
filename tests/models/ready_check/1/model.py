"""is_ready() answers what the last request set: 0 True, 1 False, 2 not a bool, 3 raises,
4 sleeps 10 s (times out), 5 async True."""

import asyncio
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.state = 0
        self.calls = 0

    def is_ready(self):
        self.calls += 1
        if self.state == 1:
            return False
        if self.state == 2:
            return "yes"
        if self.state == 3:
            raise RuntimeError("readiness probe exploded")
        if self.state == 4:
            time.sleep(10)
        if self.state == 5:
            return self._async_ready()
        return True

    async def _async_ready(self):
        await asyncio.sleep(0.01)
        return True

    def execute(self, requests):
        responses = []
        for request in requests:
            self.state = int(pb_utils.get_input_tensor_by_name(request, "STATE").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", np.array([self.calls], np.int32))]))
        return responses
