"""One sampled request's spans, named as Triton's OpenTelemetry mode names them.

    InferRequest                 the frontend: HTTP_RECV_START/END, INFER_RESPONSE_COMPLETE,
    │                            HTTP_SEND_START/END (gRPC: GRPC_WAITREAD_START/END, GRPC_SEND_*);
    │                            its parent is the client's span when it sent a `traceparent`
    └─ <model name>              REQUEST_START, QUEUE_START, REQUEST_END; attributes
       │                         triton.model_name, triton.model_version, triton.trace_id,
       │                         triton.trace_parent_id (0, or the parent's trace id for BLS)
       ├─ compute                COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END
       └─ <BLS target model>     a BLS call made with `trace=request.trace()`: a child trace

(Triton 2.51 makes a BLS child the child of its caller's model span, not of its compute span;
pystub does the same.) Span ids are drawn when the trace starts, so the model span's context can
travel to the stub in the EXECUTE frame before the span ends (the stub hands it to BLS calls). Times are taken with
`time.monotonic_ns()` on the request path (the schedulers' clock) and turned into wall-clock
nanoseconds once, when the trace ends.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["SpanRecord", "RequestTrace", "parse_traceparent", "context_of", "ROOT_SPAN", "COMPUTE_SPAN"]

ROOT_SPAN = "InferRequest"
COMPUTE_SPAN = "compute"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_RECV = {"HTTP": ("HTTP_RECV_START", "HTTP_RECV_END"), "GRPC": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END")}
_SEND = {"HTTP": ("HTTP_SEND_START", "HTTP_SEND_END"), "GRPC": ("GRPC_SEND_START", "GRPC_SEND_END")}


@dataclass
class SpanRecord:
    """A finished span as the exporter encodes it (times in wall-clock ns since the epoch)."""

    name: str
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    start_ns: int
    end_ns: int
    attributes: dict[str, str | int] = field(default_factory=dict)
    events: list[tuple[str, int]] = field(default_factory=list)


def parse_traceparent(value: str | None) -> tuple[bytes, bytes] | None:
    """(trace id, parent span id) of a W3C `traceparent`, or None when absent or malformed (a bad
    header starts a new trace, as the W3C recommendation says)."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = bytes.fromhex(match.group(2)), bytes.fromhex(match.group(3))
    if not any(trace_id) or not any(span_id):
        return None
    return trace_id, span_id


def context_of(value: str | None) -> tuple[bytes, bytes] | None:
    """The (trace id, span id) of a trace context as the stub sees it: `{"traceparent": ...}`."""
    if not value:
        return None
    try:
        document = json.loads(value)
    except ValueError:
        return None
    return parse_traceparent(document.get("traceparent")) if isinstance(document, dict) else None


def _new_id(size: int) -> bytes:
    while True:
        value = os.urandom(size)
        if any(value):
            return value


class RequestTrace:
    """The spans of one request. Its methods are called on the event loop in request order; the
    trace goes to `export` once, when `finish` was called and no execute is outstanding; the
    exporter's thread then calls `records()`, which only reads."""

    __slots__ = ("_export", "trace_id", "triton_id", "parent_triton_id", "protocol", "model_name",
                 "model_version", "_parent", "_root_id", "_model_id", "_compute_id", "_root_events",
                 "_model_events", "_compute_events", "_finished", "_computing", "_offset")

    def __init__(self, export: Callable[[RequestTrace], None], triton_id: int, model_name: str,
                 protocol: str | None, parent: tuple[bytes, bytes] | None, parent_triton_id: int = 0) -> None:
        self._export = export
        self.trace_id = parent[0] if parent else _new_id(16)
        self._parent = parent[1] if parent else b""
        self.triton_id = triton_id
        self.parent_triton_id = parent_triton_id
        self.protocol = protocol  # "HTTP", "GRPC", or None for a BLS child (no frontend span)
        self.model_name = model_name
        self.model_version = ""
        self._root_id = _new_id(8) if protocol else b""
        self._model_id = _new_id(8)
        self._compute_id = _new_id(8)
        self._root_events: list[tuple[str, int]] = []
        self._model_events: list[tuple[str, int]] = []
        self._compute_events: list[tuple[str, int]] = []
        self._finished = False  # the frontend (or BLS call) is done with the request
        self._computing = 0  # executes sent to a stub whose EXECUTE_DONE is not in yet
        self._offset: int | None = None  # wall clock - monotonic, set when the trace is handed to export

    # -- the request's steps (monotonic ns) --------------------------------------------------------
    def received(self, start_ns: int, end_ns: int) -> None:
        if self.protocol:
            begin, end = _RECV[self.protocol]
            self._root_events += [(begin, start_ns), (end, end_ns)]

    def request_start(self, at_ns: int | None = None) -> None:
        self._model_events.append(("REQUEST_START", at_ns or time.monotonic_ns()))

    def computing(self, version: str, queued_ns: int, start_ns: int) -> None:
        """The scheduler took the request (queued at `queued_ns`) and sends it to a stub now. The
        spans wait for `computed`: the response can reach the client before EXECUTE_DONE does."""
        self.model_version = version
        self._model_events.append(("QUEUE_START", queued_ns))
        self._compute_events.append(("COMPUTE_START", start_ns))
        self._computing += 1

    def computed(self, input_end_ns: int, end_ns: int, waited_ns: int = 0) -> None:
        """Inputs were staged by `input_end_ns`; the stub's execute returned at `end_ns`. The batch
        then waited `waited_ns` in the stub's queue behind an earlier one: its compute starts that
        much later (the wait is queue time, as in the statistics)."""
        if waited_ns:
            at = max(index for index, (name, _) in enumerate(self._compute_events) if name == "COMPUTE_START")
            self._compute_events[at] = ("COMPUTE_START", self._compute_events[at][1] + waited_ns)
        self._compute_events += [("COMPUTE_INPUT_END", input_end_ns + waited_ns), ("COMPUTE_OUTPUT_START", end_ns),
                                 ("COMPUTE_END", end_ns)]
        self._computing -= 1
        if self._finished and not self._computing:
            self._export_spans()

    def request_end(self, at_ns: int | None = None) -> None:
        """The request's final response is in (once: `finish` ends a request that has none)."""
        if not self._finished:
            self._model_events.append(("REQUEST_END", at_ns or time.monotonic_ns()))

    def sent(self, complete_ns: int, start_ns: int, end_ns: int) -> None:
        """The response was complete at `complete_ns`, then written from `start_ns` to `end_ns`."""
        if self.protocol:
            begin, end = _SEND[self.protocol]
            self._root_events += [("INFER_RESPONSE_COMPLETE", complete_ns), (begin, start_ns), (end, end_ns)]

    @property
    def model_span_id(self) -> bytes:
        return self._model_id

    def context(self) -> str:
        """The context the stub receives (Triton's `request.trace().get_context()`): the model
        span, under which the model's BLS calls become children."""
        return json.dumps({"traceparent": f"00-{self.trace_id.hex()}-{self._model_id.hex()}-01"},
                          separators=(",", ":"))

    # -- the end -------------------------------------------------------------------------------------
    def finish(self) -> None:
        """The request is answered: export the spans now, or when its execute is done. Idempotent."""
        if self._finished:
            return
        self._finished = True
        if not any(name == "REQUEST_END" for name, _ in self._model_events):
            self._model_events.append(("REQUEST_END", time.monotonic_ns()))
        if not self._computing:
            self._export_spans()

    def _export_spans(self) -> None:
        # Only the clock offset is taken here: the span records are built by `records()` on the
        # exporter's thread, off the request path.
        if self._offset is not None:
            return
        self._offset = time.time_ns() - time.monotonic_ns()  # monotonic -> wall clock, once per trace
        self._export(self)

    @property
    def span_count(self) -> int:
        return 1 + bool(self._root_id) + bool(self._compute_events)

    def records(self) -> list[SpanRecord]:
        """The finished spans (call once the trace was handed to export)."""
        return [span for span in self._spans(self._offset or 0) if span is not None]

    def _spans(self, offset: int) -> list[SpanRecord | None]:
        model_parent = self._root_id or self._parent
        version = self.model_version
        attributes: dict[str, str | int] = {
            "triton.model_name": self.model_name, "triton.model_version": int(version) if version.isdigit() else
            version, "triton.trace_id": self.triton_id}
        attributes["triton.trace_parent_id"] = self.parent_triton_id
        # A span covers its children: the root its model span (a failed request has no send events),
        # and both the compute span, whose EXECUTE_DONE may come after the response was sent.
        return [
            self._span(ROOT_SPAN, self._root_id, self._parent, self._root_events, offset, {},
                       self._model_events + self._compute_events) if self._root_id else None,
            self._span(self.model_name, self._model_id, model_parent, self._model_events, offset, attributes,
                       self._compute_events),
            self._span(COMPUTE_SPAN, self._compute_id, self._model_id, self._compute_events, offset, {})
            if self._compute_events else None,
        ]

    def _span(self, name: str, span_id: bytes, parent: bytes, events: list[tuple[str, int]], offset: int,
              attributes: dict[str, str | int], within: list[tuple[str, int]] | None = None) -> SpanRecord:
        events = sorted(events, key=lambda event: event[1])
        times = [at for _, at in events] + [at for _, at in within or ()] or [time.monotonic_ns()]
        return SpanRecord(name, self.trace_id, span_id, parent, min(times) + offset, max(times) + offset,
                          attributes, [(event, at + offset) for event, at in events])
