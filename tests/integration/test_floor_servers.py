"""tools/floor, the request path's pure-Python floor, answers real clients correctly.

The floor is started as the bench starts it (tools/floor/serve.py in its own session: a parent
and its model process) and asked by tritonclient, over HTTP (binary tensors) and gRPC, for what
perf_analyzer and the bench ask: metadata, config, inferences whose output must be the input's
bytes, statistics that count them. Bad requests get an error and the floor goes on; a dead model
process fails the requests after it, not the server; SIGTERM stops both processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import ROOT
from net import free_ports, wait_http_ready
from tritonclient.utils import InferenceServerException

SERVE = ROOT / "tools" / "floor" / "serve.py"
_START_TIMEOUT = 60.0  # s; for the floor to answer readiness
_STOP_TIMEOUT = 30.0  # s; for both processes to exit after SIGTERM
MODEL = "identity_fp32"


@dataclass
class Floor:
    process: subprocess.Popen
    http_port: int
    grpc_port: int

    def model_process(self) -> psutil.Process:
        children = psutil.Process(self.process.pid).children()
        assert len(children) == 1, children
        return children[0]

    def statistics(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/models/{MODEL}/stats", timeout=10) as r:
            return json.load(r)["model_stats"][0]["inference_stats"]


@pytest.fixture
def floor() -> Iterator[Floor]:
    http_port, grpc_port = free_ports(2)
    process = subprocess.Popen([sys.executable, str(SERVE), str(http_port), str(grpc_port)],
                               stdin=subprocess.DEVNULL, start_new_session=True)
    server = Floor(process, http_port, grpc_port)
    try:
        wait_http_ready(process, http_port, "the floor", _START_TIMEOUT)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=_STOP_TIMEOUT)
        _wait_group_gone(process.pid)


def _wait_group_gone(pgid: int) -> None:
    deadline = time.monotonic() + _STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process group {pgid} (the floor and its model process) still alive")


def _tensors(module, shape: list[int], seed: int) -> tuple[object, np.ndarray]:  # noqa: ANN001 - either client
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    tensor = module.InferInput("INPUT0", shape, "FP32")
    tensor.set_data_from_numpy(data)
    return tensor, data


def test_http_binary_inference_returns_the_input_bytes(floor: Floor) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{floor.http_port}")
    try:
        assert client.get_model_metadata(MODEL)["name"] == MODEL
        assert client.get_model_config(MODEL)["max_batch_size"] == 8
        for seed, shape in enumerate(([1, 4], [2, 3], [1, 4096])):
            tensor, data = _tensors(httpclient, shape, seed)
            outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
            result = client.infer(MODEL, [tensor], outputs=outputs, request_id=f"r{seed}")
            got = result.as_numpy("OUTPUT0")
            assert got.shape == data.shape and got.tobytes() == data.tobytes()
            assert result.get_response()["id"] == f"r{seed}"
    finally:
        client.close()
    assert floor.statistics()["success"]["count"] == 3


def test_grpc_inference_returns_the_input_bytes(floor: Floor) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{floor.grpc_port}")
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
        assert client.get_model_metadata(MODEL).name == MODEL
        assert client.get_model_config(MODEL).config.max_batch_size == 8
        for seed, shape in enumerate(([1, 4], [3, 5])):
            tensor, data = _tensors(grpcclient, shape, seed)
            result = client.infer(MODEL, [tensor], request_id=f"g{seed}")
            got = result.as_numpy("OUTPUT0")
            assert got.shape == data.shape and got.tobytes() == data.tobytes()
            assert result.get_response().id == f"g{seed}"
    finally:
        client.close()
    counts = floor.statistics()
    assert (counts["success"]["count"], counts["fail"]["count"]) == (2, 0)


def test_bad_requests_get_errors_and_the_floor_goes_on(floor: Floor) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{floor.http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{floor.grpc_port}")
    try:
        too_large, _ = _tensors(httpclient, [1, 20000], 1)  # 80,000 B: over the floor's 64 KiB
        with pytest.raises(InferenceServerException, match="up to 65536 bytes"):
            http.infer(MODEL, [too_large])
        json_tensor, _ = _tensors(httpclient, [1, 4], 2)
        json_tensor.set_data_from_numpy(np.zeros((1, 4), np.float32), binary_data=False)
        with pytest.raises(InferenceServerException, match="binary tensors only"):
            http.infer(MODEL, [json_tensor])
        tensor, _ = _tensors(grpcclient, [1, 4], 3)
        with pytest.raises(InferenceServerException, match="serves identity_fp32 only") as refused:
            grpc.infer("another_model", [tensor])
        assert refused.value.status() == "StatusCode.NOT_FOUND"
        tensor, data = _tensors(grpcclient, [1, 4], 4)
        assert grpc.infer(MODEL, [tensor]).as_numpy("OUTPUT0").tobytes() == data.tobytes()
    finally:
        http.close()
        grpc.close()
    assert floor.statistics()["fail"]["count"] == 2  # the two the model link refused


def test_a_dead_model_process_fails_the_requests_not_the_server(floor: Floor) -> None:
    floor.model_process().kill()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{floor.grpc_port}")
    try:
        tensor, _ = _tensors(grpcclient, [1, 4], 5)
        deadline = time.monotonic() + 30
        while True:  # the parent learns of the death when the socket's end is read
            with pytest.raises(InferenceServerException) as failed:
                client.infer(MODEL, [tensor], client_timeout=10)
            if "model process exited" in str(failed.value) or time.monotonic() > deadline:
                break
        assert "model process exited" in str(failed.value)
        assert client.is_server_live()
    finally:
        client.close()


def test_sigterm_stops_the_parent_and_its_model_process(floor: Floor) -> None:
    model = floor.model_process()
    floor.process.send_signal(signal.SIGTERM)
    assert floor.process.wait(timeout=_STOP_TIMEOUT) == 0
    model.wait(timeout=_STOP_TIMEOUT)  # raises psutil.TimeoutExpired if it outlived its parent
