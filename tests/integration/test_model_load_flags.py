"""`--model-load-thread-count` and `--model-load-retry-count` with a real backend and real stubs."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from harness import Backend

_CONFIG = """backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

# initialize() records when it ran (in the model's directory), taking 0.6 s.
_TIMED = '''import os, time

class TritonPythonModel:
    def initialize(self, args):
        start = time.time()
        time.sleep(0.6)
        path = os.path.join(args["model_repository"], "times")
        with open(path, "a") as f:
            f.write(f"{start} {time.time()}\\n")

    def execute(self, requests):
        return []
'''

# initialize() fails the first FAILURES times it runs (it counts in a file of its directory).
_FLAKY = '''import os

FAILURES = {failures}

class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], "attempts")
        attempts = int(open(path).read()) if os.path.exists(path) else 0
        with open(path, "w") as f:
            f.write(str(attempts + 1))
        if attempts < FAILURES:
            raise RuntimeError(f"flaky failure {{attempts + 1}}")

    def execute(self, requests):
        return []
'''


def _model(repository: Path, name: str, source: str) -> Path:
    directory = repository / name
    (directory / "1").mkdir(parents=True)
    (directory / "config.pbtxt").write_text(_CONFIG)
    (directory / "1" / "model.py").write_text(source)
    return directory


def _overlaps(repository: Path, names: list[str]) -> int:
    """How many pairs of the models' initialize() calls ran at the same time."""
    spans = [tuple(map(float, (repository / name / "times").read_text().split())) for name in names]
    return sum(1 for i, a in enumerate(spans) for b in spans[i + 1:] if a[0] < b[1] and b[0] < a[1])


@pytest.mark.parametrize("threads, parallel", [(1, False), (3, True)])
def test_load_thread_count_bounds_parallel_loads(tmp_path: Path, threads: int, parallel: bool) -> None:
    repository = tmp_path / "models"
    names = ["timed_a", "timed_b", "timed_c"]
    for name in names:
        _model(repository, name, _TIMED)
    started = time.monotonic()
    with Backend(repository, f"--model-load-thread-count={threads}"):
        elapsed = time.monotonic() - started
    overlaps = _overlaps(repository, names)
    if parallel:
        assert overlaps > 0
    else:
        assert overlaps == 0 and elapsed > 1.8, (overlaps, elapsed)


def test_load_retry_count(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    model = _model(repository, "flaky", _FLAKY.format(failures=2))
    with Backend(repository, "--model-load-retry-count=2") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            assert client.is_model_ready("flaky")
        finally:
            client.close()
        assert backend.log().count("retrying (") == 2
    assert (model / "attempts").read_text() == "3"
    (model / "attempts").unlink()
    failing = Backend(repository, "--model-load-retry-count=1", expect_exit=True)
    failing.args += ["--http-port=0", "--grpc-port=0", "--metrics-port=0"]
    failing.start()
    try:
        assert failing.wait_exit() == 1  # two tries, both fail: --exit-on-error ends the server
        assert "flaky failure 2" in failing.log()
    finally:
        failing.stop(check=False)
    assert (model / "attempts").read_text() == "2"


_ECHO = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.tag = np.array([{tag}], np.float32)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + self.tag)]) for r in requests]
'''


def _infer(backend: Backend, model: str) -> float:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], np.float32))
        return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0])
    finally:
        client.close()


def test_python_based_backend_from_backend_directory(tmp_path: Path) -> None:
    backends = tmp_path / "backends"
    (backends / "plus_ten").mkdir(parents=True)
    (backends / "plus_ten" / "model.py").write_text(_ECHO.format(tag=10))
    repository = tmp_path / "models"
    (repository / "uses_backend" / "1").mkdir(parents=True)  # no model.py: the backend's serves it
    (repository / "uses_backend" / "config.pbtxt").write_text(_CONFIG.replace('"python"', '"plus_ten"'))
    _model(repository, "plain", _ECHO.format(tag=1))
    with Backend(repository, f"--backend-directory={backends}") as backend:
        assert _infer(backend, "uses_backend") == 11.0
        assert _infer(backend, "plain") == 2.0


def test_model_config_name_picks_the_custom_config(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    model = _model(repository, "configured", _ECHO.format(tag=1))
    _model(repository, "default_only", _ECHO.format(tag=1))
    (model / "configs").mkdir()
    (model / "configs" / "big.pbtxt").write_text(_CONFIG + "max_batch_size: 8\n")
    with Backend(repository, "--model-config-name=big") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            assert client.get_model_config("configured")["max_batch_size"] == 8
            assert client.get_model_config("default_only")["max_batch_size"] == 0  # falls back to config.pbtxt
        finally:
            client.close()
    with Backend(repository) as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            assert client.get_model_config("configured")["max_batch_size"] == 0
        finally:
            client.close()
