"""What a model sees of its process, by request parameter `mode`:

    env    INFO = {argv (at import), helpers: {name: MARKER}, modules: {top-level name: file},
                   found: {generic name: importable?}}
    exit   sys.exit(3) from execute (the instance must keep serving)
    bytes  pb_utils calls with bytes where the API takes strings; INFO = what each returned
    spawn  INFO = {spawned: utils.triple(7) run in a multiprocessing "spawn" child}
OUT = [pid of the stub].
"""

import importlib.util
import json
import multiprocessing
import os
import sys

import backend
import ipc
import numpy as np
import pystub
import stub
import triton_python_backend_utils as pb_utils
import utils

_ARGV = list(sys.argv)
_HELPERS = {module.__name__: module.MARKER for module in (backend, ipc, pystub, stub, utils)}
_GENERIC = ("tools", "tests", "examples", "docs", "harness", "conftest", "handlers", "features", "frontends")


class TritonPythonModel:
    def initialize(self, args):
        self.argv = list(sys.argv)
        self.modules = {name: getattr(module, "__file__", None)
                        for name, module in list(sys.modules.items()) if "." not in name}

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = json.loads(request.parameters() or "{}").get("mode", "env")
            if mode == "exit":
                sys.exit(3)
            info = {"bytes": self._bytes, "spawn": self._spawn}.get(mode, self._env)()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([os.getpid()], np.float32)),
                pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_))]))
        return responses

    def _env(self):
        return {"argv_at_import": _ARGV, "argv": self.argv, "helpers": _HELPERS, "modules": self.modules,
                "found": {name: importlib.util.find_spec(name) is not None for name in _GENERIC}}

    def _spawn(self):
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return {"spawned": pool.apply(utils.triple, (7,))}

    def _bytes(self):
        request = pb_utils.InferenceRequest(model_name=b"bls_leaf", request_id=b"r1",
                                            inputs=[pb_utils.Tensor("IN", np.array([1.0], np.float32))],
                                            requested_output_names=[b"OUT"])
        response = request.exec()
        if response.has_error():
            return {"error": response.error().message()}
        pb_utils.Logger.log_info(b"env_probe: a bytes log message")
        error = pb_utils.TritonError(b"bytes message")
        return {"out": pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy().tolist(),
                "ready": pb_utils.is_model_ready(b"bls_leaf", b"1"), "error_message": error.message(),
                "request_id": request.request_id(), "requested": sorted(request.requested_output_names())}
