"""A stub whose heartbeat stops is a hang only when nothing else shows it alive: one that works in a
C call holding the GIL past the heartbeat timeout is left alone and answers, one asleep with the
GIL held (no heartbeat, no CPU time) is killed and comes back, and 64 stubs booting and serving
while CPU hogs keep every core busy are none of them killed (supervision.hang_judge)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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


MANY = 64
MANY_CONFIG = f"""
backend: "python"
max_batch_size: 0
input [ {{ name: "SECONDS", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "GAP", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: {MANY}, kind: KIND_CPU }} ]
"""


def _cpu_hogs(seconds: int) -> list[subprocess.Popen]:
    """Busy loops, four per core plus one (load above 8 on 2 cores); each ends by itself after
    `seconds` should the test be killed before it stops them."""
    count = 4 * (os.cpu_count() or 2) + 1
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_64_stubs_booting_and_serving_under_cpu_hogs_are_not_killed(tmp_path: Path):
    repository = make_repository(tmp_path, "gil_holder")
    (repository / "gil_holder" / "config.pbtxt").write_text(MANY_CONFIG)
    hogs = _cpu_hogs(600)
    try:
        backend = Backend(repository, "--allow-grpc=false", "--allow-metrics=false",
                          "--backend-config=python,stub-heartbeat-timeout-seconds=2")
        backend.start(timeout=600)
        try:
            with concurrent.futures.ThreadPoolExecutor(MANY) as pool:
                held = list(pool.map(lambda _: _hold(backend, 0.3), range(2 * MANY)))
            with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=60) as response:
                rows = json.loads(response.read())["stubs"]
        finally:
            backend.stop()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(60)
    assert len(held) == 2 * MANY and len(rows) == MANY
    assert [row["instance"] for row in rows if row["restarts"] or not row["healthy"]] == []
    assert "is not healthy" not in backend.log()
