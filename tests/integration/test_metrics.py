"""`GET /metrics` (docs/reference/protocol.md#metrics-endpoint) on a real backend, scraped with a real HTTP client
and parsed with prometheus_client's parser: the exposition format, the machine and per-stub series, custom metrics
from `pb_utils.MetricFamily` (a histogram exactly), their errors, and the rule for custom metrics across a stub
restart (kill -9): the server keeps the values and the new stub continues from them.

`metered_plain` is tests/models/metered without dynamic batching: it counts the requests it
answers (and returns the counter's `value()`), observes every input value in a histogram with
buckets 0.5, 1, 2.5, and sets a gauge to the size of its last batch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests
import tritonclient.http as httpclient
from harness import TEST_MODELS, Backend, make_repository, module_backend
from prometheus_client.parser import text_string_to_metric_families

BUCKETS = [0.5, 1.0, 2.5]
LABELS = {"model": "metered_plain", "version": "1"}
INTERVAL_MS = 200


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(Path(tmp_path_factory.mktemp("metrics")), "metric_misuse")
    plain = repository / "metered_plain"
    shutil.copytree(TEST_MODELS / "metered" / "1", plain / "1")
    config = (TEST_MODELS / "metered" / "config.pbtxt").read_text()
    batching = "dynamic_batching { max_queue_delay_microseconds: 2000000 }"
    assert batching in config
    (plain / "config.pbtxt").write_text(config.replace(batching, ""))
    with module_backend(Backend(repository, f"--metrics-interval-ms={INTERVAL_MS}")) as started:
        yield started


def scrape(backend: Backend) -> requests.Response:
    response = requests.get(backend.metrics_url, timeout=30)
    assert response.status_code == 200
    return response


def families(backend: Backend) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(scrape(backend).text)}


def sample(families_: dict[str, Any], family: str, name: str | None = None, **labels: str) -> float | None:
    """The value of the sample `name` (default: the family's own) with exactly `labels`."""
    for found in families_[family].samples:
        if found.name in ((name,) if name else (family, f"{family}_total")) and found.labels == labels:
            return found.value
    return None


def infer(backend: Backend, values: list[float]) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1, len(values)], "FP32")
        tensor.set_data_from_numpy(np.array([values], dtype=np.float32))
        return client.infer("metered_plain", [tensor])
    finally:
        client.close()


def stub_row(backend: Backend, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as response:
        return next(row for row in json.load(response)["stubs"] if row["model"] == model)


def histogram(families_: dict[str, Any], name: str, **labels: str) -> dict[str, Any]:
    rows = {"buckets": {}, "sum": None, "count": None}
    for found in families_[name].samples:
        if found.name == f"{name}_bucket" and {k: v for k, v in found.labels.items() if k != "le"} == labels:
            rows["buckets"][found.labels["le"]] = found.value
        elif found.labels == labels and found.name in (f"{name}_sum", f"{name}_count"):
            rows[found.name[len(name) + 1:]] = found.value
    return rows


def expected_histogram(values: list[float]) -> dict[str, Any]:
    """What Prometheus' rules make of `values` with BUCKETS: cumulative counts of v <= le."""
    # bounds print as Triton prints them: 1, not 1.0
    buckets = {f"{bound:g}": float(sum(v <= bound for v in values)) for bound in BUCKETS}
    buckets["+Inf"] = float(len(values))
    return {"buckets": buckets, "sum": float(sum(values)), "count": float(len(values))}


# -- the endpoint ------------------------------------------------------------------------------------


def test_the_endpoint_serves_prometheus_text(backend: Backend) -> None:
    response = scrape(backend)
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    text = response.text
    assert text.endswith("\n")
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) == len(set(names))  # each family once, all of its samples together
    parsed = list(text_string_to_metric_families(text))
    assert {f.name for f in parsed} >= {
        "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
        "nv_model_load_duration_secs", "nv_cpu_utilization", "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes", "pystub_stub_up", "pystub_stub_restarts", "pystub_stub_heartbeat_age_seconds",
        "pystub_stub_rss_bytes", "pystub_stub_arena_used_bytes", "pystub_stub_arena_total_bytes",
        "pystub_stub_in_flight"}
    failures = {s.labels["reason"] for s in next(f for f in parsed if f.name == "nv_inference_request_failure").samples
                if s.labels["model"] == "metered_plain"}
    assert failures == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}
    assert requests.get(backend.metrics_url.replace("/metrics", "/other"), timeout=30).status_code == 404
    assert requests.post(backend.metrics_url, timeout=30).status_code == 405


def test_machine_and_stub_series(backend: Backend) -> None:
    time.sleep(3 * INTERVAL_MS / 1000)  # the polled gauges have been sampled
    found = families(backend)
    assert sample(found, "nv_cpu_memory_total_bytes") == psutil.virtual_memory().total
    assert 0 < sample(found, "nv_cpu_memory_used_bytes") <= psutil.virtual_memory().total
    assert 0.0 <= sample(found, "nv_cpu_utilization") <= 1.0
    for model in ("metered_plain", "metric_misuse"):
        row = stub_row(backend, model)
        labels = {"model": model, "version": "1", "instance": row["instance"]}
        assert sample(found, "pystub_stub_up", **labels) == 1
        assert sample(found, "pystub_stub_restarts", **labels) == row["restarts"]
        assert 0 <= sample(found, "pystub_stub_heartbeat_age_seconds", **labels) < 5
        rss = psutil.Process(row["pid"]).memory_info().rss
        assert 0.5 * rss < sample(found, "pystub_stub_rss_bytes", **labels) < 2 * rss
        assert sample(found, "pystub_stub_arena_total_bytes", **labels) == row["arena_total_bytes"]
        assert sample(found, "pystub_stub_arena_used_bytes", **labels) == row["arena_used_bytes"]
        assert sample(found, "pystub_stub_in_flight", **labels) == 0
        assert sample(found, "nv_model_load_duration_secs", model=model, version="1") > 0


# -- custom metrics ----------------------------------------------------------------------------------


def test_a_custom_histogram_counter_and_gauge_are_served_exactly(backend: Backend) -> None:
    before = families(backend)
    old = histogram(before, "metered_input_values", **LABELS)
    served = sample(before, "metered_requests", **LABELS) or 0.0
    values = [0.25, 0.5, 0.75, 1.0, 2.0, 2.5, 4.0, 9.0]
    result = infer(backend, values)
    # Without polling: the changes reach the server before the response does.
    after = families(backend)
    assert after["metered_input_values"].type == "histogram"
    assert after["metered_input_values"].documentation == "Input values seen"
    new = histogram(after, "metered_input_values", **LABELS)
    expected = expected_histogram(values)
    assert {le: new["buckets"][le] - old["buckets"].get(le, 0.0) for le in new["buckets"]} == expected["buckets"]
    assert new["sum"] - (old["sum"] or 0.0) == pytest.approx(expected["sum"])
    assert new["count"] - (old["count"] or 0.0) == expected["count"]
    assert after["metered_requests"].type == "counter"
    assert sample(after, "metered_requests", **LABELS) == served + 1
    assert result.as_numpy("COUNT").tolist() == [[served + 1]]  # value() is the server's value
    assert after["metered_last_batch"].type == "gauge"
    assert sample(after, "metered_last_batch", **LABELS) == 1


def test_the_exposition_is_prometheus_text_to_the_byte(backend: Backend) -> None:
    infer(backend, [0.1])
    lines = scrape(backend).text.splitlines()
    start = lines.index("# HELP metered_input_values Input values seen")
    block = lines[start:start + 8]
    assert block[1] == "# TYPE metered_input_values histogram"
    labels = 'model="metered_plain",version="1"'
    assert [line.split(" ")[0] for line in block[2:]] == [
        f'metered_input_values_bucket{{{labels},le="0.5"}}', f'metered_input_values_bucket{{{labels},le="1"}}',
        f'metered_input_values_bucket{{{labels},le="2.5"}}', f'metered_input_values_bucket{{{labels},le="+Inf"}}',
        f"metered_input_values_sum{{{labels}}}", f"metered_input_values_count{{{labels}}}"]
    counts = [int(line.split(" ")[1]) for line in block[2:6]]
    assert counts == sorted(counts) and counts[-1] == int(block[7].split(" ")[1])  # cumulative, +Inf = count


def test_misuse_raises_the_api_errors(backend: Backend) -> None:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([0], dtype=np.int32))
        errors = [e.decode() for e in client.infer("metric_misuse", [tensor]).as_numpy("ERRORS")]
    finally:
        client.close()
    prefix = "TritonModelException: "
    assert errors == [prefix + text for text in (
        "Error when creating MetricFamily: Family name already exists with different type",  # another model's
        "Error when creating MetricFamily: Metric family name 'nv_inference_count' is reserved for the server's "
        "own metrics",
        "Error when creating MetricFamily: Invalid metric name",
        "Failed to create metric. Labels must be a dictionary.",
        "Failed to create metric. Invalid label name 'bad-label'.",
        "Failed to create metric. Missing required buckets.",
        "Failed to create metric. Unexpected buckets found.",
        "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
        "monotonically by non-negative values.",
        "Failed to observe metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Observe",
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment",
        "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
    )]
    found = families(backend)
    # Its metrics were dropped when execute returned: as in Triton, a family without series is not shown.
    assert "misuse_counter" not in found and "misuse_histogram" not in found
    assert found["metered_requests"].type == "counter"  # the other model's family is untouched


def test_custom_metrics_continue_across_a_stub_restart(backend: Backend) -> None:
    infer(backend, [0.5, 3.0])
    before = families(backend)
    served = sample(before, "metered_requests", **LABELS)
    values_before = histogram(before, "metered_input_values", **LABELS)
    row = stub_row(backend, "metered_plain")
    os.kill(row["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        current = stub_row(backend, "metered_plain")
        if current["healthy"] and current["restarts"] == row["restarts"] + 1:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the stub did not come back: {current}")
    during = families(backend)  # the dead stub's series stay, with their values
    assert sample(during, "metered_requests", **LABELS) == served
    assert histogram(during, "metered_input_values", **LABELS) == values_before
    assert sample(during, "pystub_stub_restarts", instance=current["instance"], **LABELS) == row["restarts"] + 1

    result = infer(backend, [1.5])
    assert result.as_numpy("COUNT").tolist() == [[served + 1]]  # value() continues from the server's value
    after = families(backend)
    assert sample(after, "metered_requests", **LABELS) == served + 1
    values_after = histogram(after, "metered_input_values", **LABELS)
    assert values_after["count"] == values_before["count"] + 1
    assert values_after["buckets"]["2.5"] == values_before["buckets"]["2.5"] + 1
    assert values_after["buckets"]["1"] == values_before["buckets"]["1"]


# -- flags -------------------------------------------------------------------------------------------


def test_cpu_metrics_can_be_turned_off_and_metrics_disabled(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "metric_misuse")
    with Backend(repository, "--allow-cpu-metrics=false", "--allow-gpu-metrics=false") as quiet:
        names = {f.name for f in text_string_to_metric_families(scrape(quiet).text)}
        assert "nv_inference_count" in names and not any(n.startswith("nv_cpu") for n in names)
    with Backend(repository, "--allow-metrics=false") as without:
        assert without.ports["metrics"] == 0
        assert "Metrics Service" not in without.log()


def test_a_bad_metrics_interval_is_a_usage_error(tmp_path: Path) -> None:
    backend = Backend(tmp_path, "--metrics-interval-ms=0", expect_exit=True).start()
    assert backend.wait_exit() == 2
    assert "--metrics-interval-ms: expected a whole number > 0, got '0'" in backend.log()
    backend.stop(check=False)
