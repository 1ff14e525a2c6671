"""A stub whose heartbeat stops is a hang only when nothing else shows it alive: one that works in a
C call holding the GIL past the heartbeat timeout is left alone and answers, one asleep with the
GIL held (no heartbeat, no CPU time) is killed and comes back (supervision.hang_judge)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

HEARTBEAT_SECONDS = 3.0


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("busy"), "gil_holder")
    flag = f"--backend-config=python,stub-heartbeat-timeout-seconds={HEARTBEAT_SECONDS:g}"
    with module_backend(Backend(repository, flag)) as server:
        yield server


def _stub(backend: Backend) -> dict:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as response:
        [row] = json.loads(response.read())["stubs"]
    return row


def _hold(backend: Backend, seconds: float) -> float:
    """Ask the model to hold the GIL for `seconds`; returns how long it really did."""
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=300)
    try:
        tensor = httpclient.InferInput("SECONDS", [1], "FP32")
        tensor.set_data_from_numpy(np.array([seconds], np.float32))
        return float(client.infer("gil_holder", [tensor]).as_numpy("GAP")[0])
    finally:
        client.close()


def test_a_stub_working_in_a_c_call_that_holds_the_gil_is_not_killed(backend: Backend):
    before = _stub(backend)
    held = _hold(backend, 8.0)
    assert held > HEARTBEAT_SECONDS * 1.5, f"the GIL was held for {held:.1f} s only: the test proves nothing"
    after = _stub(backend)
    assert (after["pid"], after["restarts"], after["healthy"]) == (before["pid"], before["restarts"], True)
    assert "is not healthy" not in backend.log()


def test_a_stub_asleep_with_the_gil_held_is_killed_and_comes_back(backend: Backend):
    before = _stub(backend)
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match="is not healthy"):
        _hold(backend, -120.0)
    assert time.monotonic() - started < 100, "the sleeping stub was not killed before its sleep ended"
    deadline = time.monotonic() + 60
    while not ((row := _stub(backend))["healthy"] and row["restarts"] == before["restarts"] + 1):
        assert time.monotonic() < deadline, f"timed out waiting for the stub to come back: {row}"
        time.sleep(0.1)
    assert "asleep, using no CPU" in backend.log()
    assert _hold(backend, 0.5) > 0.2
