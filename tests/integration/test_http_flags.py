"""HTTP flags with a real backend and the real tritonclient: restricted API groups,
`--http-max-input-size` counting the JSON part only, SO_REUSEPORT, and no-op flags logged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from harness import Backend, assert_busy_port_refused, make_repository
from tritonclient.utils import InferenceServerException

KIB = 1024


def _identity_input(values: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=binary)
    return [tensor]


def test_max_input_size_limits_the_json_part_only(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "identity_fp32")
    with Backend(repository, f"--http-max-input-size={64 * KIB}") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            big = np.arange(8 * 64 * KIB, dtype=np.float32).reshape(8, -1)  # 2 MiB of binary data
            result = client.infer("identity_fp32", _identity_input(big, binary=True))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), big)
            small_json = np.arange(64, dtype=np.float32).reshape(1, -1)
            result = client.infer("identity_fp32", _identity_input(small_json, binary=False))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), small_json)
            big_json = np.arange(32 * KIB, dtype=np.float32).reshape(1, -1)  # > 64 KiB as JSON text
            with pytest.raises(InferenceServerException) as info:
                client.infer("identity_fp32", _identity_input(big_json, binary=False))
            assert info.value.status() == "400"
            assert "exceeds the maximum input size of 65536 bytes" in info.value.message()
        finally:
            client.close()
        # A declared JSON part above the limit is refused from the header alone.
        header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 4}}]}).encode()
        body = header + b" " * (70 * KIB) + b"\0\0\0\0"
        reply = requests.post(f"http://{backend.http_url}/v2/models/identity_fp32/infer", data=body, timeout=30,
                              headers={"Inference-Header-Content-Length": str(len(body) - 4)})
        assert reply.status_code == 400 and "JSON part exceeds the maximum input size" in reply.json()["error"]


def test_restricted_api_groups(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--http-restricted-api=model-repository,statistics:Admin-Key=s3cret") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            assert client.is_server_ready() and client.get_model_metadata("add_sub")["name"] == "add_sub"
            for call in (lambda **kw: client.get_model_repository_index(**kw),
                         lambda **kw: client.get_inference_statistics("add_sub", **kw)):
                with pytest.raises(InferenceServerException) as info:
                    call()
                assert info.value.status() == "403"
                assert info.value.message() == "This API is restricted, expecting header 'admin-key'"
                with pytest.raises(InferenceServerException):
                    call(headers={"admin-key": "nope"})
                assert call(headers={"Admin-Key": "s3cret"}) is not None
        finally:
            client.close()
        admin = requests.get(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30)  # pystub's admin endpoint
        assert admin.status_code == 403
        admin = requests.get(f"http://{backend.http_url}/v2/pystub/stubs", headers={"admin-key": "s3cret"}, timeout=30)
        assert admin.status_code == 200 and admin.json()["stubs"]


def test_reuse_http_port(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--reuse-http-port=true") as first:
        second = Backend(repository, "--reuse-http-port=true")
        second.args += ["--http-port", str(first.ports["http"])]
        with second:
            assert second.ports["http"] == first.ports["http"]
            assert requests.get(f"http://{second.http_url}/v2/health/ready", timeout=30).status_code == 200
        assert_busy_port_refused(repository, "http", first.ports["http"])


def test_log_format_and_id(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--log-format=ISO8601", "--id=edge-7", "--trace-rate=10") as backend:
        metadata = requests.get(f"http://{backend.http_url}/v2", timeout=30).json()
        log = backend.log()
    assert metadata["name"] == "edge-7"
    started = next(line for line in log.splitlines() if "Started HTTPService" in line)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ server\.py:\d+\] Started HTTPService", started), started
    assert ("'--trace-rate' has been deprecated and will be removed in future releases. Please use "
            "'--trace-config rate=<rate value>' instead") in log
