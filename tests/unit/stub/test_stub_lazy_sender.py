"""A request's response sender is made when the model first asks for it (stub/execute_batch.py):
the behaviours that hang on the sender stay the same for a model that never asks. Real stubs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
from model_stub import execute, model_stub

from pystub_backend.backend.inference import InferRequest, Tensor

_MODEL = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

KEPT = []


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 0:  # answered by the return value
                value = np.full(1, 7 + int(request.is_cancelled()), "int64")
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            elif mode == 1:  # None without a sender: the request is dropped, its sender fails it
                out.append(None)
            else:  # None, answered later from a thread through a sender it asks for only then
                KEPT.append(request)
                threading.Timer(0.05, self._answer).start()
                out.append(None)
        return out

    def _answer(self):
        request = KEPT.pop()
        request.get_response_sender().send(
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(1, 9, "int64"))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''
def _run(tmp_path: Path, mode: int) -> Any:
    async def main() -> Any:
        async with model_stub(tmp_path, "lazy", _MODEL) as stub:
            request = InferRequest("lazy", inputs=[Tensor("MODE", "INT64", (1,), np.array([mode], np.int64))])
            (response,) = await asyncio.wait_for(execute(stub, [request]), 30.0)
            if not hasattr(response, "outputs"):
                return response
            value = np.frombuffer(response.outputs[0].data, dtype=np.int64).tolist()
            response.release()
            return value

    return asyncio.run(main())


def test_a_returned_response_needs_no_sender(tmp_path: Path) -> None:
    assert _run(tmp_path, 0) == [7]  # is_cancelled() works without a sender: False


def test_a_request_left_unanswered_without_a_sender_is_failed(tmp_path: Path) -> None:
    failure = _run(tmp_path, 1)
    assert "was destroyed before it sent the final response" in str(failure)


def test_a_sender_asked_for_after_execute_still_answers(tmp_path: Path) -> None:
    assert _run(tmp_path, 2) == [9]
