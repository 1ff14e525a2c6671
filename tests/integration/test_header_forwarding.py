"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern` with a real backend, a model
that returns its request parameters, and the real tritonclient (HTTP, gRPC unary and stream)."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend

_CONFIG = """backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""
_MODEL = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", np.array([r.parameters().encode()], dtype=np.object_))]) for r in requests]
'''
_HEADERS = {"x-trace-id": "abc", "x-tenant": "blue", "other": "not forwarded"}


def _repository(tmp_path: Path) -> Path:
    model = tmp_path / "models" / "params_echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(_CONFIG)
    (model / "1" / "model.py").write_text(_MODEL)
    return model.parent


def _parameters(result) -> dict:
    return json.loads(result.as_numpy("OUTPUT0")[0])


def _input(module):
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    return [tensor]


def test_matching_headers_become_parameters(tmp_path: Path) -> None:
    with Backend(_repository(tmp_path), "--http-header-forward-pattern=^x-", "--grpc-header-forward-pattern=^x-t") \
            as backend:
        http = httpclient.InferenceServerClient(backend.http_url)
        grpc = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            forwarded = _parameters(http.infer("params_echo", _input(httpclient), headers=dict(_HEADERS)))
            assert {k: v for k, v in forwarded.items() if k.lower() in _HEADERS} == {
                "x-trace-id": "abc", "x-tenant": "blue"}
            explicit = _parameters(http.infer("params_echo", _input(httpclient), headers=dict(_HEADERS),
                                              parameters={"x-tenant": "given"}))
            # Triton appends the header after the request's own parameter: its model reads the header's
            assert explicit["x-tenant"] == "blue"
            assert {k: v for k, v in _parameters(grpc.infer("params_echo", _input(grpcclient), headers=dict(_HEADERS)))
                    .items() if k in _HEADERS} == {"x-trace-id": "abc", "x-tenant": "blue"}
            results: queue.Queue = queue.Queue()
            grpc.start_stream(callback=lambda result, error: results.put((result, error)), headers=dict(_HEADERS))
            grpc.async_stream_infer("params_echo", _input(grpcclient))
            grpc.stop_stream()
            result, error = results.get(timeout=30)
            assert error is None and _parameters(result)["x-trace-id"] == "abc"
        finally:
            http.close()
            grpc.close()
    with Backend(_repository(tmp_path / "again")) as backend:  # without the flags nothing is forwarded
        http = httpclient.InferenceServerClient(backend.http_url)
        try:
            answered = _parameters(http.infer("params_echo", _input(httpclient), headers=dict(_HEADERS)))
            assert not set(answered) & set(_HEADERS)
        finally:
            http.close()
