"""Tracing (--trace-config mode=opentelemetry): the spans a real backend exports to a real OTLP/HTTP
collector on 127.0.0.1 (tests/otlp_collector.py), and the trace settings endpoints.

The span shapes asserted here are Triton 2.51's, as its own exporter sends them
(tests/differential/test_tracing_spans.py compares the two servers' spans directly).
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.harness import Backend, make_repository
from tests.otlp_collector import Collector, ReceivedSpan

_OTEL = ("--trace-config", "mode=opentelemetry", "--trace-config", "opentelemetry,bsp_schedule_delay=50",
         "--trace-config", "opentelemetry,resource=service.name=pystub-test")


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _http_infer(backend: Backend, model: str, headers: dict[str, str] | None = None,
                parameters: dict[str, object] | None = None) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(backend.http_url)
    tensor = httpclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    try:
        return client.infer(model, [tensor], headers=headers, parameters=parameters)
    finally:
        client.close()


def _grpc_infer(backend: Backend, model: str, headers: dict[str, str]) -> None:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    tensor = grpcclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    try:
        client.infer(model, [tensor], headers=headers)
    finally:
        client.close()


def _of_trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.trace_id == trace_id]


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [(s.name, s.span_id) for s in spans]
    return found[0]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("tracing"), "trace_bls", "bls_leaf", "repeat")


@pytest.fixture(scope="module")
def traced(repository: Path) -> Iterator[tuple[Backend, Collector]]:
    with Collector() as collector, Backend(repository, *_OTEL, "--trace-config", "rate=1", "--trace-config",
                                           "level=TIMESTAMPS", "--trace-config",
                                           f"opentelemetry,url={collector.url}") as backend:
        yield backend, collector


def test_http_request_bls_child_and_client_context(traced: tuple[Backend, Collector]) -> None:
    backend, collector = traced
    traceparent, trace_id, client_span = _traceparent()
    result = _http_infer(backend, "trace_bls", {"traceparent": traceparent})
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.arange(3, dtype=np.float32) + 1)
    spans = _of_trace(collector.wait_for("the 5 spans of the BLS request", lambda s: len(_of_trace(s, trace_id)) >= 5),
                      trace_id)
    assert sorted(span.name for span in spans) == ["InferRequest", "bls_leaf", "compute", "compute", "trace_bls"]
    root, outer, inner = _one(spans, "InferRequest"), _one(spans, "trace_bls"), _one(spans, "bls_leaf")
    assert root.parent_span_id == client_span  # the client's traceparent is continued
    assert root.event_names == ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
                                "HTTP_SEND_END"]
    assert outer.parent_span_id == root.span_id
    assert outer.event_names == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert outer.attributes["triton.model_name"] == "trace_bls" and outer.attributes["triton.model_version"] == 1
    assert outer.attributes["triton.trace_parent_id"] == 0
    # The BLS call made with trace=request.trace() is a child trace under the caller's model span.
    assert inner.parent_span_id == outer.span_id
    assert inner.attributes["triton.trace_parent_id"] == outer.attributes["triton.trace_id"]
    computes = {span.parent_span_id: span for span in spans if span.name == "compute"}
    assert set(computes) == {outer.span_id, inner.span_id}
    for compute in computes.values():
        assert compute.event_names == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    # Spans nest in time: the request contains the model's execute, in which the BLS call starts (it
    # may end after: its EXECUTE_DONE can follow the response the caller was waiting for).
    assert root.start_ns <= outer.start_ns <= computes[outer.span_id].start_ns <= inner.start_ns
    assert inner.start_ns <= computes[outer.span_id].end_ns <= outer.end_ns <= root.end_ns
    # The model saw its own span as its trace context (what it passed to the BLS call).
    context = json.loads(result.as_numpy("CONTEXT")[0])
    assert context == {"traceparent": f"00-{trace_id}-{outer.span_id}-01"}
    assert root.resource["service.name"] == "pystub-test"
    assert collector.content_types == {"application/x-protobuf"} and not collector.errors


def test_grpc_request_continues_metadata_traceparent(traced: tuple[Backend, Collector]) -> None:
    backend, collector = traced
    traceparent, trace_id, client_span = _traceparent()
    _grpc_infer(backend, "bls_leaf", {"traceparent": traceparent})
    spans = _of_trace(collector.wait_for("the 3 spans of the gRPC request", lambda s: len(_of_trace(s, trace_id)) >= 3),
                      trace_id)
    root, model = _one(spans, "InferRequest"), _one(spans, "bls_leaf")
    assert root.parent_span_id == client_span
    assert root.event_names == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE",
                                "GRPC_SEND_START", "GRPC_SEND_END"]
    assert model.parent_span_id == root.span_id and _one(spans, "compute").parent_span_id == model.span_id


def test_bls_call_without_the_trace_is_not_traced(traced: tuple[Backend, Collector]) -> None:
    backend, collector = traced
    traceparent, trace_id, _ = _traceparent()
    _http_infer(backend, "trace_bls", {"traceparent": traceparent}, {"untraced": True})
    spans = collector.wait_for("the outer request's 3 spans", lambda s: len(_of_trace(s, trace_id)) >= 3)
    _grpc_infer(backend, "bls_leaf", {})  # a later trace: what the first one would have sent is in by then
    collector.wait_for("a later request's spans", lambda s: len(s) >= len(spans) + 3)
    assert sorted(span.name for span in _of_trace(collector.spans, trace_id)) == ["InferRequest", "compute",
                                                                                 "trace_bls"]


def test_a_malformed_traceparent_starts_a_new_trace(traced: tuple[Backend, Collector]) -> None:
    backend, collector = traced
    before = len(collector.spans)
    _http_infer(backend, "bls_leaf", {"traceparent": "00-not-a-context-01"})
    spans = collector.wait_for("the request's 3 spans", lambda s: len(s) >= before + 3)[before:]
    root = _one(spans, "InferRequest")
    assert root.parent_span_id == "" and len({span.trace_id for span in spans}) == 1


def test_settings_endpoints(traced: tuple[Backend, Collector]) -> None:
    backend, _ = traced
    base = f"http://{backend.http_url}"
    settings = requests.get(f"{base}/v2/trace/setting", timeout=30).json()
    assert settings["trace_mode"] == "opentelemetry" and settings["trace_level"] == ["TIMESTAMPS"]
    assert settings["trace_rate"] == "1" and settings["resource"] == "service.name=pystub-test"
    answer = requests.post(f"{base}/v2/models/bls_leaf/trace/setting", json={"trace_rate": "7"}, timeout=30)
    assert answer.status_code == 200 and answer.json()["trace_rate"] == "7"
    assert requests.get(f"{base}/v2/trace/setting", timeout=30).json()["trace_rate"] == "1"
    cleared = requests.post(f"{base}/v2/models/bls_leaf/trace/setting", json={"trace_rate": None}, timeout=30)
    assert cleared.json()["trace_rate"] == "1"
    refusals = [
        ({"trace_file": "/tmp/x"}, 501, "trace file location can not be updated through network protocol"),
        ({"trace_count": "abc"}, 400, "Unable to parse 'trace_count', got: abc"),
        ({"trace_count": "-5"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-5"),
        ({"trace_rate": 3}, 500, "attempt to access JSON non-string as string"),
    ]
    for body, status, text in refusals:
        refused = requests.post(f"{base}/v2/trace/setting", json=body, timeout=30)
        assert (refused.status_code, refused.json()) == (status, {"error": text}), body
    unknown = requests.get(f"{base}/v2/models/nope/trace/setting", timeout=30)
    assert (unknown.status_code, unknown.json()) == (400, {"error": "Request for unknown model : nope"})
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        updated = client.get_trace_settings(as_json=True)["settings"]
        assert updated["trace_level"]["value"] == ["TIMESTAMPS"]
        model = client.update_trace_settings("bls_leaf", {"trace_count": "4"}, as_json=True)["settings"]
        assert model["trace_count"]["value"] == ["4"]
        assert client.update_trace_settings("bls_leaf", {"trace_count": None}, as_json=True)[
            "settings"]["trace_count"]["value"] == ["-1"]
        with pytest.raises(InferenceServerException, match="trace file location"):
            client.update_trace_settings(settings={"trace_file": "x"})
    finally:
        client.close()


def test_level_rate_and_count_follow_the_settings(repository: Path) -> None:
    with Collector() as collector, Backend(repository, *_OTEL, f"--trace-config=opentelemetry,url={collector.url}"
                                           ) as backend:
        # Level OFF (the default): nothing is traced, and the model sees no trace context.
        assert _http_infer(backend, "trace_bls").as_numpy("CONTEXT")[0] == b""
        update = {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2"}
        answer = requests.post(f"http://{backend.http_url}/v2/trace/setting", json=update, timeout=30)
        assert answer.status_code == 200, answer.text
        contexts = [_traceparent() for _ in range(6)]
        for traceparent, _, _ in contexts:
            _http_infer(backend, "bls_leaf", {"traceparent": traceparent})
        collector.wait_for("2 traces", lambda spans: len({span.trace_id for span in spans}) >= 2)
        # Every 2nd request, 2 in all; the untraced ones would have been exported with them.
        _http_infer(backend, "trace_bls")
        assert {span.trace_id for span in collector.spans} == {contexts[1][1], contexts[3][1]}


def test_an_unreachable_collector_costs_no_request(repository: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Backend(repository, *_OTEL, "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS",
                 f"--trace-config=opentelemetry,url=http://127.0.0.1:{port}/v1/traces") as backend:
        for _ in range(3):
            result = _http_infer(backend, "bls_leaf")
            np.testing.assert_array_equal(result.as_numpy("OUT"), np.arange(3, dtype=np.float32) + 1)
        backend.wait_for_log(re.escape(f"to http://127.0.0.1:{port}/v1/traces failed"), timeout=30)


def test_grpc_stream_requests_are_traced(traced: tuple[Backend, Collector]) -> None:
    backend, collector = traced
    traceparent, trace_id, client_span = _traceparent()
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    answers: list[object] = []
    try:
        client.start_stream(callback=lambda result, error: answers.append(error or result),
                            headers={"traceparent": traceparent})
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([3], dtype=np.int32))
        delay = grpcclient.InferInput("DELAY_MS", [1], "INT32")
        delay.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.async_stream_infer("repeat", [count, delay])
        spans = _of_trace(collector.wait_for("the stream request's 3 spans",
                                             lambda s: len(_of_trace(s, trace_id)) >= 3), trace_id)
    finally:
        client.stop_stream()
        client.close()
    assert len(answers) == 3 and not any(isinstance(a, Exception) for a in answers)
    root, model = _one(spans, "InferRequest"), _one(spans, "repeat")
    assert root.parent_span_id == client_span and model.parent_span_id == root.span_id
    assert root.event_names[:2] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
    assert model.event_names == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
