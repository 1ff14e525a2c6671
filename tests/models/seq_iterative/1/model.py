"""Request rescheduling (iterative sequences), after Triton's own examples.

Decoupled: a request with IN = n is executed n times; each run sends OUT = runs left, RUNS = runs
so far and BATCH = requests in that execute call, and reschedules the request until none is left,
then sends FINAL.
Default mode: the first run of a request reschedules it (its entry is None); the second answers
OUT = IN, RUNS = 2. With the config parameter MODE = "answer_rescheduled", the first run returns
a response for the rescheduled request (which Triton refuses).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.mode = config.get("parameters", {}).get("MODE", {}).get("string_value", "")
        # Runs so far per request, keyed by id(request) and holding the request itself: a request the
        # server drops while it is rescheduled (its sequence evicted) never comes back to delete its
        # entry, and were only its id kept, the next request could reuse that address and inherit
        # the count.
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = id(request)
            runs = self.runs.get(key, (request, 0))[1] + 1
            self.runs[key] = (request, runs)
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            if self.decoupled:
                left = value - runs
                request.get_response_sender().send(self._response(left, runs, len(requests)))
                if left > 0:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                else:
                    del self.runs[key]
                    request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif runs == 1:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(self._response(value, runs, len(requests))
                                 if self.mode == "answer_rescheduled" else None)
            else:
                del self.runs[key]
                responses.append(self._response(value, runs, len(requests)))
        return None if self.decoupled else responses

    @staticmethod
    def _response(out, runs, batch):
        column = lambda v: np.array([[v]], np.int32)  # noqa: E731
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", column(out)), pb_utils.Tensor("RUNS", column(runs)),
                                           pb_utils.Tensor("BATCH", column(batch))])
