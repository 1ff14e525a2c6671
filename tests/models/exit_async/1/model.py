import asyncio
import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep(0)
        if any(json.loads(r.parameters() or "{}").get("exit") for r in requests):
            sys.exit("leaving from a coroutine")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([os.getpid()], np.float32))])
                for _ in requests]
