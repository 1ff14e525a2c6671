"""The statistics extension (docs/reference/protocol.md#statistics-extension) and the nv_* counters of `/metrics`
(14), checked against a scripted sequence of requests on a real backend: a dynamic batch, per-request model errors,
a model that raises, validation failures, a cancellation while queued and one while executing. Every count must come
out exactly, the same over HTTP and gRPC, per version and for all models, and `/metrics` must say the same.

Models: `metered` (dynamic batching, up to 8 rows, 2 s queue delay; a negative value fails its
request), `raiser` (-1 raises in execute, 1 gets an error response) and `wait_cancel` (answers
CANCELLED once its request is cancelled).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(Path(tmp_path_factory.mktemp("statistics")), "metered", "raiser", "wait_cancel")
    with module_backend(Backend(repository)) as started:
        yield started


# -- clients -----------------------------------------------------------------------------------------


def http_stats(backend: Backend, model: str = "", version: str = "") -> list[dict[str, Any]]:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        return client.get_inference_statistics(model, version)["model_stats"]
    finally:
        client.close()


def grpc_stats(backend: Backend, model: str = "", version: str = "") -> list[dict[str, Any]]:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        return client.get_inference_statistics(model, version, as_json=True)["model_stats"]
    finally:
        client.close()


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flatten(item, f"{path}.{key}").items()}
    if isinstance(value, list):
        return {k: v for index, item in enumerate(value) for k, v in flatten(item, f"{path}[{index}]").items()}
    return {path: value}


def assert_same_over_grpc(http_row: dict[str, Any], grpc_row: dict[str, Any]) -> None:
    """Field for field; protobuf JSON writes uint64 as strings and leaves zeros out."""
    http_flat, grpc_flat = flatten(http_row), flatten(grpc_row)
    assert set(grpc_flat) <= set(http_flat), set(grpc_flat) - set(http_flat)
    for path, value in http_flat.items():
        other = grpc_flat.get(path, type(value)())
        assert type(value)(other) == value, (path, value, other)


def metrics(backend: Backend) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """`/metrics` as {(sample name, sorted labels): value}, parsed by prometheus_client (whose
    parser calls a counter's samples `<family>_total`; they are keyed by the name served)."""
    with urllib.request.urlopen(backend.metrics_url, timeout=30) as response:
        text = response.read().decode()
    return {(family.name if sample.name == f"{family.name}_total" else sample.name,
             tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def metered_input(client_module: Any, values: np.ndarray) -> list[Any]:
    tensor = client_module.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values.astype(np.float32))
    return [tensor]


def int_input(client_module: Any, value: int) -> list[Any]:
    tensor = client_module.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [tensor]


def http_call(backend: Backend, model: str, inputs: Callable[[Any], list[Any]]) -> Any:
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=60)
    try:
        return client.infer(model, inputs(httpclient))
    except InferenceServerException as exc:
        return exc
    finally:
        client.close()


def grpc_call(backend: Backend, model: str, inputs: Callable[[Any], list[Any]], timeout: float | None = None) -> Any:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        return client.infer(model, inputs(grpcclient), client_timeout=timeout)
    except InferenceServerException as exc:
        return exc
    finally:
        client.close()


def settled(read: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool],
            timeout: float = 15.0) -> dict[str, Any]:
    """`read()` once `done` holds for it (statistics of cancelled requests land asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


# -- the script ----------------------------------------------------------------------------------


def run_metered_script(backend: Backend) -> None:
    """One dynamic batch of 4 requests x 2 rows (one of them failing in the model), two
    validation failures, one request cancelled while it waits in the queue."""
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    calls = [lambda: http_call(backend, "metered", lambda m: metered_input(m, rows)),
             lambda: http_call(backend, "metered", lambda m: metered_input(m, rows + 1)),
             lambda: grpc_call(backend, "metered", lambda m: metered_input(m, rows + 2)),
             lambda: http_call(backend, "metered", lambda m: metered_input(m, -rows - 1))]
    with ThreadPoolExecutor(len(calls)) as pool:
        results = [f.result() for f in [pool.submit(call) for call in calls]]
    assert [isinstance(r, InferenceServerException) for r in results] == [False, False, False, True]
    assert "negative input" in str(results[3])
    assert all(r.as_numpy("COUNT").shape == (2, 1) for r in results[:3])

    wrong_type = http_call(backend, "metered", lambda m: [_int_rows(m)])
    assert "data-type is 'INT32', but model 'metered' expects 'FP32'" in str(wrong_type)
    wrong_shape = grpc_call(backend, "metered", lambda m: metered_input(m, np.ones(3)))
    assert "unexpected shape for input 'INPUT0'" in str(wrong_shape)

    # The queue delay is 2 s: the client's 0.7 s deadline cancels the request while it waits.
    cancelled = grpc_call(backend, "metered", lambda m: metered_input(m, rows), timeout=0.7)
    assert "Deadline Exceeded" in str(cancelled)


def _int_rows(module: Any) -> Any:
    tensor = module.InferInput("INPUT0", [1, 3], "INT32")
    tensor.set_data_from_numpy(np.ones((1, 3), dtype=np.int32))
    return tensor


def run_raiser_script(backend: Backend) -> None:
    assert "boom: negative input -1" in str(http_call(backend, "raiser", lambda m: int_input(m, -1)))
    assert "this request alone fails" in str(grpc_call(backend, "raiser", lambda m: int_input(m, 1)))
    assert http_call(backend, "raiser", lambda m: int_input(m, 5)).as_numpy("OUTPUT0").tolist() == [5]


def run_cancel_script(backend: Backend) -> None:
    """A cancel while the (decoupled) model holds the request: the client cancels its gRPC
    stream, the model sees `is_cancelled()` and answers CANCELLED."""
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        client.start_stream(lambda result, error: None)
        client.async_stream_infer("wait_cancel", int_input(grpcclient, 3))
        backend.wait_for_log("wait_cancel: waiting for a cancellation")
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()


# -- expectations ----------------------------------------------------------------------------------


def expected_counts(execution: int, inference: int, success: int, failures: dict[str, int],
                    batches: dict[int, int]) -> dict[str, Any]:
    return {"execution_count": execution, "inference_count": inference, "success": success,
            "fail": sum(failures.values()), "failures": failures, "batches": batches}


def observed_counts(row: dict[str, Any], failures: dict[str, int]) -> dict[str, Any]:
    stats = row["inference_stats"]
    return {"execution_count": row["execution_count"], "inference_count": row["inference_count"],
            "success": stats["success"]["count"], "fail": stats["fail"]["count"], "failures": failures,
            "batches": {b["batch_size"]: b["compute_infer"]["count"] for b in row["batch_stats"]}}


def failure_counters(samples: dict[Any, float], model: str) -> dict[str, int]:
    return {reason: int(samples[("nv_inference_request_failure",
                                 (("model", model), ("reason", reason), ("version", "1")))])
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}


EXPECTED = {
    # one execution of 4 requests x 2 rows; 3 succeed, 1 fails in the model; 2 validation
    # failures and 1 cancellation never execute
    "metered": expected_counts(1, 8, 3, {"REJECTED": 2, "CANCELED": 1, "BACKEND": 1, "OTHER": 0}, {8: 1}),
    # three executions of one request: execute raised (no inference), an error response, a success
    "raiser": expected_counts(3, 2, 1, {"REJECTED": 0, "CANCELED": 0, "BACKEND": 2, "OTHER": 0}, {1: 3}),
    # one execution, answered CANCELLED after the client cancelled
    "wait_cancel": expected_counts(1, 1, 0, {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}, {1: 1}),
}


def test_a_scripted_sequence_gives_exact_statistics_and_metrics(backend: Backend) -> None:
    started_ms = int(time.time() * 1000)
    assert all(row["execution_count"] == 0 and row["last_inference"] == 0 for row in http_stats(backend))
    run_metered_script(backend)
    run_raiser_script(backend)
    run_cancel_script(backend)
    total_fails = sum(sum(e["failures"].values()) for e in EXPECTED.values())
    settled(lambda: {"rows": http_stats(backend)},
            lambda v: sum(r["inference_stats"]["fail"]["count"] for r in v["rows"]) >= total_fails)

    http_rows = {row["name"]: row for row in http_stats(backend)}
    grpc_rows = {row["name"]: row for row in grpc_stats(backend)}
    samples = metrics(backend)
    assert sorted(http_rows) == sorted(grpc_rows) == sorted(EXPECTED)
    for model, expected in EXPECTED.items():
        row = http_rows[model]
        failures = failure_counters(samples, model)
        assert observed_counts(row, failures) == expected, model
        assert_same_over_grpc(row, grpc_rows[model])
        stats = row["inference_stats"]
        for key in ("queue", "compute_input", "compute_infer", "compute_output"):
            assert stats[key]["count"] == expected["success"], (model, key)
        if expected["success"]:
            assert 0 < stats["queue"]["ns"] <= stats["success"]["ns"], model
            assert 0 < stats["compute_infer"]["ns"] <= stats["success"]["ns"], model
        assert stats["fail"]["count"] == sum(failures.values())
        assert started_ms <= row["last_inference"] <= int(time.time() * 1000), model
        check_metrics_match(samples, model, row)


def check_metrics_match(samples: dict[Any, float], model: str, row: dict[str, Any]) -> None:
    labels = (("model", model), ("version", "1"))
    stats = row["inference_stats"]
    assert samples[("nv_inference_request_success", labels)] == stats["success"]["count"]
    assert samples[("nv_inference_count", labels)] == row["inference_count"]
    assert samples[("nv_inference_exec_count", labels)] == row["execution_count"]
    assert samples[("nv_inference_pending_request_count", labels)] == 0
    for metric, key in (("request", "success"), ("queue", "queue"), ("compute_input", "compute_input"),
                        ("compute_infer", "compute_infer"), ("compute_output", "compute_output")):
        assert samples[(f"nv_inference_{metric}_duration_us", labels)] == stats[key]["ns"] // 1000, metric
    assert samples[("nv_model_load_duration_secs", labels)] > 0


def test_statistics_per_version_and_for_all_models(backend: Backend) -> None:
    # One inference of its own, so the test holds alone too: gRPC's JSON leaves a zero count out.
    assert not isinstance(http_call(backend, "metered", lambda m: metered_input(m, np.ones((1, 2), np.float32))),
                          InferenceServerException)
    for read in (http_stats, grpc_stats):
        everything = {row["name"]: row for row in read(backend)}
        assert sorted(everything) == ["metered", "raiser", "wait_cancel"]
        assert int(everything["metered"]["inference_count"]) >= 1
        for model in everything:
            (by_model,) = read(backend, model)
            (by_version,) = read(backend, model, "1")
            assert by_model["version"] == by_version["version"] == "1"
            counts = [int(row.get("inference_count", 0)) for row in (by_model, by_version, everything[model])]
            assert counts[0] == counts[1] == counts[2]
    # Triton's texts (400 / INVALID_ARGUMENT)
    with pytest.raises(InferenceServerException, match="requested model 'nope' is not available"):
        http_stats(backend, "nope")
    with pytest.raises(InferenceServerException, match="requested model version is not available for model 'metered'"):
        grpc_stats(backend, "metered", "7")


def test_pending_requests_are_counted_while_they_wait(backend: Backend) -> None:
    """A lone request waits the 2 s queue delay: meanwhile the gauge shows it, then it runs."""
    labels = (("model", "metered"), ("version", "1"))
    rows = np.ones((1, 2), dtype=np.float32)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(http_call, backend, "metered", lambda m: metered_input(m, rows))
        seen = settled(lambda: {"pending": metrics(backend)[("nv_inference_pending_request_count", labels)]},
                       lambda v: v["pending"] == 1, timeout=1.5)
        assert seen["pending"] == 1
        assert not isinstance(answer.result(), InferenceServerException)
    assert metrics(backend)[("nv_inference_pending_request_count", labels)] == 0


def test_inferences_count_what_the_model_answered_and_executions_every_execute(tmp_path: Path) -> None:
    """Triton 2.51's counting: a model that raises for 3 of 10 requests has made 7 inferences in
    10 executions; an error response it returns is an inference (checked against Triton)."""
    repository = make_repository(tmp_path, "raiser")
    with Backend(repository) as backend:
        for value in [5] * 7 + [-1] * 3:
            http_call(backend, "raiser", lambda m, value=value: int_input(m, value))
        labels = (("model", "raiser"), ("version", "1"))
        samples = metrics(backend)
        assert (samples[("nv_inference_count", labels)], samples[("nv_inference_exec_count", labels)]) == (7, 10)
        (row,) = http_stats(backend, "raiser")
        assert (row["inference_count"], row["execution_count"]) == (7, 10)
        assert "this request alone fails" in str(http_call(backend, "raiser", lambda m: int_input(m, 1)))
        samples = metrics(backend)
        assert (samples[("nv_inference_count", labels)], samples[("nv_inference_exec_count", labels)]) == (8, 11)
