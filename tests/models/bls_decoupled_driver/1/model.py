"""A decoupled model that makes BLS calls: the chain of bls_driver (OUT = IN + hops), run on a
thread of its own (the instance stays free: recursion through it works) or inside execute (the
instance is held: recursion through it is the deadlock pystub refuses)."""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _out(response, name):
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            if params.get("from", "thread") == "thread":
                threading.Thread(target=self._answer, args=(request, params), daemon=True).start()
            else:
                self._answer(request, params)
        return None

    def _answer(self, request, params):
        data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        chain = [name for name in params.get("chain", "").split(",") if name]
        out, info = data + 1, {"path": [self.name]}
        if chain:
            call = pb_utils.InferenceRequest(
                model_name=chain[0], inputs=[pb_utils.Tensor("IN", data)], requested_output_names=["OUT", "INFO"],
                parameters={"mode": "chain", "chain": ",".join(chain[1:]), "from": params.get("from", "thread")})
            if "decoupled" in chain[0]:
                response = [r for r in call.exec(decoupled=True) if r.has_error() or r.output_tensors()][0]
            else:
                response = call.exec()
            if response.has_error():
                out, info = data, {"path": [self.name], "error": response.error().message()}
            else:
                info = json.loads(_out(response, "INFO")[0])
                out, info["path"] = _out(response, "OUT") + 1, [self.name] + info["path"]
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", np.asarray(out, np.float32)),
            pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_))]), flags=FINAL)
