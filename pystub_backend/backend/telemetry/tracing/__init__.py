"""Request tracing: `--trace-config`, the trace settings, and OpenTelemetry spans (docs/tracing.md).

    settings.py  --trace-config and the settings behind /v2/trace/setting (Triton's shapes)
    tracer.py    which requests are traced (rate, count), and the child traces of BLS calls
    spans.py     one request's spans (InferRequest, <model>, compute) and W3C traceparent
    exporter.py  batched OTLP/HTTP (protobuf) export from a thread of its own
"""

from pystub_backend.backend.telemetry.tracing.exporter import OtlpExporter
from pystub_backend.backend.telemetry.tracing.settings import (
    TraceConfig,
    TraceConfigError,
    TraceSettingError,
    parse_trace_config,
)
from pystub_backend.backend.telemetry.tracing.spans import RequestTrace, SpanRecord
from pystub_backend.backend.telemetry.tracing.tracer import Tracer

__all__ = ["Tracer", "TraceConfig", "TraceConfigError", "TraceSettingError", "parse_trace_config",
           "RequestTrace", "SpanRecord", "OtlpExporter"]
