"""Health, metadata, configuration, repository index, statistics, logging and metrics: Triton vs pystub.

Normalised: the server's name and version in server metadata (they must differ), counters and
durations in statistics (only the field names and the counters this file's own requests moved
are compared), metric values (only family names and types are compared).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from calls import agree, both, grpc_infer, raw
from deviations import agree_or_deviate
from google.protobuf import json_format
from oracle import STARTUP_MODELS, Endpoint, Pair

MISSING = "no_such_model"
T = TypeVar("T")


def _status(endpoint: Endpoint, method: str, path: str) -> int:
    return raw(endpoint, method, path).status


def _answer(endpoint: Endpoint, method: str, path: str, body: object = None) -> tuple[int, Any]:
    reply = raw(endpoint, method, path, body)  # type: ignore[arg-type]
    return reply.status, reply.json()


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready"])
def test_health(pair: Pair, path: str) -> None:
    assert both(pair, _status, "GET", path) == (200, 200)


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2/models/add_sub/ready"])
def test_health_wrong_method(pair: Pair, path: str) -> None:
    triton, pystub = both(pair, _status, "POST", path)
    agree(triton, pystub)


@pytest.mark.parametrize("model", [*STARTUP_MODELS, "loadable", "init_fails", MISSING])
def test_model_ready_http(pair: Pair, model: str) -> None:
    triton, pystub = both(pair, _status, "GET", f"/v2/models/{model}/ready")
    agree(triton, pystub)


@pytest.mark.parametrize("version", ["1", "2", "abc"])
def test_model_version_ready_http(pair: Pair, version: str) -> None:
    triton, pystub = both(pair, _status, "GET", f"/v2/models/add_sub/versions/{version}/ready")
    agree(triton, pystub)


@pytest.mark.parametrize("model", [*STARTUP_MODELS, "loadable", MISSING])
def test_model_ready_grpc(pair: Pair, model: str) -> None:
    def ready(endpoint: Endpoint) -> object:
        client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        try:
            return client.is_model_ready(model), client.is_server_live(), client.is_server_ready()
        finally:
            client.close()
    triton, pystub = both(pair, ready)
    agree(triton, pystub)


@pytest.mark.parametrize("model", STARTUP_MODELS)
def test_model_metadata_http(pair: Pair, model: str) -> None:
    triton, pystub = both(pair, _answer, "GET", f"/v2/models/{model}")
    agree(triton, pystub)


@pytest.mark.parametrize("path", [f"/v2/models/{MISSING}", "/v2/models/loadable", "/v2/models/add_sub/versions/1",
                                  "/v2/models/add_sub/versions/2", f"/v2/models/{MISSING}/config",
                                  "/v2/models/loadable/config"])
def test_metadata_errors_http(pair: Pair, path: str) -> None:
    triton, pystub = both(pair, _answer, "GET", path)
    agree(triton, pystub)


def _grpc_json(endpoint: Endpoint, what: str, model: str) -> object:
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    try:
        if what == "metadata":
            return json_format.MessageToDict(client.get_model_metadata(model), preserving_proto_field_name=True)
        return json_format.MessageToDict(client.get_model_config(model), preserving_proto_field_name=True)
    except Exception as error:  # noqa: BLE001 - the error's status and text are what is compared
        return {"status": error.status(), "error": error.message()}  # type: ignore[attr-defined]
    finally:
        client.close()


@pytest.mark.parametrize("model", [*STARTUP_MODELS, MISSING])
def test_model_metadata_grpc(pair: Pair, model: str) -> None:
    triton, pystub = both(pair, _grpc_json, "metadata", model)
    agree(triton, pystub)


@pytest.mark.parametrize("model", STARTUP_MODELS)
def test_model_config_http(pair: Pair, model: str) -> None:
    triton, pystub = both(pair, _answer, "GET", f"/v2/models/{model}/config")
    agree(triton, pystub)


@pytest.mark.parametrize("model", ["add_sub", "repeat", "seq_acc", "dyn_batch", MISSING])
def test_model_config_grpc(pair: Pair, model: str) -> None:
    triton, pystub = both(pair, _grpc_json, "config", model)
    agree(triton, pystub)


def test_server_metadata_http(pair: Pair) -> None:
    (_, triton), (_, pystub) = both(pair, _answer, "GET", "/v2")
    assert (triton["name"], triton["version"]) == ("triton", "2.51.0")
    # normalised: the server's own name and version must differ
    assert set(triton) == set(pystub)


# Deliberate deviation: pystub has no GPU support, so no CUDA shared memory.
_NOT_LISTED = {"cuda_shared_memory"}


def test_server_extensions(pair: Pair) -> None:
    (_, triton), (_, pystub) = both(pair, _answer, "GET", "/v2")
    assert set(triton["extensions"]) >= _NOT_LISTED and not _NOT_LISTED & set(pystub["extensions"])
    agree(sorted(set(triton["extensions"]) - _NOT_LISTED), sorted(pystub["extensions"]))


def test_server_metadata_grpc(pair: Pair) -> None:
    def metadata(endpoint: Endpoint) -> object:
        client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        try:
            answer = json_format.MessageToDict(client.get_server_metadata(), preserving_proto_field_name=True)
            return sorted(answer)
        finally:
            client.close()
    triton, pystub = both(pair, metadata)
    agree(triton, pystub)


def _index(endpoint: Endpoint, body: object) -> tuple[int, object]:
    return _answer(endpoint, "POST", "/v2/repository/index", body)


@pytest.mark.parametrize("body", [None, {}, {"ready": True}, {"ready": False}])
def test_repository_index(pair: Pair, body: object) -> None:
    triton, pystub = both(pair, _index, body)
    agree(triton, pystub)


def test_repository_index_bad_json(pair: Pair) -> None:
    """Deliberate deviation (malformed client input): Triton 500, pystub 400; both name the parser."""
    triton, pystub = both(pair, _answer, "POST", "/v2/repository/index", b"{nope")
    assert (triton[0], pystub[0]) == (500, 400)
    for answer in (triton, pystub):
        assert answer[1]["error"].startswith("failed to parse the request JSON buffer: "), answer


def test_repository_index_grpc(pair: Pair) -> None:
    def index(endpoint: Endpoint) -> object:
        client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        try:
            return json_format.MessageToDict(client.get_model_repository_index(), preserving_proto_field_name=True)
        finally:
            client.close()
    triton, pystub = both(pair, index)
    agree(triton, pystub)


# -- statistics ---------------------------------------------------------------------------------

def _shape(value: object) -> object:
    """The field names of a statistics answer, values dropped (durations and counts differ)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _stats(endpoint: Endpoint, model: str) -> tuple[int, object]:
    return _answer(endpoint, "GET", f"/v2/models/{model}/stats" if model else "/v2/models/stats")


def _settled(read: Callable[[], tuple[T, T]], done: Callable[[T, T], bool]) -> tuple[T, T]:
    """Both servers count an execution after its response is on its way: read again (for at most
    _SETTLE seconds) until `done` holds, then return the last reading."""
    deadline = time.monotonic() + _SETTLE
    triton, pystub = read()
    while not done(triton, pystub) and time.monotonic() < deadline:
        time.sleep(0.1)
        triton, pystub = read()
    return triton, pystub


_SETTLE = 5.0


@pytest.mark.parametrize("model", ["add_sub", "repeat", "dyn_batch"])
def test_statistics_fields(pair: Pair, model: str) -> None:
    tensors = [("INPUT0", np.ones(4, np.float32), "FP32"), ("INPUT1", np.ones(4, np.float32), "FP32")]
    both(pair, grpc_infer, "add_sub", tensors, ["OUTPUT0"])
    (tstatus, triton), (pstatus, pystub) = _settled(lambda: both(pair, _stats, model),
                                                    lambda t, p: _shape(t) == _shape(p))
    assert tstatus == pstatus == 200
    agree(_shape(triton), _shape(pystub))


def test_statistics_counts_move_alike(pair: Pair) -> None:
    def count(endpoint: Endpoint) -> tuple[int, int]:
        _, answer = _stats(endpoint, "bytes_echo")
        stats = answer["model_stats"][0]  # type: ignore[index]
        return stats["inference_count"], stats["execution_count"]
    before = both(pair, count)
    tensors = [("INPUT0", np.array([b"ab"], np.object_), "BYTES")]
    for _ in range(3):
        both(pair, grpc_infer, "bytes_echo", tensors, ["OUTPUT0"])
    after = _settled(lambda: both(pair, count),
                     lambda t, p: (t[0] - before[0][0], p[0] - before[1][0]) == (3, 3))
    assert [a[0] - b[0] for a, b in zip(after, before, strict=True)] == [3, 3]
    assert [a[1] - b[1] for a, b in zip(after, before, strict=True)] == [3, 3]


@pytest.mark.parametrize("path", ["/v2/models/stats", f"/v2/models/{MISSING}/stats",
                                  "/v2/models/add_sub/versions/7/stats", "/v2/models/loadable/stats"])
def test_statistics_status(pair: Pair, path: str) -> None:
    (tstatus, triton), (pstatus, pystub) = both(pair, _answer, "GET", path)
    agree([tstatus, triton.get("error") if isinstance(triton, dict) else None],
          [pstatus, pystub.get("error") if isinstance(pystub, dict) else None])


# -- logging ------------------------------------------------------------------------------------

def test_logging_get(pair: Pair) -> None:
    triton, pystub = both(pair, _answer, "GET", "/v2/logging")
    agree(triton, pystub)


@pytest.mark.parametrize("body", [{"log_verbose_level": 0}, {"log_info": True}, {"log_format": "default"},
                                  {"log_verbose_level": -1}, {"log_info": "yes"}, {"log_format": "xml"},
                                  {"no_such_setting": 1}, pytest.param(b"{not json", id="not_json")])
def test_logging_update(pair: Pair, body: object, request: pytest.FixtureRequest) -> None:
    triton, pystub = both(pair, _answer, "POST", "/v2/logging", body)
    agree_or_deviate(request.node.name, triton, pystub)


# -- metrics ------------------------------------------------------------------------------------

_TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)


def _families(endpoint: Endpoint) -> dict[str, str]:
    reply = raw(endpoint, "GET", "/metrics", port=endpoint.metrics_port)
    assert reply.status == 200
    return dict(_TYPE_LINE.findall(reply.body.decode()))


_TRITON_FAMILIES = ["nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
                    "nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"]


@pytest.mark.parametrize("family", _TRITON_FAMILIES)
def test_metric_family(pair: Pair, family: str) -> None:
    triton, pystub = both(pair, _families)
    assert triton.get(family) == pystub.get(family)
    assert family in triton


def test_metric_families_of_triton_in_pystub(pair: Pair) -> None:
    triton, pystub = both(pair, _families)
    agree(sorted(triton), sorted(name for name in pystub if name in triton))


# pystub's own families (documented in docs/triton-differences.md): per-stub supervision gauges,
# and the model-load duration that later Triton releases export too.
_PYSTUB_EXTRA = re.compile(r"^(pystub_stub_[a-z_]+|pystub_inflight_requests|nv_model_load_duration_secs)$")


def test_metric_families_pystub_adds(pair: Pair) -> None:
    """Deliberate deviation: pystub exports more families than Triton 2.51, all of them named above."""
    triton, pystub = both(pair, _families)
    extra = sorted(set(pystub) - set(triton))
    assert extra and all(_PYSTUB_EXTRA.match(name) for name in extra), extra


def test_metrics_labels(pair: Pair) -> None:
    def labels(endpoint: Endpoint) -> str:
        text = raw(endpoint, "GET", "/metrics", port=endpoint.metrics_port).body.decode()
        line = next(x for x in text.splitlines() if x.startswith("nv_inference_count{") and 'model="add_sub"' in x)
        return line.split("}")[0] + "}"
    triton, pystub = both(pair, labels)
    agree(triton, pystub)


# -- the same over gRPC -------------------------------------------------------------------------

def _grpc_call(endpoint: Endpoint, method: str, *args: object) -> object:
    """A tritonclient.grpc admin call; its answer as JSON-able data, or (status, message)."""
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    try:
        answer = getattr(client, method)(*args)
        if answer is None:
            return None
        # zero counters and durations are printed too: which fields exist is compared, not values
        return json_format.MessageToDict(answer, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
    except Exception as error:  # noqa: BLE001 - the error's status and text are what is compared
        return {"status": error.status(), "error": error.message()}  # type: ignore[attr-defined]
    finally:
        client.close()


GRPC_ADMIN = {
    "statistics_unknown_model": ("get_inference_statistics", MISSING),
    "statistics_unloaded_model": ("get_inference_statistics", "loadable"),
    "log_settings": ("get_log_settings",),
    "shm_status_empty": ("get_system_shared_memory_status",),
    "shm_status_unknown": ("get_system_shared_memory_status", "nope"),
    "shm_unregister_unknown": ("unregister_system_shared_memory", "nope"),
    "shm_register_missing_key": ("register_system_shared_memory", "r1", "/no_such_shm_key_differential", 16),
    "cuda_shm_status": ("get_cuda_shared_memory_status",),
    "trace_settings": ("get_trace_settings",),
}


@pytest.mark.parametrize("case", sorted(GRPC_ADMIN))
def test_grpc_admin(pair: Pair, case: str, request: pytest.FixtureRequest) -> None:
    method, *args = GRPC_ADMIN[case]
    triton, pystub = both(pair, _grpc_call, method, *args)
    agree_or_deviate(request.node.name, triton, pystub)


@pytest.mark.parametrize("model", ["add_sub", "repeat"])
def test_grpc_statistics_fields(pair: Pair, model: str) -> None:
    triton, pystub = _settled(lambda: both(pair, _grpc_call, "get_inference_statistics", model),
                              lambda t, p: _shape(t) == _shape(p))
    agree(_shape(triton), _shape(pystub))
