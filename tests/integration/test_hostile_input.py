"""Hostile JSON and hostile loads: malformed input of any depth or size gets 400
without a traceback in the log, on every endpoint that reads JSON; override files are capped and
written off the event loop, so health keeps answering during the largest allowed load."""

from __future__ import annotations

import base64
import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Backend, make_repository, module_backend

from pystub_backend.backend.models.overrides import MAX_OVERRIDE_BYTES, MAX_OVERRIDE_FILES

OVERRIDE_MODEL = b'''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''
OVERRIDE_CONFIG = json.dumps({
    "name": "from_files", "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
})
JSON_ENDPOINTS = [
    "/v2/models/identity_fp32/infer",
    "/v2/models/identity_fp32/generate",
    "/v2/models/identity_fp32/generate_stream",
    "/v2/repository/index",
    "/v2/repository/models/identity_fp32/load",
    "/v2/repository/models/identity_fp32/unload",
    "/v2/logging",
    "/v2/systemsharedmemory/region/r/register",
]
DEEP_BODIES = {
    "unclosed": b"[" * 100_000,
    "balanced": b"[" * 100_000 + b"]" * 100_000,
    "objects": b'{"a":' * 30_000 + b"1" + b"}" * 30_000,
    "inside a document": b'{"parameters":{"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}}",
}


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("hostile"), "identity_fp32")
    with module_backend(Backend(repository, "--model-control-mode=explicit", "--load-model=identity_fp32")) as server:
        yield server


def post(backend: Backend, path: str, body: bytes, timeout: float = 60) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{backend.http_url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _load_body(files: dict[str, bytes]) -> bytes:
    parameters = {"config": OVERRIDE_CONFIG, **{k: base64.b64encode(v).decode() for k, v in files.items()}}
    return json.dumps({"parameters": parameters}).encode()


@pytest.mark.parametrize("path", JSON_ENDPOINTS)
def test_deep_json_is_a_400_without_traceback(backend: Backend, path: str):
    for shape, body in DEEP_BODIES.items():
        status, text = post(backend, path, body)
        assert status == 400, (shape, text[:200])
        error = json.loads(text)["error"]
        assert error == "failed to parse the request JSON buffer: nesting deeper than 128 levels", shape
    assert "Traceback" not in backend.log()
    assert "recursion" not in backend.log()
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/health/ready", timeout=10) as response:
        assert response.status == 200


def test_a_deep_override_path_is_a_400(backend: Backend):
    key = "file:" + "a/" * 3000 + "model.py"
    status, text = post(backend, "/v2/repository/models/deep/load", _load_body({key: b"x = 1\n"}))
    assert status == 400, text[:300]
    assert "the path is longer than 1024 characters or 32 components" in json.loads(text)["error"]
    assert "Traceback" not in backend.log()


def test_override_caps_are_enforced_before_writing(backend: Backend, tmp_path: Path):
    too_many = {f"file:1/f{i}.txt": b"" for i in range(MAX_OVERRIDE_FILES + 1)}
    status, text = post(backend, "/v2/repository/models/many/load", _load_body(too_many))
    assert status == 400
    assert json.loads(text)["error"] == (f"a load may carry at most {MAX_OVERRIDE_FILES} override files, "
                                         f"got {MAX_OVERRIDE_FILES + 1}")
    too_big = {"file:1/model.py": OVERRIDE_MODEL, "file:1/big.bin": b"\0" * (MAX_OVERRIDE_BYTES + 1)}
    status, text = post(backend, "/v2/repository/models/big/load", _load_body(too_big))
    assert status == 400
    assert f"may hold at most {MAX_OVERRIDE_BYTES} bytes" in json.loads(text)["error"]


def probe_health(url: str, stop: threading.Event, interval: float = 0.005) -> list[float]:
    """Latencies of GET /v2/health/live sent open-loop every `interval` s, measured from when each
    was due (a stalled server delays every probe that falls due meanwhile, not just one)."""
    latencies: list[float] = []
    due = time.monotonic()
    while not stop.is_set():
        with urllib.request.urlopen(f"http://{url}/v2/health/live", timeout=30) as response:
            assert response.status == 200
        done = time.monotonic()
        while due <= done:  # every probe that fell due while this one waited waited as long, less its lateness
            latencies.append(done - due)
            due += interval
        time.sleep(max(0.0, due - time.monotonic()))
    return latencies


def _health_p99_during_load(backend: Backend, files: dict[str, bytes]) -> float:
    body = _load_body(files)
    stop, result = threading.Event(), {}
    prober = threading.Thread(target=lambda: result.update(latencies=probe_health(backend.http_url, stop)))
    prober.start()
    try:
        time.sleep(0.2)
        status, text = post(backend, "/v2/repository/models/from_files/load", body, timeout=120)
        assert status == 200, text
    finally:
        stop.set()
        prober.join(60)
    assert post(backend, "/v2/repository/models/from_files/unload", b"")[0] == 200
    latencies = sorted(result["latencies"])
    p99 = latencies[int(len(latencies) * 0.99)]
    print(f"health during a load of {len(files)} files: {len(latencies)} probes, median "
          f"{statistics.median(latencies) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms")
    return p99


def test_health_answers_during_the_largest_allowed_load(backend: Backend):
    per_file = MAX_OVERRIDE_BYTES // MAX_OVERRIDE_FILES
    files = {f"file:1/data/f{i}.bin": b"\1" * per_file for i in range(MAX_OVERRIDE_FILES - 1)}
    files["file:1/model.py"] = OVERRIDE_MODEL
    # One-file and largest loads alternate, three rounds each, and their medians are compared: the
    # machine's own load then weighs on both alike instead of on whichever ran at a worse moment.
    references, largests = [], []
    for _ in range(3):
        references.append(_health_p99_during_load(backend, {"file:1/model.py": OVERRIDE_MODEL}))
        largests.append(_health_p99_during_load(backend, files))
    reference, largest = statistics.median(references), statistics.median(largests)
    # Measured on 2 cores: quiet, the one-file load's p99 is 5-8 ms and the largest's 14-34 ms (the
    # code before this test's fix: 50 ms and more); while the rest of the suite runs beside it the
    # largest reaches 67 ms. Parsing the upload on the event loop, the regression this guards, gave
    # 574 ms (20-70x the one-file figure). 150 ms, or 4x a one-file figure the machine has already
    # inflated, separates the two.
    assert largest < max(0.150, 4 * reference), (largests, references)
