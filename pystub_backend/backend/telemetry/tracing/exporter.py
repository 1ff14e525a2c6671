"""The OTLP/HTTP exporter: finished spans, batched, POSTed as a protobuf `ExportTraceServiceRequest`.

    request path ──▶ export(trace)  (appends the ended trace to a bounded deque: no span records,
                                     no encoding, no I/O)
    exporter thread: every `schedule_delay` (or when a batch is full) ──▶ records ──▶ encode ──▶ POST

It is the batch span processor of the OpenTelemetry SDK cut to what pystub needs (why not the
SDK: docs/tracing.md): a queue of at most `max_queue_size` spans (more are dropped and counted),
batches of at most `max_export_batch_size`, one POST at a time with a deadline (`timeout`), and a
`shutdown` that flushes what is queued within its own deadline. The collector being down costs a
log line per failed batch, never a request.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from pystub_backend.backend.telemetry.tracing.spans import SpanRecord

__all__ = ["OtlpExporter", "SpanSource", "encode"]

log = logging.getLogger("pystub.tracing")

_SCOPE = "triton-server"  # Triton's instrumentation scope name, kept so dashboards match


class SpanSource(Protocol):
    """An ended trace (spans.RequestTrace): its spans are built when the exporter takes it."""

    @property
    def span_count(self) -> int: ...

    def records(self) -> list[SpanRecord]: ...


def _value(value: str | int) -> AnyValue:
    return AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)


def _attributes(items: Iterable[tuple[str, str | int]]) -> list[KeyValue]:
    return [KeyValue(key=key, value=_value(value)) for key, value in items]


def encode(spans: list[SpanRecord], resource: list[tuple[str, str]]) -> bytes:
    """The protobuf body of one export."""
    encoded = [Span(trace_id=span.trace_id, span_id=span.span_id, parent_span_id=span.parent_span_id,
                    name=span.name, kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=span.start_ns,
                    end_time_unix_nano=span.end_ns, attributes=_attributes(span.attributes.items()),
                    events=[Span.Event(name=name, time_unix_nano=at) for name, at in span.events])
               for span in spans]
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=_attributes(resource)),
        scope_spans=[ScopeSpans(scope=InstrumentationScope(name=_SCOPE), spans=encoded)])])
    return request.SerializeToString()


class OtlpExporter:
    """Batches spans to `url` from a thread of its own. `export` is thread-safe and never blocks."""

    def __init__(self, url: str, resource: list[tuple[str, str]], *, max_queue_size: int = 2048,
                 schedule_delay: float = 5.0, max_export_batch_size: int = 512, timeout: float = 10.0) -> None:
        self.url = url
        self._resource = resource
        self._max_queue = max_queue_size
        self._delay = schedule_delay
        self._batch = max_export_batch_size
        self._timeout = timeout
        self._queue: collections.deque[SpanSource] = collections.deque()
        self._queued = 0  # spans in the queue
        self._wake = threading.Condition()
        self._stopping = False
        self.dropped = 0  # spans refused because the queue was full
        self.exported = 0
        self.failed_batches = 0
        self._thread = threading.Thread(target=self._run, name="pystub-otlp-exporter", daemon=True)
        self._thread.start()

    def export(self, source: SpanSource) -> None:
        count = source.span_count
        with self._wake:
            if self._queued + count > self._max_queue:
                self.dropped += count
                return
            self._queue.append(source)
            self._queued += count
            if self._queued >= self._batch:
                self._wake.notify()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Flush what is queued (bounded by `timeout`) and stop the thread."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("tracing: the exporter did not flush to %s within %.1f s; %d span(s) lost",
                        self.url, timeout, len(self._queue))

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._stopping and self._queued < self._batch:
                    self._wake.wait(self._delay)
                stopping = self._stopping
                sources: list[SpanSource] = []
                while self._queue and sum(s.span_count for s in sources) < self._batch:
                    sources.append(self._queue.popleft())
                self._queued -= sum(source.span_count for source in sources)
            batch = [record for source in sources for record in source.records()]
            if batch:
                self._post(batch)
            if stopping and not batch:
                return

    def _post(self, batch: list[SpanRecord]) -> None:
        body = encode(batch, self._resource)
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/x-protobuf"})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                response.read()
            self.exported += len(batch)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failed_batches += 1
            log.warning("tracing: exporting %d span(s) to %s failed after %.1f s: %s", len(batch), self.url,
                        time.monotonic() - started, exc)
