"""The pre-built JSON load generator: the servers' cost of JSON tensors, not the client's.

tritonclient's HTTP client turns a 1 MiB FP32 tensor into a 5 MB JSON text with `json` on every
call and parses the answer back into a list, about a second of Python per request: with it in the
loop every server looks alike. This generator serialises each point's request once, POSTs those
bytes over aiohttp, and reads the answer without parsing it; the first answer of each window is
parsed and compared with the input, so a wrong server cannot look fast. Same window and
percentiles as `loadgen` (it reuses its window).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import numpy as np

from compare.loadgen import Point, Sample, _window, expected_outputs, model_inputs


class _Client:
    """What `loadgen._window` calls: `infer(model, inputs, outputs=...)` -> the answer's bytes."""

    def __init__(self, url: str, body: bytes, concurrency: int) -> None:
        self._url, self._body = url, body
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(8, concurrency)),
                                              auto_decompress=False)
        self._headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}

    async def infer(self, model: str, inputs: Any = None, outputs: Any = None, **_: Any) -> bytes:
        url = f"http://{self._url}/v2/models/{model}/infer"
        async with self._session.post(url, data=self._body, headers=self._headers) as response:
            answer = await response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {answer[:200]!r}")
            return answer

    async def close(self) -> None:
        await self._session.close()


class _Requests:
    """Every worker sends the same pre-built body."""

    extra: dict[str, Any] = {}

    def build(self, shm: None, worker: int) -> tuple[None, None]:
        return None, None


def request_body(point: Point, inputs: dict[str, np.ndarray]) -> bytes:
    tensors = [{"name": name, "datatype": "FP32", "shape": list(array.shape), "data": array.ravel().tolist()}
               for name, array in inputs.items()]
    outputs = [{"name": name, "parameters": {"binary_data": False}}
               for name in expected_outputs(point.model, inputs)]
    return json.dumps({"inputs": tensors, "outputs": outputs}).encode()


async def measure(url: str, point: Point, warmup: float, seconds: float, min_samples: int = 5,
                  max_seconds: float = 60.0) -> Sample:
    """Drive a JSON-tensor point with pre-built bodies. Raises RuntimeError on a wrong answer."""
    inputs = model_inputs(point.model, point.nbytes)
    client = _Client(url, request_body(point, inputs), point.concurrency)
    try:
        answer = json.loads(await client.infer(point.model))
        got = {o["name"]: np.asarray(o["data"], dtype=np.float32) for o in answer["outputs"]}
        for name, want in expected_outputs(point.model, inputs).items():
            if name not in got or not np.array_equal(got[name], want.ravel()):
                raise RuntimeError(f"{point.model} answered a wrong {name} over JSON")
        return await _window(client, _Requests(), point, None, warmup, seconds, min_samples,  # type: ignore[arg-type]
                             max_seconds)
    finally:
        await client.close()
