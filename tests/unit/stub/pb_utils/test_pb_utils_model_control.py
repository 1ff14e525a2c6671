"""pb_utils model control (API.md 6.12), get_model_dir, and the modules user models import."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from pystub_backend.stub import pb_utils
from pystub_backend.stub.pb_utils import TritonModelException, _runtime

MODEL_PATH = Path(pb_utils.__file__).resolve().parent.parent / "_model_path"


@pytest.fixture(autouse=True)
def _reset_runtime():
    yield
    _runtime.set_model_control(None)
    _runtime.set_model_dir(None)
    _runtime.set_shm_free_memory(None)


class Control:
    def __init__(self, fail_with=None, ready=True):
        self.calls = []
        self.fail_with = fail_with
        self.ready = ready

    def _record(self, *call):
        self.calls.append(call)
        if self.fail_with is not None:
            raise self.fail_with

    def load_model(self, name, config, files):
        self._record("load", name, config, files)

    def unload_model(self, name, unload_dependents):
        self._record("unload", name, unload_dependents)

    def is_model_ready(self, name, version):
        self._record("ready", name, version)
        return self.ready


def test_refused_without_model_control():
    with pytest.raises(TritonModelException) as exc:
        pb_utils.load_model("m")
    assert str(exc.value).startswith("Failed to load model: ")
    assert "--model-control-mode=explicit" in str(exc.value)
    with pytest.raises(TritonModelException) as exc:
        pb_utils.unload_model("m")
    assert str(exc.value).startswith("Failed to unload model: ")
    with pytest.raises(TritonModelException) as exc:
        pb_utils.is_model_ready("m")
    assert "--model-control-mode=explicit" in str(exc.value)


def test_calls_reach_the_handler():
    control = Control(ready=False)
    _runtime.set_model_control(control)
    pb_utils.load_model("m")
    pb_utils.load_model(model_name="m2", config='{"backend": "python"}', files={"file:1/model.py": b"code"})
    pb_utils.unload_model("m", unload_dependents=True)
    assert pb_utils.is_model_ready("m", "2") is False
    assert pb_utils.is_model_ready("m") is False
    assert control.calls == [
        ("load", "m", "", None),
        ("load", "m2", '{"backend": "python"}', {"file:1/model.py": b"code"}),
        ("unload", "m", True),
        ("ready", "m", "2"),
        ("ready", "m", ""),
    ]


@pytest.mark.parametrize("files", [["file:1/model.py"], {"file:1/model.py": "text"}, {1: b"x"}])
def test_load_model_files_must_be_a_dict_of_bytes(files):
    _runtime.set_model_control(Control())
    with pytest.raises(TritonModelException) as exc:
        pb_utils.load_model("m", files=files)
    assert str(exc.value) == "failed to load model 'm', files should be a dictionary of file paths and file contents"


def test_handler_failures_get_the_api_prefixes():
    _runtime.set_model_control(Control(fail_with=RuntimeError("no such model")))
    with pytest.raises(TritonModelException) as exc:
        pb_utils.load_model("m")
    assert str(exc.value) == "Failed to load model: no such model"
    with pytest.raises(TritonModelException) as exc:
        pb_utils.unload_model("m")
    assert str(exc.value) == "Failed to unload model: no such model"
    _runtime.set_model_control(Control(fail_with=TritonModelException("Failed to load model: already prefixed")))
    with pytest.raises(TritonModelException) as exc:
        pb_utils.load_model("m")
    assert str(exc.value) == "Failed to load model: already prefixed"


@pytest.mark.parametrize("version", ["abc", "v1", "-"])
def test_is_model_ready_bad_version(version):
    _runtime.set_model_control(Control())
    with pytest.raises(TritonModelException) as exc:
        pb_utils.is_model_ready("m", version)
    assert str(exc.value).startswith(f"failed to get model version from specified version string '{version}' ")


def test_model_control_argument_types():
    _runtime.set_model_control(Control())
    with pytest.raises(TypeError):
        pb_utils.load_model(None)
    with pytest.raises(TypeError):
        pb_utils.load_model("m", config=None)
    with pytest.raises(TypeError):
        pb_utils.unload_model("m", unload_dependents=None)
    with pytest.raises(TypeError):
        pb_utils.is_model_ready("m", model_version=None)


def test_get_model_dir(tmp_path):
    with pytest.raises(TritonModelException):
        pb_utils.get_model_dir()
    _runtime.set_model_dir(str(tmp_path))
    assert pb_utils.get_model_dir() == str(tmp_path)


def _import_from_model_path(name):
    sys.path.append(str(MODEL_PATH))
    try:
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(MODEL_PATH))
        sys.modules.pop(name, None)


def test_triton_python_backend_utils_reexports_the_same_objects():
    module = _import_from_model_path("triton_python_backend_utils")
    for name in pb_utils.__all__:
        assert getattr(module, name) is getattr(pb_utils, name), name
    assert module.Tensor is pb_utils.Tensor


def test_public_api_names():
    expected = {
        "Tensor", "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "ResponseIterator",
        "PreferredMemory", "InferenceTrace", "TritonError", "TritonModelException", "Logger", "MetricFamily",
        "Metric", "ModelConfig", "MemoryType", "get_input_tensor_by_name", "get_output_tensor_by_name",
        "get_input_config_by_name", "get_output_config_by_name", "using_decoupled_model_transaction_policy",
        "get_model_dir", "triton_to_numpy_type", "numpy_to_triton_type", "triton_string_to_numpy",
        "TRITON_STRING_TO_NUMPY", "serialize_byte_tensor", "deserialize_bytes_tensor", "load_model",
        "unload_model", "is_model_ready", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
        "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
        "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
        "TRITONSERVER_MEMORY_GPU", "TRITONSERVER_MEMORY_CPU",
        # pystub extension: model multiplexing
        "get_multiplexed_model", "async_get_multiplexed_model", "get_multiplexed_model_id", "new_output_array",
    }
    assert set(pb_utils.__all__) == expected
    assert all(hasattr(pb_utils, name) for name in expected)


def test_c_python_backend_utils_free_memory():
    module = _import_from_model_path("c_python_backend_utils")
    assert module.shared_memory.free_memory() == 0
    _runtime.set_shm_free_memory(lambda: 4096)
    assert module.shared_memory.free_memory() == 4096
