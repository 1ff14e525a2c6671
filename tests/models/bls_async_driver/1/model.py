"""BLS from an `async def execute`.

    gather     `count` concurrent `await async_exec()` calls to bls_leaf (IN + i each); OUT = their sums
    decoupled  `await async_exec(decoupled=True)` on repeat; OUT = the values streamed
    timeout    `await async_exec()` on slow with a BLS timeout of `bls_timeout_us`
    inspect    pystub_backend.stub.features.bls.inspect() (see bls_driver)
    many       `count` calls in waves of `width` concurrent ones: to bls_leaf (small and 64 KiB
               tensors), to a model that does not exist, and decoupled ones to repeat
"""

import asyncio
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _out(response):
    return pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out, info = await getattr(self, "_" + params["mode"])(data, params)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.asarray(out, np.float32)),
                pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_))]))
        return responses

    async def _gather(self, data, params):
        count = int(params.get("count", 8))
        started = time.monotonic()
        calls = [pb_utils.InferenceRequest(model_name="bls_leaf", inputs=[pb_utils.Tensor("IN", data + i)],
                                           requested_output_names=["OUT"]).async_exec() for i in range(count)]
        results = await asyncio.gather(*calls)
        errors = [r.error().message() for r in results if r.has_error()]
        sums = [float(_out(r).sum()) for r in results if not r.has_error()]
        return np.array(sums, np.float32), {"errors": errors, "seconds": time.monotonic() - started}

    async def _decoupled(self, data, params):
        request = pb_utils.InferenceRequest(
            model_name="repeat", requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("COUNT", np.array([int(params.get("count", 4))], np.int32)),
                    pb_utils.Tensor("DELAY_MS", np.array([0], np.int32))])
        iterator = await request.async_exec(decoupled=True)
        values = [int(_out(r)[0]) for r in iterator if r.output_tensors()]
        return np.array(values, np.float32), {"type": type(iterator).__name__}

    async def _timeout(self, data, params):
        request = pb_utils.InferenceRequest(
            model_name="slow", inputs=[pb_utils.Tensor("DELAY_MS", np.array([params["delay_ms"]], np.int32))],
            requested_output_names=["OUTPUT0"], timeout=int(params["bls_timeout_us"]))
        started = time.monotonic()
        response = await request.async_exec()
        error = response.error().message() if response.has_error() else None
        return data, {"error": error, "seconds": time.monotonic() - started}

    async def _many(self, data, params):
        count, width, calls, bad = int(params.get("count", 100)), int(params.get("width", 25)), 0, 0
        big = np.ones(16384, np.float32)
        while calls < count:
            wave = []
            for index in range(min(width, count - calls)):
                kind = (calls + index) % 4
                target = "no_such_model" if kind == 2 else "bls_leaf"
                tensor = big if kind == 1 else data
                wave.append(pb_utils.InferenceRequest(model_name=target, inputs=[pb_utils.Tensor("IN", tensor)],
                                                      requested_output_names=["OUT"]).async_exec(
                                                          decoupled=kind == 3))
            results = await asyncio.gather(*wave)
            for index, result in enumerate(results):
                kind = (calls + index) % 4
                if kind == 3:
                    result = [r for r in result if r.output_tensors()][0]
                expected_error = kind == 2
                if result.has_error() != expected_error:
                    bad += 1
            calls += len(wave)
        return data, {"calls": calls, "bad": bad}

    async def _inspect(self, data, params):
        import gc

        from pystub_backend.stub.features import bls
        gc.collect()
        return data, bls.inspect()
