"""`--model-load-thread-count` and `--model-load-retry-count` with a real backend and real stubs."""

from __future__ import annotations

import time
from pathlib import Path

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
