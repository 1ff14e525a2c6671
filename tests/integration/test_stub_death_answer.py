"""A request sent in the moment its stub died, through a real instance (a stub of the examples'
identity_fp32), the default scheduler and the exchange.

The stub is SIGKILLed and the test waits, without letting the event loop run, until the process is
gone: the backend has not read the stub's EOF yet, so the instance still looks healthy and the
scheduler sends at once. The send finds the channel closed, the exchange fails every request in
flight there and then, and the request's stream is failed inside `submit`, before the scheduler asks
it for its answer. The caller must get the stub's error: the chaos soak's gRPC clients once got a
success without outputs instead (ResponseStream.answer released the failure it was handed), a
"wrong answer" at the kills of identity_fp32's stub (tests/integration/test_chaos.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import numpy as np
import pytest
from harness import ROOT

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.install import feature_services
from pystub_backend.backend.inference import InferRequest, Tensor
from pystub_backend.backend.scheduling.default import DefaultScheduler
from pystub_backend.backend.supervision.instance import InstanceSpec, ModelInstance
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.telemetry.statistics import ModelStatistics

MODEL_DIR = ROOT / "examples" / "models" / "identity_fp32"
CONFIG = {"name": "identity_fp32", "backend": "python", "max_batch_size": 8,
          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}


def _instance() -> ModelInstance:
    args = {"model_config": json.dumps(CONFIG), "model_instance_kind": "CPU",
            "model_instance_name": "identity_fp32_0", "model_instance_device_id": "0",
            "model_repository": str(MODEL_DIR), "model_version": "1", "model_name": "identity_fp32"}
    spec = InstanceSpec("identity_fp32", str(MODEL_DIR / "1" / "model.py"), args, {"decoupled": False},
                        StubSettings(), feature_services(None))
    return ModelInstance("identity_fp32_0", spec)


def _request(values: np.ndarray) -> InferRequest:
    return InferRequest("identity_fp32", inputs=[Tensor("INPUT0", "FP32", values.shape, values.tobytes())])


def _gone(pid: int) -> None:
    """Block (the event loop does not run meanwhile) until `pid` has exited, every thread of it,
    so that its descriptors (its end of the channel) are closed; it stays unreaped (WNOWAIT)."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


@pytest.mark.timeout(60)
def test_a_request_sent_as_its_stub_dies_gets_the_stub_error_not_an_empty_success() -> None:
    async def main() -> None:
        instance = _instance()
        await instance.start()
        scheduler = DefaultScheduler([instance], ModelStatistics("identity_fp32", "1"))
        try:
            values = np.arange(4, dtype=np.float32).reshape(1, 4) + 7
            answer = await scheduler.schedule(_request(values), 1)  # the path answers while the stub lives
            try:
                [output] = answer.outputs
                assert np.array_equal(np.frombuffer(output.data, np.float32).reshape(1, 4), values)
            finally:
                answer.release()
            stub = instance.stub
            assert stub is not None and stub.pid is not None
            os.kill(stub.pid, signal.SIGKILL)
            _gone(stub.pid)
            assert instance.healthy, "the backend must not have seen the death yet: the send is what finds it"
            with pytest.raises(ServerError, match=r"Stub process 'identity_fp32_0' is not healthy\."):
                response = await scheduler.schedule(_request(values), 1)
                response.release()
                raise AssertionError(f"a success with outputs {[t.name for t in response.outputs]} "
                                     "from a stub that was dead when the request was sent")
        finally:
            await instance.stop(1.0)

    asyncio.run(main())
