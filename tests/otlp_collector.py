"""An OpenTelemetry collector for tests: a real OTLP/HTTP receiver on 127.0.0.1.

It accepts `POST /v1/traces` with a protobuf `ExportTraceServiceRequest` (what Triton's and
pystub's exporters send), decodes it, and keeps every span as a `ReceivedSpan`. Tests wait for
spans with a deadline (`wait_for`), which names what it waited for when it expires.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["Collector", "ReceivedSpan"]


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _decode(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """Protobuf (pystub) or OTLP/JSON (Triton 2.51's exporter), whose ids are hex, not base64."""
    if not content_type.startswith("application/json"):
        return ExportTraceServiceRequest.FromString(body)
    document = json.loads(body)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    events: list[tuple[str, int]]
    resource: dict[str, object] = field(default_factory=dict)
    scope: str = ""

    @property
    def event_names(self) -> list[str]:
        return [name for name, _ in self.events]


class Collector:
    """Start with `with Collector() as collector:`; `collector.url` is the traces endpoint."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.content_types: set[str] = set()
        self.errors: list[str] = []  # bodies that did not decode, and why
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-collector", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> Collector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def wait_for(self, what: str, predicate: Callable[[list[ReceivedSpan]], bool],
                 timeout: float = 20.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                names = [(s.name, s.trace_id) for s in spans]
                raise TimeoutError(f"collector: no {what} after {timeout} s; spans so far: {names}")
            time.sleep(0.05)

    def _receive(self, body: bytes, content_type: str) -> None:
        request = _decode(body, content_type)
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(
                        span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        span.start_time_unix_nano, span.end_time_unix_nano,
                        {a.key: _value(a.value) for a in span.attributes},
                        [(e.name, e.time_unix_nano) for e in span.events], resource, scope_spans.scope.name))
        with self._lock:
            self.spans.extend(received)
            self.requests += 1
            self.content_types.add(content_type)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                try:
                    collector._receive(body, self.headers.get("Content-Type", ""))
                except Exception as exc:  # noqa: BLE001 - a body that does not decode is the sender's bug
                    collector.errors.append(f"{exc!r} headers={dict(self.headers)} body={body[:80]!r}")
                    self.send_error(400)
                    return
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        return Handler
