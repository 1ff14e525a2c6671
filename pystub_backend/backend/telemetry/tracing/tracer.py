"""The tracer: which requests are traced (Triton's rate and count), and where their spans go.

The frontends ask `start(model, protocol, traceparent)` for each inference request; the BLS
handler asks `child(context, model)` for a call the model made with `trace=request.trace()`.
Both answer None unless tracing is on, and the frontends check `active` first, so a server
without `--trace-config mode=opentelemetry` pays one attribute read per request.

Sampling is Triton's: every `rate`-th request of a model is traced while `count` (when not -1)
has traces left; a model with its own rate or count (set through its trace setting) samples on
its own counters, the others share the global ones. A client's `traceparent` makes the trace
continue the client's (same trace id, the client's span as parent) but does not force sampling.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

from pystub_backend.backend.telemetry.tracing.exporter import OtlpExporter
from pystub_backend.backend.telemetry.tracing.settings import TraceConfig, TraceSettingsStore
from pystub_backend.backend.telemetry.tracing.spans import RequestTrace, context_of, parse_traceparent

__all__ = ["Tracer"]

log = logging.getLogger("pystub.tracing")

_SDK_RESOURCE = [("telemetry.sdk.name", "pystub"), ("telemetry.sdk.language", "python")]


@dataclass
class _Sampler:
    seen: int = 0
    traced: int = 0


class Tracer:
    """Owned by the server (one per process). Not thread-safe: used on the event loop only."""

    def __init__(self, config: TraceConfig | None = None, exporter: OtlpExporter | None = None) -> None:
        self.config = config or TraceConfig()
        self.settings = TraceSettingsStore(self.config)
        self._exporter = exporter
        self._ids = itertools.count(1)  # triton.trace_id: 1, 2, ... per server, as in Triton
        self._samplers: dict[str, _Sampler] = {}
        self._live: dict[bytes, int] = {}  # model span id -> triton.trace_id of traces not yet ended
        self.active = False
        self._refresh()

    @classmethod
    def from_config(cls, config: TraceConfig) -> Tracer:
        """A tracer exporting to the config's collector (its thread starts only in opentelemetry mode)."""
        exporter = None
        if config.opentelemetry:
            exporter = OtlpExporter(config.url, list(config.resource) + _SDK_RESOURCE,
                                    max_queue_size=config.bsp_max_queue_size,
                                    schedule_delay=config.bsp_schedule_delay_ms / 1000,
                                    max_export_batch_size=config.bsp_max_export_batch_size)
        elif config.level != ("OFF",):
            log.warning("trace mode 'triton' (trace files) is not implemented: nothing is traced; use "
                        "--trace-config mode=opentelemetry")
        return cls(config, exporter)

    @property
    def exporter(self) -> OtlpExporter | None:
        return self._exporter

    def update(self, body: dict[str, object], model: str = "") -> dict[str, object]:
        """A settings update (raises TraceSettingError); see TraceSettingsStore.update."""
        answer = self.settings.update(body, model)
        self._samplers.clear()  # new rate or count: counting starts again, as in Triton
        self._refresh()
        return answer

    def _refresh(self) -> None:
        self.active = self._exporter is not None and (
            self.settings.value("level") != ("OFF",) or self.settings.any_model_level_on())

    # -- traces ----------------------------------------------------------------------------------
    def start(self, model: str, protocol: str, traceparent: str | None = None) -> RequestTrace | None:
        """A trace for a request the frontend received, or None when it is not sampled."""
        if not self.active or not self._sample(model):
            return None
        return self._register(RequestTrace(self._export, next(self._ids), model, protocol,
                                           parse_traceparent(traceparent)))

    def child(self, context: str | None, model: str) -> RequestTrace | None:
        """The child trace of a BLS call whose parent passed its trace context (always traced:
        the parent was sampled), or None."""
        parent = context_of(context) if self.active else None
        if parent is None:
            return None
        return self._register(RequestTrace(self._export, next(self._ids), model, None, parent,
                                           self._live.get(parent[1], 0)))

    def _register(self, trace: RequestTrace) -> RequestTrace:
        self._live[trace.model_span_id] = trace.triton_id
        return trace

    def _sample(self, model: str) -> bool:
        if self.settings.value("level", model) == ("OFF",):
            return False
        key = model if self.settings.has_own_sampling(model) else ""
        sampler = self._samplers.setdefault(key, _Sampler())
        count = int(self.settings.value("count", model))  # type: ignore[call-overload]
        if count != -1 and sampler.traced >= count:
            return False
        sampler.seen += 1
        if sampler.seen % int(self.settings.value("rate", model)) != 0:  # type: ignore[call-overload]
            return False
        sampler.traced += 1
        return True

    def _export(self, trace: RequestTrace) -> None:
        self._live.pop(trace.model_span_id, None)
        if self._exporter is not None:
            self._exporter.export(trace)

    def shutdown(self, timeout: float = 5.0) -> None:
        if self._exporter is not None:
            self._exporter.shutdown(timeout)
