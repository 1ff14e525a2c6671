"""Keeps a running sum per sequence and reports how it was called.

Per request: OUTPUT = the sequence's sum so far (START resets it), FLAGS = request.flags(),
BATCH = requests in this execute call, CALL = the instance's execute call number, PID = the stub's
pid, LIVE = sequences it holds state for, CORRID = repr(correlation_id()), CONTROLS = JSON
{input name: [numpy dtype, value]} of every input that is not INPUT (the control inputs).
A request parameter `sleep_ms` makes the call sleep first.

`sequence_evicted` logs `EVICTED cid=<repr> reason=<reason> at=<time.time()>` and frees the
sequence's state; for correlation id 666 it then raises (the backend must only log it). With the
config parameter ASYNC_HOOK = "1" the hook is an `async def`. `finalize` logs `FINALIZE`.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}
        self.calls = 0
        parameters = json.loads(args["model_config"]).get("parameters", {})
        if parameters.get("ASYNC_HOOK", {}).get("string_value") == "1":
            self.sequence_evicted = self._async_evicted

    def execute(self, requests):
        self.calls += 1
        sleep_ms = max([json.loads(r.parameters()).get("sleep_ms", 0) for r in requests], default=0)
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            cid = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[cid] = 0
            self.sums[cid] = self.sums.get(cid, 0) + value
            total = self.sums[cid]
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[cid]
            controls = {t.name(): [str(t.as_numpy().dtype), _plain(t.as_numpy().reshape(-1)[0])]
                        for t in request.inputs() if t.name() != "INPUT"}
            column = lambda v: np.array([[v]], np.int32)  # noqa: E731
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", column(total)),
                pb_utils.Tensor("FLAGS", column(request.flags())),
                pb_utils.Tensor("BATCH", column(len(requests))),
                pb_utils.Tensor("CALL", column(self.calls)),
                pb_utils.Tensor("PID", column(os.getpid())),
                pb_utils.Tensor("LIVE", column(len(self.sums))),
                pb_utils.Tensor("CORRID", np.array([[repr(cid)]], dtype=np.object_)),
                pb_utils.Tensor("CONTROLS", np.array([[json.dumps(controls)]], dtype=np.object_)),
            ]))
        return responses

    def sequence_evicted(self, correlation_id, reason):
        self._evicted(correlation_id, reason)

    async def _async_evicted(self, correlation_id, reason):
        self._evicted(correlation_id, reason)

    def _evicted(self, correlation_id, reason):
        pb_utils.Logger.log_info(f"EVICTED cid={correlation_id!r} reason={reason} at={time.time():.6f} "
                                 f"live_before={len(self.sums)}")
        self.sums.pop(correlation_id, None)
        if correlation_id == 666:
            raise RuntimeError("the hook failed on purpose")

    def finalize(self):
        pb_utils.Logger.log_info("FINALIZE seq_probe")


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if hasattr(value, "item") else value
