"""Where a request's time goes while it waits for a busy instance, Triton vs pystub: a second
request sent during the first one's execute waits for it as queue time on both (Triton keeps it in
its queue; pystub may already have sent it to the stub, whose queue counts as the same), and each
request's compute_infer is its own execute. The durations are timings, so they are compared
within bounds, not for equality; the counts exactly."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from calls import both
from oracle import Endpoint, Pair

PAIR_MODELS = ("sleeper",)
DELAY_MS = 400
MS = 1_000_000  # ns


def _infer(endpoint: Endpoint) -> None:
    client = httpclient.InferenceServerClient(endpoint.http_url, network_timeout=60)
    try:
        delay = httpclient.InferInput("DELAY_MS", [1], "INT32")
        delay.set_data_from_numpy(np.array([DELAY_MS], np.int32))
        client.infer("sleeper", [delay])
    finally:
        client.close()


def _two_overlapping_requests(endpoint: Endpoint) -> dict[str, Any]:
    """The sleeper's statistics after two requests, the second sent 100 ms into the first's execute
    (the counts are the deltas, so that the file's other cases and retries do not matter)."""
    before = _stats(endpoint)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_infer, endpoint)
        time.sleep(0.1)
        second = pool.submit(_infer, endpoint)
        first.result()
        second.result()
    after = _stats(endpoint)
    return {key: {field: int(after[key][field]) - int(before[key][field]) for field in ("count", "ns")}
            for key in ("success", "queue", "compute_input", "compute_infer", "compute_output")}


def _stats(endpoint: Endpoint) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(endpoint.http_url)
    try:
        (row,) = client.get_inference_statistics("sleeper")["model_stats"]
        return row["inference_stats"]
    finally:
        client.close()


def test_a_request_that_waits_for_a_busy_instance_counts_the_wait_as_queue_time(pair: Pair) -> None:
    triton, pystub = both(pair, _two_overlapping_requests)
    counts = {name: {key: value["count"] for key, value in stats.items()} for name, stats in (("triton", triton),
                                                                                            ("pystub", pystub))}
    assert counts["pystub"] == counts["triton"], counts
    for server, stats in (("triton", triton), ("pystub", pystub)):
        infer, queue = stats["compute_infer"]["ns"], stats["queue"]["ns"]
        assert 2 * DELAY_MS * MS <= infer <= 2 * DELAY_MS * MS + 150 * MS, (server, stats)
        assert queue >= 100 * MS, (server, stats)
        parts = sum(stats[key]["ns"] for key in ("queue", "compute_input", "compute_infer", "compute_output"))
        assert stats["success"]["ns"] - 150 * MS <= parts <= stats["success"]["ns"], (server, stats)
