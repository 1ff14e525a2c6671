"""Python-based backends: `backend: "<name>"` runs `<backend-directory>/<name>/model.py`.

What Triton 2.51 does, and what this checks (tools/compare runs the same model on it): the
backend's model.py is used even when the version directory has one; `args` are a python model's
(`model_repository` is the model's directory); `/config` shows `runtime: "model.py"`; and
`--backend-config=<name>,key=value` reaches neither `args` nor the environment of the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend

BACKEND_MODEL = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils
from helper import SCALE  # a sibling of the backend's model.py


class TritonPythonModel:
    def initialize(self, args):
        self.facts = json.dumps({"args": {k: v for k, v in args.items() if k != "model_config"},
                                 "config": json.loads(args["model_config"]), "file": __file__,
                                 "environ": dict(os.environ)})

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x * SCALE).astype(np.float32)),
                pb_utils.Tensor("FACTS", np.array([self.facts.encode()], dtype=object))]))
        return responses
'''

OWN_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("Y", np.full(2, -1, np.float32)),
            pb_utils.Tensor("FACTS", np.array([b"{}"], dtype=object))]) for _ in requests]
'''

CONFIG = '''backend: "{backend}"
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }}, {{ name: "FACTS", data_type: TYPE_STRING, dims: [ 1 ] }} ]
'''


def _model(repository: Path, name: str, backend: str, own_model: bool) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(CONFIG.format(backend=backend))
    if own_model:
        (repository / name / "1" / "model.py").write_text(OWN_MODEL)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    backends = tmp_path / "backends"
    (backends / "scaler").mkdir(parents=True)
    (backends / "scaler" / "model.py").write_text(BACKEND_MODEL)
    (backends / "scaler" / "helper.py").write_text("SCALE = 3\n")
    repository = tmp_path / "models"
    _model(repository, "scaled", "scaler", own_model=False)
    _model(repository, "scaled_too", "scaler", own_model=True)  # the backend's model.py wins
    _model(repository, "other", "no_such_backend", own_model=True)  # not installed: its own model.py, as before
    return backends, repository


def _infer(client: grpcclient.InferenceServerClient, model: str) -> tuple[np.ndarray, dict]:
    tensor = grpcclient.InferInput("X", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    result = client.infer(model, [tensor])
    return result.as_numpy("Y"), json.loads(result.as_numpy("FACTS")[0])


def test_a_python_based_backend_serves_its_models(layout: tuple[Path, Path]):
    backends, repository = layout
    with Backend(repository, f"--backend-directory={backends}", "--backend-config=scaler,secret-setting=4242",
                 "--backend-config=scaler,shm-default-byte-size=7340032") as backend:
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        http = httpclient.InferenceServerClient(backend.http_url)
        try:
            y, facts = _infer(client, "scaled")
            y_too, facts_too = _infer(client, "scaled_too")
            y_other, _ = _infer(client, "other")
            config = http.get_model_config("scaled")
        finally:
            client.close()
            http.close()
    assert y.tolist() == y_too.tolist() == [3.0, 6.0]
    assert y_other.tolist() == [-1.0, -1.0]
    assert facts["file"] == facts_too["file"] == str(backends / "scaler" / "model.py")
    assert facts["args"] == {"model_instance_kind": "CPU", "model_instance_name": "scaled_0",
                             "model_instance_device_id": "0", "model_repository": str(repository / "scaled"),
                             "model_version": "1", "model_name": "scaled"}
    assert (config["backend"], config["runtime"]) == ("scaler", "model.py")
    assert facts["config"]["runtime"] == "model.py"
    # Triton hands the backend's command-line config to nothing the model can read.
    visible = json.dumps(facts)
    assert "secret-setting" not in visible and "4242" not in visible and "7340032" not in visible


def test_without_the_backend_directory_the_version_directory_is_needed(layout: tuple[Path, Path]):
    _, repository = layout
    with Backend(repository, "--exit-on-error=false") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            index = {row["name"]: row for row in client.get_model_repository_index()}
        finally:
            client.close()
    assert index["scaled"]["state"] == "UNAVAILABLE"
    assert index["scaled"]["reason"] == ("Failed to preinitialize Python stub: Python model file not found in "
                                         f"'{repository / 'scaled' / '1' / 'model.py'}'")
    assert index["scaled_too"]["state"] == "READY"
