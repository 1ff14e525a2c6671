"""Ensembles: `platform: "ensemble"` models run as data-flow graphs of other models.

ens_diamond: four steps (two in parallel, one join): A1 = X + 1, Y = (X + 2) * (X + 1).
ens_stream_pipeline: a decoupled step (ens_stream) whose every response goes on through bls_leaf.
"""

from __future__ import annotations

import json
import queue
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

X = np.arange(4, dtype=np.float32)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("ensemble"), "bls_driver", "bls_leaf", "ens_mul",
                                 "ens_stream", "ens_diamond", "ens_stream_pipeline")
    with module_backend(Backend(repository)) as server:
        yield server


def http_client(backend: Backend) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(backend.http_url, network_timeout=120)


def diamond(backend: Backend, x: np.ndarray, outputs: list[str] | None = None) -> httpclient.InferResult:
    client = http_client(backend)
    try:
        tensor = httpclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        requested = [httpclient.InferRequestedOutput(name) for name in outputs] if outputs else None
        return client.infer("ens_diamond", [tensor], outputs=requested)
    finally:
        client.close()


def pipeline_inputs(count: int, delay_ms: int = 0) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("X", [4], "FP32"), grpcclient.InferInput("COUNT", [1], "INT32"),
              grpcclient.InferInput("DELAY_MS", [1], "INT32")]
    inputs[0].set_data_from_numpy(X)
    inputs[1].set_data_from_numpy(np.array([count], np.int32))
    inputs[2].set_data_from_numpy(np.array([delay_ms], np.int32))
    return inputs


def stub_rows(backend: Backend) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        return {row["instance"]: row for row in json.loads(response.read())["stubs"]}


def stats(backend: Backend, model: str) -> dict[str, Any]:
    client = http_client(backend)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def test_a_graph_with_parallel_steps_and_a_join(backend: Backend):
    result = diamond(backend, X)
    np.testing.assert_array_equal(result.as_numpy("Y"), (X + 2) * (X + 1))
    np.testing.assert_array_equal(result.as_numpy("A1"), X + 1)
    assert result.get_response()["model_name"] == "ens_diamond"
    only_y = diamond(backend, X, outputs=["Y"])
    assert [o["name"] for o in only_y.get_response()["outputs"]] == ["Y"]


def test_grpc_and_large_tensors(backend: Backend):
    x = np.random.default_rng(3).random(1_500_000, dtype=np.float32)  # 6 MB through four steps
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        tensor = grpcclient.InferInput("X", [x.size], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("ens_diamond", [tensor])
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("Y"), (x + 2) * (x + 1))


def test_metadata_and_config(backend: Backend):
    client = http_client(backend)
    try:
        metadata = client.get_model_metadata("ens_diamond")
        config = client.get_model_config("ens_diamond")
        assert client.is_model_ready("ens_diamond")
    finally:
        client.close()
    assert metadata["platform"] == "ensemble"
    assert [i["name"] for i in metadata["inputs"]] == ["X"]
    assert [o["name"] for o in metadata["outputs"]] == ["Y", "A1"]
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["bls_leaf", "bls_leaf", "bls_leaf", "ens_mul"]
    assert steps[2]["model_version"] == 1  # an int64 rendered as a number


def test_statistics_of_the_ensemble_and_of_each_step(backend: Backend):
    before = {model: stats(backend, model) for model in ("ens_diamond", "bls_leaf", "ens_mul")}
    for _ in range(5):
        diamond(backend, X)
    after = {model: stats(backend, model) for model in ("ens_diamond", "bls_leaf", "ens_mul")}

    def delta(model: str, *path: str) -> int:
        old, new = before[model], after[model]
        for key in path:
            old, new = old[key], new[key]
        return int(new) - int(old)

    assert delta("ens_diamond", "inference_count") == 5
    assert delta("ens_diamond", "execution_count") == 5
    assert delta("ens_diamond", "inference_stats", "success", "count") == 5
    assert delta("ens_diamond", "inference_stats", "success", "ns") > 0
    assert delta("bls_leaf", "inference_stats", "success", "count") == 15  # three steps run bls_leaf
    assert delta("ens_mul", "inference_stats", "success", "count") == 5


def test_a_failing_step_fails_the_request(backend: Backend):
    failures = stats(backend, "ens_diamond")["inference_stats"]["fail"]["count"]
    with pytest.raises(InferenceServerException) as info:
        diamond(backend, np.array([np.nan, 1], np.float32))
    assert info.value.message() == "ens_mul: NaN in A"
    assert info.value.status() == "400"
    assert stats(backend, "ens_diamond")["inference_stats"]["fail"]["count"] == failures + 1
    np.testing.assert_array_equal(diamond(backend, X).as_numpy("Y"), (X + 2) * (X + 1))  # and it goes on


def test_a_decoupled_step_streams_through(backend: Backend):
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("ens_stream_pipeline", pipeline_inputs(5), request_id="p1",
                                  enable_empty_final_response=True)
        items = []
        while not items or not items[-1][0].get_response().parameters["triton_final_response"].bool_param:
            items.append(results.get(timeout=60))
            assert items[-1][1] is None, items[-1][1]
    finally:
        client.stop_stream()
        client.close()
    values = [r.as_numpy("Y") for r, _ in items[:-1]]
    assert len(values) == 5
    for k, value in enumerate(values):
        np.testing.assert_array_equal(value, X + 10 * k + 1)
    last = items[-1][0].get_response()
    assert last.id == "p1" and last.model_name == "ens_stream_pipeline" and not last.outputs


def test_unary_endpoints_refuse_a_decoupled_ensemble(backend: Backend):
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("ens_stream_pipeline", pipeline_inputs(1))
    finally:
        client.close()
    assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"


def test_cancelling_a_streaming_ensemble_cancels_its_steps(backend: Backend):
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("ens_stream_pipeline", pipeline_inputs(10_000, delay_ms=5))
        for _ in range(2):
            assert results.get(timeout=60)[1] is None
    finally:
        cancelled_at = time.monotonic()
        client.stop_stream(cancel_requests=True)
        client.close()
    backend.wait_for_log(r"ens_stream: cancelled after \d+ responses", timeout=10)
    assert time.monotonic() - cancelled_at < 10


def test_bls_into_an_ensemble(backend: Backend):
    client = http_client(backend)
    try:
        tensor = httpclient.InferInput("IN", [4], "FP32")
        tensor.set_data_from_numpy(X)
        result = client.infer("bls_driver", [tensor], parameters={"mode": "call", "target": "ens_diamond",
                                                                  "input": "X", "output": "Y"})
        np.testing.assert_array_equal(result.as_numpy("OUT"), (X + 2) * (X + 1))
        assert json.loads(result.as_numpy("INFO")[0]) == {}
        result = client.infer("bls_driver", [tensor], parameters={"mode": "call", "target": "ens_diamond",
                                                                  "input": "X", "output": "A1", "decoupled": True})
        assert json.loads(result.as_numpy("INFO")[0]) == {"responses": 1, "errors": []}
        np.testing.assert_array_equal(result.as_numpy("OUT"), X + 1)
    finally:
        client.close()


def test_nothing_is_left_behind(backend: Backend):
    def clean() -> bool:
        rows = stub_rows(backend)
        return all(row["arena_used_bytes"] == 0 and row["in_flight"] == 0 for row in rows.values()
                   if not row["instance"].startswith("bls_driver"))

    deadline = time.monotonic() + 15
    while not clean() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert clean(), stub_rows(backend)


# -- loading (explicit model control) -------------------------------------------------------------------
BAD_ENSEMBLES = {
    "ens_cycle": ('in ensemble \'ens_cycle\', the steps form a cycle', """
        { model_name: "bls_leaf" input_map { key: "IN" value: "b" } output_map { key: "OUT" value: "a" } },
        { model_name: "bls_leaf" input_map { key: "IN" value: "a" } output_map { key: "OUT" value: "b" } },
        { model_name: "bls_leaf" input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" } }"""),
    "ens_unwritten": ("in ensemble 'ens_unwritten', ensemble output 'Y' is not written by any step", """
        { model_name: "bls_leaf" input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Z" } }"""),
    "ens_missing": ("ensemble 'ens_missing' depends on 'no_such_model', which has no loaded version", """
        { model_name: "no_such_model" input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" } }"""),
    "ens_bad_name": ("maps input 'NOPE', which model 'bls_leaf' does not have", """
        { model_name: "bls_leaf" input_map { key: "NOPE" value: "X" } output_map { key: "OUT" value: "Y" } }"""),
}


def write_ensemble(repository: Path, name: str, steps: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(f"""
        platform: "ensemble"
        input [ {{ name: "X", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        ensemble_scheduling {{ step [ {steps} ] }}""")


def test_explicit_loading_composing_models_dependents_and_bad_graphs(tmp_path: Path):
    repository = make_repository(tmp_path, "bls_leaf", "ens_mul", "ens_diamond")
    for name, (_, steps) in BAD_ENSEMBLES.items():
        write_ensemble(repository, name, steps)
    with Backend(repository, "--model-control-mode=explicit") as backend:
        client = http_client(backend)
        try:
            client.load_model("ens_diamond")  # loads bls_leaf and ens_mul first
            states = {row["name"]: row.get("state") for row in client.get_model_repository_index()}
            assert states["ens_diamond"] == states["bls_leaf"] == states["ens_mul"] == "READY"
            np.testing.assert_array_equal(diamond(backend, X).as_numpy("Y"), (X + 2) * (X + 1))
            for name, (text, _) in BAD_ENSEMBLES.items():
                with pytest.raises(InferenceServerException) as info:
                    client.load_model(name)
                assert text in info.value.message(), (name, info.value.message())
            client.unload_model("bls_leaf", unload_dependents=True)
            states = {row["name"]: row.get("state") for row in client.get_model_repository_index()}
            assert states["ens_diamond"] == "UNAVAILABLE" and states["ens_mul"] == "READY"
        finally:
            client.close()
