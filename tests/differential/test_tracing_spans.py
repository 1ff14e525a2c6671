"""The spans themselves: Triton 2.51 and pystub, each exporting to its own OTLP collector.

Both servers get the same `--trace-config` (opentelemetry mode, rate 1) and the same requests: an
HTTP request to a model that makes a traced BLS call (tests/models/trace_bls) and a gRPC request,
each with a client `traceparent`. Compared: every span's name, its parent (by name, or "client"),
its event names in order, and its attributes (trace ids included: both servers number their
traces 1, 2, 3 in the same order). Not compared: ids, times, resource attributes (the SDKs differ)
and the OTLP encoding (Triton sends JSON, pystub protobuf; the collector reads both).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from calls import agree
from harness import Backend, make_repository
from oracle import Endpoint, TritonServer
from otlp_collector import Collector, ReceivedSpan

Shape = tuple[str, str, tuple[str, ...], tuple[tuple[str, object], ...]]


def _flags(url: str) -> tuple[str, ...]:
    return ("--trace-config", "mode=opentelemetry", "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"opentelemetry,url={url}", "--trace-config", "opentelemetry,bsp_schedule_delay=100")


def _send(http_url: str, grpc_url: str, http_parent: str, grpc_parent: str) -> None:
    _send_http(http_url, http_parent)
    _send_grpc(grpc_url, grpc_parent)


def _send_http(http_url: str, http_parent: str) -> None:
    client = httpclient.InferenceServerClient(http_url)
    tensor = httpclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    try:
        client.infer("trace_bls", [tensor], headers={"traceparent": http_parent})
    finally:
        client.close()


def _send_grpc(grpc_url: str, grpc_parent: str) -> None:
    unary = grpcclient.InferenceServerClient(grpc_url)
    grpc_tensor = grpcclient.InferInput("IN", [3], "FP32")
    grpc_tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    try:
        unary.infer("bls_leaf", [grpc_tensor], headers={"traceparent": grpc_parent})
    finally:
        unary.close()


_SPANS_PER_TRACE = (5, 3)  # the HTTP request's (its BLS call's among them), the gRPC request's


def _triton_spans(collector: Collector, endpoint: Endpoint, trace_ids: list[str],
                  parents: list[str]) -> list[ReceivedSpan]:
    """Triton's spans of the clients' traces. Triton 2.51 now and then starts a trace of its own
    for a request instead of continuing the request's traceparent (its spans then carry another
    trace id); that request is sent once more, with the same traceparent, and the stray trace is
    left out."""
    senders = (lambda: _send_http(endpoint.http_url, parents[0]), lambda: _send_grpc(endpoint.grpc_url, parents[1]))
    _send(endpoint.http_url, endpoint.grpc_url, *parents)
    spans = collector.wait_for(f"Triton's {sum(_SPANS_PER_TRACE)} spans", lambda got: len(got) >= sum(_SPANS_PER_TRACE),
                               timeout=60)
    for trace_id, count, send in zip(trace_ids, _SPANS_PER_TRACE, senders, strict=True):
        if any(span.trace_id == trace_id for span in spans):
            continue
        print(f"Triton did not continue the traceparent of trace {trace_id}: sent again "
              f"(its spans: {[(span.name, span.trace_id) for span in spans]})")
        send()
        spans = collector.wait_for(f"Triton's {count} spans of trace {trace_id}",
                                   lambda got, t=trace_id, n=count: sum(s.trace_id == t for s in got) >= n, timeout=60)
    return [span for span in spans if span.trace_id in trace_ids]


def _shape(spans: list[ReceivedSpan], client_spans: set[str]) -> list[Shape]:
    names = {span.span_id: span.name for span in spans}
    shapes = [(span.name, "client" if span.parent_span_id in client_spans else names.get(span.parent_span_id, "?"),
               tuple(span.event_names), tuple(sorted(span.attributes.items()))) for span in spans]
    return sorted(shapes, key=repr)


def test_spans_of_http_bls_and_grpc_requests(tmp_path: Path) -> None:
    repository = make_repository(tmp_path, "trace_bls", "bls_leaf")
    trace_ids, span_ids = [os.urandom(16).hex() for _ in range(2)], [os.urandom(8).hex() for _ in range(2)]
    parents = [f"00-{trace}-{span}-01" for trace, span in zip(trace_ids, span_ids, strict=True)]
    shapes = []

    def complete(spans: list[ReceivedSpan]) -> bool:
        """Eight spans, both clients' traces among them: a batch exported late is waited for."""
        return len(spans) >= 8 and set(trace_ids) <= {span.trace_id for span in spans}

    with Collector() as triton_collector, Collector() as pystub_collector:
        triton = TritonServer(repository, tmp_path, _flags(triton_collector.url))  # all models, traced
        endpoint = triton.start()
        try:
            try:
                triton_spans = _triton_spans(triton_collector, endpoint, trace_ids, parents)
            except TimeoutError as error:  # what Triton's exporter said about it is in its log
                raise TimeoutError(f"{error}\ntritonserver's log ends:\n{triton.log_tail()}") from None
        finally:
            triton.stop()
        with Backend(repository, *_flags(pystub_collector.url)) as backend:
            _send(backend.http_url, backend.grpc_url, *parents)
            pystub_spans = pystub_collector.wait_for(f"pystub's 8 spans of the traces {trace_ids}", complete,
                                                     timeout=60)
        for server, spans in (("Triton", triton_spans), ("pystub", pystub_spans)):
            seen = [(span.name, span.trace_id) for span in spans]
            assert {span.trace_id for span in spans} == set(trace_ids), \
                f"{server}: spans outside the clients' traces {trace_ids}: {seen}"
            shapes.append(_shape(spans, set(span_ids)))
    agree(*shapes)
