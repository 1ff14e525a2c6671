"""A stub that cannot boot again is not respawned in a loop: its restart fails with the model's
error, the stub exits with a named boot exit code, and the instance is FAILED at once (with a
budget of many restarts left), while the rest of the server keeps serving."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository
from tritonclient.utils import InferenceServerException


def _row(backend: Backend) -> dict:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        rows = {row["instance"]: row for row in json.loads(response.read())["stubs"]}
    return rows["boots_once_0"]


def _call(backend: Backend, mode: int) -> int:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        tensor = grpcclient.InferInput("MODE", [1], "INT32")
        tensor.set_data_from_numpy(np.array([mode], np.int32))
        return int(client.infer("boots_once", [tensor], client_timeout=60).as_numpy("OUTPUT0")[0])
    finally:
        client.close()


def test_a_restart_that_cannot_boot_marks_the_instance_failed_at_once(tmp_path: Path):
    repository = make_repository(tmp_path, "boots_once", "add_sub")
    with Backend(repository, "--backend-config=python,stub-max-restarts=50") as backend:
        assert _call(backend, 7) == 7
        with pytest.raises(InferenceServerException, match="is not healthy"):
            _call(backend, 2)  # the stub exits mid-request: that request fails
        deadline = time.monotonic() + 20
        while _row(backend)["state"] != "FAILED":
            assert time.monotonic() < deadline, f"not FAILED within 20 s: {_row(backend)}"
            time.sleep(0.05)
        row = _row(backend)
        assert "refusing to boot twice" in row["last_error"] and "would fail again" in row["last_error"]
        assert row["restarts"] == 0
        backend.wait_for_log(r"Stub process 'boots_once_0' is FAILED and stays down")
        time.sleep(1.0)  # a respawn loop would show up as more attempts in the log
        log = backend.log()
        # The traceback is inside one log record, its line breaks escaped (backend.log; Triton does the same).
        assert log.count(", in initialize\\n") == 1, "exactly one failed boot: no respawn loop"
        assert log.count("is FAILED and stays down") == 1
        assert _row(backend)["state"] == "FAILED"
        assert not any("boots_once" in " ".join(p.cmdline()) for p in backend.stub_processes())
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            assert not client.is_model_ready("boots_once")
            assert client.is_model_ready("add_sub")
        finally:
            client.close()
