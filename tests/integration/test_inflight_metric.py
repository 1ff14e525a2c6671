"""`pystub_inflight_requests`: requests queued in pystub plus requests
executing in its stubs, per model version; what the Helm chart's autoscaler scales on."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import requests
import tritonclient.http as httpclient
from harness import Backend, make_repository
from prometheus_client.parser import text_string_to_metric_families


def _inflight(backend: Backend) -> dict[str, float]:
    with requests.get(backend.metrics_url, timeout=30) as response:
        text = response.text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "pystub_inflight_requests")
    assert family.type == "gauge"
    return {sample.labels["model"]: sample.value for sample in family.samples}


def _slow_call(backend: Backend, delay_ms: int) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
        tensor.set_data_from_numpy(np.array([delay_ms], dtype=np.int32))
        client.infer("slow", [tensor], timeout=60)
    finally:
        client.close()


def test_inflight_counts_queued_and_executing_requests(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "slow", "add_sub")
    with Backend(repository) as backend:
        assert _inflight(backend) == {"slow": 0, "add_sub": 0}
        callers = [threading.Thread(target=_slow_call, args=(backend, 1500)) for _ in range(4)]
        for caller in callers:
            caller.start()
        try:
            deadline = time.monotonic() + 10
            seen = _inflight(backend)
            while seen["slow"] < 4 and time.monotonic() < deadline:  # the calls reach the server one by one
                time.sleep(0.05)
                seen = _inflight(backend)
            assert seen == {"slow": 4, "add_sub": 0}  # one instance: 1 executing + 3 queued
        finally:
            for caller in callers:
                caller.join(60)
        assert _inflight(backend) == {"slow": 0, "add_sub": 0}
