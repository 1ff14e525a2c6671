"""Model multiplexing through a real backend and real stubs: LRU order and eviction, the
id over HTTP (parameter and header) and gRPC, id validation, dedup of concurrent loads, failed
loads, `__del__` of dropped sub-models, metrics and stubctl, and the cache hit rate of routing
measured against random routing on the same skewed workload.

Test models (tests/models/multiplex*): `multiplex` (sync) answers HIT (1 when the sub-model was
already loaded), SERIAL (which load made it), INSTANCE and EVENTS (the instance's load/unload
log); `multiplex_async` (dynamic batching, async execute serving a batch's requests concurrently,
async load, no unload_multiplexed) answers SERIAL.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import TEST_MODELS, Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

from pystub_backend.backend.stubctl import fetch_stubs, format_table

VARIANTS = {  # name: (source model, config lines replaced)
    "multiplex_one": ("multiplex", {"count: 3": "count: 1"}),
    "multiplex_spread": ("multiplex", {}),
    "multiplex_random": ("multiplex", {'"LOAD_DELAY_MS"': '"MULTIPLEX_ROUTING" value: { string_value: "random" } }\n'
                                                        'parameters { key: "LOAD_DELAY_MS"'}),
}


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("multiplex"), "multiplex", "multiplex_async")
    for name, (source, edits) in VARIANTS.items():
        shutil.copytree(TEST_MODELS / source, repository / name)
        config = (repository / name / "config.pbtxt").read_text()
        for old, new in edits.items():
            assert old in config
            config = config.replace(old, new)
        (repository / name / "config.pbtxt").write_text(config)
    with module_backend(Backend(repository)) as server:
        yield server


def infer(backend: Backend, model: str, model_id: str | None, protocol: str = "http",
          headers: dict[str, str] | None = None, parameters: dict[str, Any] | None = None) -> Any:
    """One inference with INPUT0 = [1, 2]; the result, or the InferenceServerException."""
    module: Any = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(backend.grpc_url if protocol == "grpc" else backend.http_url)
    try:
        shape = [1, 2] if model == "multiplex_async" else [2]  # it batches
        tensor = module.InferInput("INPUT0", shape, "FP32")
        tensor.set_data_from_numpy(np.array([1, 2], np.float32).reshape(shape))
        parameters = dict(parameters or {})
        if model_id is not None:
            parameters["multiplexed_model_id"] = model_id
        return client.infer(model, [tensor], parameters=parameters or None, headers=headers)
    except InferenceServerException as exc:
        return exc
    finally:
        client.close()


def factor_of(model_id: str) -> int:  # what the test models multiply by
    return 1 + sum(model_id.encode()) % 7


def first(result: Any, name: str) -> Any:
    assert not isinstance(result, Exception), result
    value = result.as_numpy(name).reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else int(value)


def stub_rows(backend: Backend, model: str) -> list[dict[str, Any]]:
    return [row for row in fetch_stubs("http://" + backend.http_url) if row["model"] == model]


def metric_values(backend: Backend, name: str, model: str) -> dict[str, float]:
    """Per instance, the value of a multiplexing series of `model` on /metrics."""
    text = urllib.request.urlopen(backend.metrics_url, timeout=10).read().decode()
    pattern = re.compile(rf'^{name}{{instance="([^"]+)",model="{model}",version="1"}} (\S+)$', re.M)
    return {instance: float(value) for instance, value in pattern.findall(text)}


def wait_for_metric(backend: Backend, name: str, model: str, total: float, timeout: float = 10.0) -> None:
    """The stub reports from a thread of its own (hits and waits in batches, at most 0.2 s late), so
    a count may arrive after the response: wait until the sum over the instances is `total`."""
    deadline = time.monotonic() + timeout
    while sum(metric_values(backend, name, model).values()) != total:
        assert time.monotonic() < deadline, (name, metric_values(backend, name, model), total)
        time.sleep(0.05)


# -- the model side --------------------------------------------------------------------------------


def test_lru_order_eviction_before_load_and_unload_calls(backend: Backend) -> None:
    sequence = ["a", "b", "a", "c", "b"]
    results = [infer(backend, "multiplex_one", model_id) for model_id in sequence]
    for model_id, result in zip(sequence, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1, 2], np.float32) * factor_of(model_id))
    assert [first(r, "HIT") for r in results] == [0, 0, 1, 0, 0]
    # `a` was used after `b`, so `c` evicts `b` (the least recently used), then `b` evicts `a`; the
    # LRU entry leaves before the new sub-model loads, so its memory is free first.
    assert json.loads(first(results[-1], "EVENTS")) == [
        "load:a", "load:b", "unload:b", "load:c", "unload:a", "load:b"]
    wait_for_metric(backend, "pystub_multiplexed_model_unloads_total", "multiplex_one", 2)
    (row,) = stub_rows(backend, "multiplex_one")
    assert row["multiplexed_models"] == ["c", "b"]  # least recently used first
    assert "SUB-MODELS" in format_table([row]) and "b,c" in format_table([row])  # most recent first
    assert metric_values(backend, "pystub_multiplexed_models_loaded", "multiplex_one") == {"multiplex_one_0_0": 2}


def test_the_id_travels_as_http_parameter_http_header_and_grpc_parameter(backend: Backend) -> None:
    by_header = infer(backend, "multiplex_one", None, headers={"serve_multiplexed_model_id": "hdr"})
    by_grpc = infer(backend, "multiplex_one", "grpc-id", protocol="grpc")
    by_both = infer(backend, "multiplex_one", "hdr", headers={"serve_multiplexed_model_id": "hdr"})
    for model_id, result in (("hdr", by_header), ("grpc-id", by_grpc), ("hdr", by_both)):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([1, 2], np.float32) * factor_of(model_id))
    assert first(by_both, "HIT") == 1
    conflict = infer(backend, "multiplex_one", "one", headers={"serve_multiplexed_model_id": "two"})
    assert isinstance(conflict, InferenceServerException) and "name different models" in str(conflict)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_invalid_ids_are_refused_before_they_reach_the_model(backend: Backend, protocol: str) -> None:
    too_long = infer(backend, "multiplex_one", "x" * 257, protocol=protocol)
    assert isinstance(too_long, InferenceServerException)
    assert "'multiplexed_model_id' must be at most 256 characters, got 257" in str(too_long)
    empty = infer(backend, "multiplex_one", "", protocol=protocol)
    assert isinstance(empty, InferenceServerException) and "must not be empty" in str(empty)
    number = infer(backend, "multiplex_one", None, protocol=protocol, parameters={"multiplexed_model_id": 7})
    assert isinstance(number, InferenceServerException) and "must be a string, got int" in str(number)
    assert first(infer(backend, "multiplex_one", "x" * 256, protocol=protocol), "SERIAL") > 0
    missing = infer(backend, "multiplex_one", None, protocol=protocol)  # the model's lookup says why
    assert isinstance(missing, InferenceServerException)
    assert "the request has no 'multiplexed_model_id' parameter" in str(missing)


def test_concurrent_loads_of_one_id_are_deduplicated_under_async_execute(backend: Backend) -> None:
    # Six requests for one id, batched into one async execute that serves them concurrently: one
    # load (400 ms), five lookups wait for it, one sub-model.
    with ThreadPoolExecutor(7) as pool:
        same = [pool.submit(infer, backend, "multiplex_async", "dedup") for _ in range(6)]
        time.sleep(0.1)
        other = pool.submit(infer, backend, "multiplex_async", "other")
        results = [future.result(timeout=30) for future in same]
        other_serial = first(other.result(timeout=30), "SERIAL")
    serials = {first(result, "SERIAL") for result in results}
    assert len(serials) == 1 and other_serial not in serials
    for result in results:
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([[1, 2]], np.float32) * factor_of("dedup"))
    wait_for_metric(backend, "pystub_multiplexed_model_loads_total", "multiplex_async", 2)
    wait_for_metric(backend, "pystub_multiplexed_model_waits_total", "multiplex_async", 5)
    load_count = metric_values(backend, "pystub_multiplexed_model_load_duration_seconds_count", "multiplex_async")
    load_sum = metric_values(backend, "pystub_multiplexed_model_load_duration_seconds_sum", "multiplex_async")
    assert load_count == {"multiplex_async_0_0": 2} and load_sum["multiplex_async_0_0"] >= 0.8


def test_a_failed_load_fails_only_its_requests_and_caches_nothing(backend: Backend) -> None:
    with ThreadPoolExecutor(4) as pool:
        bad = [pool.submit(infer, backend, "multiplex_async", "bad-1") for _ in range(3)]
        time.sleep(0.1)
        good = pool.submit(infer, backend, "multiplex_async", "good")
        failures = [future.result(timeout=30) for future in bad]
        assert first(good.result(timeout=30), "SERIAL") > 0
    for failure in failures:
        assert isinstance(failure, InferenceServerException)
        assert "Failed to load multiplexed model 'bad-1': ValueError: no weights for bad-1" in str(failure)
    # Three requests, one (shared) load attempt.
    wait_for_metric(backend, "pystub_multiplexed_model_load_failures_total", "multiplex_async", 1)
    assert isinstance(infer(backend, "multiplex_async", "bad-1"), InferenceServerException)
    # Nothing was cached: the next request tried again.
    wait_for_metric(backend, "pystub_multiplexed_model_load_failures_total", "multiplex_async", 2)
    assert "bad-1" not in stub_rows(backend, "multiplex_async")[0]["multiplexed_models"]


def test_an_evicted_sub_model_without_unload_hook_is_dropped_and_deleted(backend: Backend) -> None:
    for model_id in ("keep-1", "keep-2", "drop-3"):
        assert first(infer(backend, "multiplex_async", model_id), "SERIAL") > 0
    backend.wait_for_log(r"sub-model keep-1 deleted", timeout=10)
    deadline = time.monotonic() + 10
    while stub_rows(backend, "multiplex_async")[0]["multiplexed_models"] != ["keep-2", "drop-3"]:
        assert time.monotonic() < deadline, stub_rows(backend, "multiplex_async")
        time.sleep(0.05)


# -- routing ---------------------------------------------------------------------------------------


def skewed_ids(count: int, seed: int) -> list[str]:
    """`count` draws from 10 ids with Zipf weights 1/rank^0.8: the top id gets 28%, the top three
    56%, the last one 5%."""
    rng = random.Random(seed)
    ids = [f"m{rank}" for rank in range(10)]
    return rng.choices(ids, weights=[1 / (rank + 1) ** 0.8 for rank in range(10)], k=count)


def run_workload(backend: Backend, model: str, ids: list[str], clients: int = 6,
                 parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Send `ids` in order from `clients` concurrent clients; hit rate and per-instance spread."""
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda model_id: infer(backend, model, model_id, parameters=parameters), ids))
    hits = sum(first(result, "HIT") for result in results)
    served: dict[str, int] = {}
    for result in results:
        served[first(result, "INSTANCE")] = served.get(first(result, "INSTANCE"), 0) + 1
    return {"hit_rate": hits / len(ids), "hits": hits, "served": served}


def test_routing_to_holders_doubles_the_hit_rate_of_random_routing(backend: Backend) -> None:
    ids = skewed_ids(800, seed=9)
    routed = run_workload(backend, "multiplex", ids)
    randomly = run_workload(backend, "multiplex_random", ids)
    print(f"\nmultiplexing, 3 instances x cap 2, 10 ids (Zipf s=0.8), 800 requests, 6 clients: hit rate "
          f"routed {routed['hit_rate']:.3f} ({routed['served']}), random {randomly['hit_rate']:.3f} "
          f"({randomly['served']}), ratio {routed['hit_rate'] / max(randomly['hit_rate'], 1e-9):.2f}")
    assert routed["hit_rate"] >= 2 * randomly["hit_rate"], (routed, randomly)
    # Routing does not pile the traffic on one instance: every instance serves a fair share.
    assert len(routed["served"]) == 3 and min(routed["served"].values()) >= len(ids) // 10, routed["served"]
    # The stubs' own counters agree with what the model answered, and the cap holds.
    for model, outcome in (("multiplex", routed), ("multiplex_random", randomly)):
        wait_for_metric(backend, "pystub_multiplexed_model_hits_total", model, outcome["hits"])
        loads = sum(metric_values(backend, "pystub_multiplexed_model_loads_total", model).values())
        assert loads == len(ids) - outcome["hits"]
        assert all(len(row["multiplexed_models"]) <= 2 for row in stub_rows(backend, model))


def test_a_hot_id_spreads_when_waiting_for_its_holder_would_take_longer_than_a_load(backend: Backend) -> None:
    # One id only; each execute takes 30 ms and a load 20 ms: the holder is not free enough, so the
    # other instances load the id as well instead of leaving the traffic to pile up on one.
    outcome = run_workload(backend, "multiplex_spread", ["hot"] * 60, parameters={"exec_ms": 30})
    assert len(outcome["served"]) == 3 and min(outcome["served"].values()) >= 10, outcome["served"]
    wait_for_metric(backend, "pystub_multiplexed_model_loads_total", "multiplex_spread", 3)


def test_a_restarted_stub_starts_empty_and_its_counters_go_on(backend: Backend) -> None:
    # Two distinct ids fill the cache of two whatever earlier tests left there, so the test stands alone.
    for model_id in ("other", "before"):
        assert first(infer(backend, "multiplex_one", model_id), "SERIAL") > 0
    wait_for_metric(backend, "pystub_multiplexed_models_loaded", "multiplex_one", 2)
    loads = sum(metric_values(backend, "pystub_multiplexed_model_loads_total", "multiplex_one").values())
    (row,) = stub_rows(backend, "multiplex_one")
    os.kill(row["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not ((new := stub_rows(backend, "multiplex_one")[0])["healthy"] and new["pid"] != row["pid"]):
        assert time.monotonic() < deadline, new
        time.sleep(0.1)
    assert new["multiplexed_models"] == []
    assert metric_values(backend, "pystub_multiplexed_models_loaded", "multiplex_one") == {"multiplex_one_0_0": 0}
    again = infer(backend, "multiplex_one", "before")  # the new stub's cache was set up too
    assert first(again, "HIT") == 0 and json.loads(first(again, "EVENTS")) == ["load:before"]
    wait_for_metric(backend, "pystub_multiplexed_model_loads_total", "multiplex_one", loads + 1)
