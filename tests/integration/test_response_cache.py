"""The response cache on a real backend: `response_cache { enable: true }` with `--cache-config`.

Expected values were measured on Triton 2.51 with the same model (`cache_probe`: OUTPUT0 = 2 *
INPUT0, CALLS = how many requests its instance executed, so a cached answer repeats an old CALLS):
the key is model, version and the inputs' names and bytes (request parameters are not in it);
a hit counts as a successful request with `cache_hit`, and as no execution; a miss counts
`cache_miss`; the per-model counters are `nv_cache_{num_hits,hit_duration,num_misses,
miss_duration}_per_model{model,version}`; without a cache configured the model loads and nothing
is cached; a decoupled or sequence-batched model with the cache enabled fails to load.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend

MODEL = "cache_probe"
DECOUPLED_TEXT = ("Response Cache does not currently support model cache_decoupled with 'decoupled' transaction "
                  "policy. Please disable the response cache.")
ENSEMBLE_CONFIG = """platform: "ensemble"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "C", data_type: TYPE_INT64, dims: [ 1 ] } ]
response_cache { enable: true }
ensemble_scheduling { step [ { model_name: "cache_plain" model_version: -1 input_map { key: "INPUT0" value: "X" }
                               output_map [ { key: "OUTPUT0" value: "Y" }, { key: "CALLS" value: "C" } ] } ] }
"""
SEQUENCE_TEXT = ("Response Cache does not currently support model cache_sequence with sequence batching "
                 "scheduler. Please disable the response cache.")


def cache_repository(directory: Path) -> Path:
    """cache_probe, two variants Triton refuses (decoupled, with a sequence batcher), and an ensemble that
    caches over cache_plain, a variant that does not."""
    repository = make_repository(directory, MODEL)
    config = (repository / MODEL / "config.pbtxt").read_text()
    variants = {"cache_decoupled": config + "model_transaction_policy { decoupled: true }\n",
                "cache_sequence": config + "sequence_batching { }\n",
                "cache_plain": config.replace("response_cache { enable: true }", "")}
    for name, text in variants.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(text)
        (repository / name / "1" / "model.py").write_text((repository / MODEL / "1" / "model.py").read_text())
    (repository / "cache_ensemble" / "1").mkdir(parents=True)
    (repository / "cache_ensemble" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    return repository


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = cache_repository(Path(tmp_path_factory.mktemp("cache")))
    with module_backend(Backend(repository, "--cache-config=local,size=1048576", "--exit-on-error=false")) as started:
        yield started


def infer(client: Any, module: Any, values: np.ndarray, **kwargs: Any) -> dict[str, list[Any]]:
    tensor = module.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values.astype(np.float32))
    result = client.infer(MODEL, [tensor], **kwargs)
    return {name: result.as_numpy(name).tolist() for name in ("OUTPUT0", "CALLS")}


def stats(client: httpclient.InferenceServerClient) -> dict[str, Any]:
    return client.get_inference_statistics(MODEL)["model_stats"][0]


def metrics_text(backend: Backend) -> str:
    with urllib.request.urlopen(backend.metrics_url, timeout=30) as response:
        return response.read().decode()


def sample(text: str, name: str, labels: str = f'{{model="{MODEL}",version="1"}}') -> float:
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"no sample {name}{labels} in:\n{text}"
    return float(found.group(1))


def test_identical_requests_are_answered_from_the_cache(backend: Backend, http: Any, grpc: Any) -> None:
    before = stats(http)
    values = np.arange(5, dtype=np.float32) + 1000  # data no other test sends
    first = infer(http, httpclient, values)
    assert first["OUTPUT0"] == (values * 2).tolist()
    # HTTP and gRPC, unary and with request parameters (not part of the key): all hits
    assert infer(http, httpclient, values) == first
    assert infer(grpc, grpcclient, values) == first
    assert infer(http, httpclient, values, parameters={"tag": "other"}) == first
    other = infer(http, httpclient, values + 1)  # other data: a miss, executed
    assert other["CALLS"][0] == first["CALLS"][0] + 1
    after = stats(http)
    inference = after["inference_stats"]
    assert inference["cache_hit"]["count"] - before["inference_stats"]["cache_hit"]["count"] == 3
    assert inference["cache_miss"]["count"] - before["inference_stats"]["cache_miss"]["count"] == 2
    assert inference["success"]["count"] - before["inference_stats"]["success"]["count"] == 5
    assert after["execution_count"] - before["execution_count"] == 2
    assert inference["cache_hit"]["ns"] > 0 and inference["cache_miss"]["ns"] > 0


def test_a_stream_of_a_default_model_is_answered_from_the_cache(backend: Backend, http: Any) -> None:
    values = np.arange(3, dtype=np.float32) + 2000
    first = infer(http, httpclient, values)
    responses: list[Any] = []
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.append(error or result))
        tensor = grpcclient.InferInput("INPUT0", [3], "FP32")
        tensor.set_data_from_numpy(values)
        client.async_stream_infer(MODEL, [tensor])
        client.stop_stream()  # waits for the stream's responses
    finally:
        client.close()
    assert len(responses) == 1 and not isinstance(responses[0], Exception), responses
    assert responses[0].as_numpy("CALLS").tolist() == first["CALLS"]


def test_cache_metrics_have_tritons_names(backend: Backend, http: Any) -> None:
    values = np.arange(2, dtype=np.float32) + 3000
    infer(http, httpclient, values)
    infer(http, httpclient, values)
    text = metrics_text(backend)
    row = stats(http)["inference_stats"]
    assert sample(text, "nv_cache_num_hits_per_model") == row["cache_hit"]["count"]
    assert sample(text, "nv_cache_num_misses_per_model") == row["cache_miss"]["count"]
    assert sample(text, "nv_cache_hit_duration_per_model") == row["cache_hit"]["ns"] // 1000
    assert sample(text, "nv_cache_miss_duration_per_model") == row["cache_miss"]["ns"] // 1000
    for family in ("nv_cache_num_hits_per_model", "nv_cache_hit_duration_per_model"):
        assert f"# TYPE {family} counter" in text
    assert sample(text, "nv_cache_num_entries", "") >= 1
    assert 0 < sample(text, "nv_cache_util", "") < 1
    # Triton's order: after the compute durations, before the pending count
    assert (text.index("nv_inference_compute_output_duration_us{") < text.index("nv_cache_num_hits_per_model{")
            < text.index("nv_inference_pending_request_count{"))


@pytest.mark.parametrize(("model", "text"), [("cache_decoupled", DECOUPLED_TEXT), ("cache_sequence", SEQUENCE_TEXT)])
def test_what_triton_refuses_fails_to_load(backend: Backend, http: Any, model: str, text: str) -> None:
    rows = {row["name"]: row for row in http.get_model_repository_index()}
    assert rows[model]["state"] == "UNAVAILABLE"
    assert rows[model]["reason"] == text
    assert not http.is_model_ready(model)


def test_the_cache_is_a_bounded_lru(tmp_path: Path) -> None:
    # An entry of 256 floats takes 1156 bytes: two fit in 2400, a third evicts the least recent.
    repository = make_repository(tmp_path, MODEL)
    with Backend(repository, "--response-cache-byte-size=2400") as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            a, b, c = (np.full(256, value, np.float32) for value in (1, 2, 3))
            calls = [infer(client, httpclient, x)["CALLS"][0] for x in (a, b, a, c, a, b)]
            # a, b executed; a cached; c executed (evicts b); a cached; b executed again
            assert calls == [1, 2, 1, 3, 1, 4]
            text = metrics_text(backend)
            assert sample(text, "nv_cache_num_evictions", "") == 2  # b, then a or c for b's return
            assert sample(text, "nv_cache_num_entries", "") == 2
            # larger than the whole cache: executed every time, never stored
            big = np.ones(1024, np.float32)
            assert [infer(client, httpclient, big)["CALLS"][0] for _ in range(2)] == [5, 6]
        finally:
            client.close()


def test_without_a_cache_configured_the_model_loads_and_nothing_is_cached(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, MODEL)
    with Backend(repository) as backend:
        client = httpclient.InferenceServerClient(backend.http_url)
        try:
            values = np.arange(4, dtype=np.float32)
            assert [infer(client, httpclient, values)["CALLS"][0] for _ in range(3)] == [1, 2, 3]
            row = stats(client)["inference_stats"]
            assert row["cache_hit"]["count"] == 0 and row["cache_miss"]["count"] == 0
        finally:
            client.close()
        text = metrics_text(backend)
        assert sample(text, "nv_cache_num_hits_per_model") == 0  # printed, as Triton does, at zero
        assert "nv_cache_util" not in text


def test_top_level_ensemble_requests_are_cached(backend: Backend, http: Any) -> None:
    # As on Triton 2.51: the ensemble's response is cached; its composing model ran once.
    def calls() -> int:
        tensor = httpclient.InferInput("X", [3], "FP32")
        tensor.set_data_from_numpy(np.arange(3, dtype=np.float32) + 4000)
        return int(http.infer("cache_ensemble", [tensor]).as_numpy("C")[0])

    assert [calls() for _ in range(3)] == [1, 1, 1]
    row = http.get_inference_statistics("cache_ensemble")["model_stats"][0]
    assert (row["inference_stats"]["cache_hit"]["count"], row["inference_stats"]["cache_miss"]["count"]) == (2, 1)
    assert row["inference_stats"]["success"]["count"] == 3
    plain = http.get_inference_statistics("cache_plain")["model_stats"][0]
    assert plain["inference_stats"]["success"]["count"] == 1
    assert sample(metrics_text(backend), "nv_cache_num_hits_per_model", '{model="cache_ensemble",version="1"}') == 2
