"""Multiplexing test model (dynamic batching, async execute, async load, no unload_multiplexed).

The requests of a batch are served concurrently, so several can ask for one id while it loads.
OUTPUT0 = INPUT0 * the sub-model's factor; SERIAL = which load made the sub-model. Loads take
LOAD_DELAY_MS; ids starting with "bad" fail to load, which fails only the requests for that id.
An evicted sub-model is only dropped, so its `__del__` prints "sub-model <id> deleted".
"""

import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class SubModel:
    def __init__(self, model_id, serial):
        self.model_id = model_id
        self.serial = serial
        self.factor = 1 + sum(model_id.encode()) % 7

    def __del__(self):
        print(f"sub-model {self.model_id} deleted", flush=True)


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.delay = float(parameters.get("LOAD_DELAY_MS", {}).get("string_value", "0")) / 1000
        self.serial = 0

    async def load_multiplexed(self, model_id):
        await asyncio.sleep(self.delay)
        if model_id.startswith("bad"):
            raise ValueError(f"no weights for {model_id}")
        self.serial += 1
        return SubModel(model_id, self.serial)

    async def execute(self, requests):
        results = await asyncio.gather(*(self._one(request) for request in requests), return_exceptions=True)
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(result)))
                if isinstance(result, Exception) else result for result in results]

    async def _one(self, request):
        sub_model = await pb_utils.async_get_multiplexed_model(request)
        values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("OUTPUT0", values * np.float32(sub_model.factor)),
            pb_utils.Tensor("SERIAL", np.array([[sub_model.serial]], dtype=np.int32)),
        ])
