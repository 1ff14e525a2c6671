"""`--metrics-config` with a real backend: Triton 2.51's latency summaries (names, help, labels and
quantiles as Triton prints them), `counter_latencies=false` and pystub's `histogram_latencies=true`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import requests
import tritonclient.http as httpclient
from harness import Backend, make_repository
from prometheus_client.parser import text_string_to_metric_families

SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us")
HISTOGRAMS = tuple(name.replace("_summary_us", "_histogram_us") for name in SUMMARIES)


def _infer(backend: Backend, count: int) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        for _ in range(count):
            inputs = []
            for name in ("INPUT0", "INPUT1"):
                tensor = httpclient.InferInput(name, [4], "FP32")
                tensor.set_data_from_numpy(np.ones(4, np.float32))
                inputs.append(tensor)
            client.infer("add_sub", inputs)
    finally:
        client.close()


def _scrape(backend: Backend) -> str:
    return requests.get(backend.metrics_url, timeout=30).text


def test_summary_latencies(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--metrics-config=summary_latencies=true",
                 "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01,0.99:0.001") as backend:
        empty = _scrape(backend)
        assert 'nv_inference_request_summary_us{model="add_sub",version="1",quantile="0.5"} NaN' in empty
        _infer(backend, 12)
        text = _scrape(backend)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name in SUMMARIES:
        assert families[name].type == "summary", name
        samples = {(s.name, s.labels.get("quantile")): s.value for s in families[name].samples}
        assert samples[(f"{name}_count", None)] == 12
        quantiles = [samples[(name, q)] for q in ("0.5", "0.9", "0.99")]
        assert quantiles == sorted(quantiles) and quantiles[0] >= 0
    request_sum = next(s.value for s in families["nv_inference_request_summary_us"].samples if s.name.endswith("_sum"))
    counter = next(s.value for s in families["nv_inference_request_duration_us"].samples)
    assert abs(request_sum - counter) <= 12  # the same requests, rounded to microseconds each
    assert "# HELP nv_inference_request_summary_us Summary of inference request duration in microseconds " \
           "(includes cached requests)" in text


def test_counter_latencies_off_and_histograms_on(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--metrics-config=counter_latencies=false",
                 "--metrics-config=histogram_latencies=true") as backend:
        _infer(backend, 3)
        text = _scrape(backend)
        log = backend.log()
    assert "nv_inference_request_success{" in text
    assert "nv_inference_request_duration_us" not in text and "_summary_us" not in text
    assert "histogram_latencies is accepted and has no effect" not in log  # it has one now (pystub)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name in HISTOGRAMS:
        assert families[name].type == "histogram", name
        buckets = [(float(s.labels["le"]), s.value) for s in families[name].samples if s.name.endswith("_bucket")]
        assert [bound for bound, _ in buckets][:3] == [100.0, 250.0, 500.0] and buckets[-1][0] == float("inf")
        counts = [count for _, count in buckets]
        assert counts == sorted(counts) and counts[-1] == 3, buckets  # cumulative, +Inf holds every request
        total = {s.name: s.value for s in families[name].samples}
        assert total[f"{name}_count"] == 3 and total[f"{name}_sum"] >= 0
    request = {s.name: s.value for s in families["nv_inference_request_histogram_us"].samples}
    assert request["nv_inference_request_histogram_us_sum"] > 0  # three real requests took time


def test_histograms_beside_the_counters_by_default(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "add_sub")
    with Backend(repository, "--metrics-config=histogram_latencies=true") as backend:
        _infer(backend, 2)
        text = _scrape(backend)
    families = {family.name: family for family in text_string_to_metric_families(text)}  # parses: no clash
    assert families["nv_inference_request_duration_us"].type == "counter"
    count = next(s.value for s in families["nv_inference_request_histogram_us"].samples if s.name.endswith("_count"))
    assert count == 2
