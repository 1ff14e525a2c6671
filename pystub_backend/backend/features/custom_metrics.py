"""The server's custom metrics: what models create with `pb_utils.MetricFamily` / `Metric`, fed
by their stubs (frames in `pystub_backend.ipc.messages.metrics`, the stub side in
`pystub_backend.stub.features.metrics`) and served on `/metrics` next to the server's own.

As in Triton, the registry is server-wide:
- a family is known by its name; creating it again with the same kind (from any model or
  instance) reuses it, with another kind fails (`Family name already exists with different type`);
  names of the server's own families, and the `pystub_` prefix, are refused;
- a series is a family plus a set of labels; every stub holding a `Metric` with those labels
  shares it (two instances of a model that increment the same counter add up).

Values belong to the server, not to a stub. The rule for stub restarts (and unloads):
- a stub that dies, restarts or is unloaded leaves its families and series on `/metrics` with
  their values; a new incarnation that creates the same family and labels continues from them
  (`value()` included), so counters never go backwards because a stub restarted;
- a series leaves `/metrics` when the last *live* stub holding it drops its `Metric` object (as
  Triton deletes a metric when its last holder does); families are never removed;
- changes a stub made after its last frame reached the server (at most FLUSH_DELAY worth, when it
  is killed) are lost with it.
"""

from __future__ import annotations

import bisect
import logging
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pystub_backend.ipc.messages.metrics import (
    ENTRY_CREATE,
    ENTRY_DELETE,
    ENTRY_UPDATE,
    MetricFamilyCreate,
    MetricOps,
    MetricReply,
    MetricValueQuery,
)

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.handlers import BackendHandlers
    from pystub_backend.backend.supervision.services import StubFacingCore
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["register", "CustomMetrics", "CustomFamily", "CustomSeries", "CustomMetricError", "registry_for",
           "COUNTER", "GAUGE", "HISTOGRAM", "KIND_NAMES", "SERVER_FAMILIES"]

log = logging.getLogger("pystub.metrics")

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
# The families the server itself exports (pystub_backend.backend.frontends.metrics); a model may not take them.
SERVER_FAMILIES = frozenset({
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
    "nv_model_load_duration_secs", "nv_cpu_utilization", "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
})
RESERVED_PREFIX = "pystub_"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

LabelKey = tuple[tuple[str, str], ...]


class MetricHolder(Protocol):
    """What holds a metric: a stub process, which is all the registry asks of it."""

    @property
    def alive(self) -> bool: ...


class CustomMetricError(Exception):
    """A refused metric call; the text is the reason the model sees (after pb_utils' prefix)."""


@dataclass
class CustomSeries:
    labels: LabelKey
    buckets: list[float] | None  # histograms: upper bounds, increasing
    value: float = 0.0  # counters and gauges
    total: float = 0.0  # histograms: sum of observations
    count: int = 0  # histograms: number of observations
    bucket_counts: list[int] = field(default_factory=list)  # per bound, not cumulative
    holders: weakref.WeakSet[MetricHolder] = field(default_factory=weakref.WeakSet)  # stubs holding a Metric

    def apply(self, set_to: float | None, delta: float, observations: list[float]) -> None:
        if set_to is not None:
            self.value = float(set_to)
        self.value += delta
        bounds = self.buckets or []
        for observed in observations:
            self.total += observed
            self.count += 1
            index = bisect.bisect_left(bounds, observed)  # the first bound >= value: `le` semantics
            if index < len(bounds):
                self.bucket_counts[index] += 1


@dataclass
class CustomFamily:
    name: str
    description: str
    kind: int
    series: dict[LabelKey, CustomSeries] = field(default_factory=dict)


def _key(labels: dict[str, str]) -> LabelKey:
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


class CustomMetrics:
    """The registry. Runs on the event loop only (stub frames and scrapes), so it needs no lock."""

    def __init__(self) -> None:
        self._families: dict[str, CustomFamily] = {}

    def families(self) -> list[CustomFamily]:
        """Every family, in creation order."""
        return list(self._families.values())

    def create_family(self, name: str, description: str, kind: int) -> None:
        """Register a family or reuse it. Raises CustomMetricError."""
        if kind not in KIND_NAMES:
            raise CustomMetricError(f"Unknown metric kind {kind}")
        if not isinstance(name, str) or not _NAME.match(name) or name.startswith("__"):
            raise CustomMetricError("Invalid metric name")
        if name in SERVER_FAMILIES or name.startswith(RESERVED_PREFIX):
            raise CustomMetricError(f"Metric family name '{name}' is reserved for the server's own metrics")
        family = self._families.get(name)
        if family is None:
            self._families[name] = CustomFamily(name, str(description), kind)
        elif family.kind != kind:
            raise CustomMetricError("Family name already exists with different type")

    def apply(self, holder: MetricHolder, entries: Sequence[Sequence[Any]]) -> None:
        """Apply a stub's MetricOps entries in order. Malformed entries are logged and skipped."""
        for entry in entries:
            try:
                self._apply_one(holder, entry)
            except (TypeError, ValueError, IndexError, KeyError) as exc:
                shown = entry[:3] if isinstance(entry, (list, tuple)) else entry
                log.error("dropped a malformed metric change %r: %s", shown, exc)

    def _apply_one(self, holder: MetricHolder, entry: Sequence[Any]) -> None:
        op, name, labels = entry[0], entry[1], entry[2]
        family = self._families.get(name)
        if family is None:
            raise KeyError(f"no metric family '{name}'")
        key = _key(labels)
        series = family.series.get(key)
        if op == ENTRY_CREATE:
            if series is None:
                series = self._new_series(family, key, entry[3])
            series.holders.add(holder)
        elif op == ENTRY_UPDATE:
            if series is None:  # its creation was refused or lost: keep the change anyway
                series = self._new_series(family, key, None)
            series.apply(entry[3], float(entry[4]), [float(v) for v in entry[5]])
        elif op == ENTRY_DELETE:
            if series is None:
                return
            series.holders.discard(holder)
            if not any(other.alive for other in series.holders):
                del family.series[key]
        else:
            raise ValueError(f"unknown entry kind {op}")

    @staticmethod
    def _new_series(family: CustomFamily, key: LabelKey, buckets: list[float] | None) -> CustomSeries:
        bounds = sorted(float(b) for b in buckets) if family.kind == HISTOGRAM and buckets else None
        if family.kind == HISTOGRAM and bounds is None:
            bounds = []
        series = CustomSeries(key, bounds, bucket_counts=[0] * len(bounds or []))
        family.series[key] = series
        return series

    def value(self, name: str, labels: dict[str, str]) -> float:
        """The value of a counter or gauge series. Raises CustomMetricError."""
        family = self._families.get(name)
        if family is None:
            raise CustomMetricError(f"Metric family '{name}' is not registered")
        series = family.series.get(_key(labels))
        if series is None:
            raise CustomMetricError(f"No metric of family '{name}' has the labels {dict(labels)}")
        return series.value


# One registry per server core (the stubs' context); stubs without one share a default.
_REGISTRIES: weakref.WeakKeyDictionary[StubFacingCore, CustomMetrics] = weakref.WeakKeyDictionary()
_DEFAULT = CustomMetrics()


def registry_for(core: StubFacingCore | None) -> CustomMetrics:
    """The custom metrics of the server whose core is `core`."""
    if core is None:
        return _DEFAULT
    registry = _REGISTRIES.get(core)
    if registry is None:
        registry = _REGISTRIES[core] = CustomMetrics()
    return registry


def _on_family_create(stub: StubProcess, message: MetricFamilyCreate) -> None:
    error = None
    try:
        registry_for(stub.services.core).create_family(message.name, message.description, message.kind)
    except CustomMetricError as exc:
        error = str(exc)
    stub.send_soon(MetricReply(message.token, error, 0.0))  # the stub waits for it, with a deadline


def _on_ops(stub: StubProcess, message: MetricOps) -> None:
    registry_for(stub.services.core).apply(stub, message.entries)


def _on_value_query(stub: StubProcess, message: MetricValueQuery) -> None:
    try:
        reply = MetricReply(message.token, None, registry_for(stub.services.core).value(message.family, message.labels))
    except CustomMetricError as exc:
        reply = MetricReply(message.token, str(exc), 0.0)
    stub.send_soon(reply)


def register(handlers: BackendHandlers) -> None:
    """The frames of pb_utils.MetricFamily / Metric from the stubs."""
    handlers.on_frame(MetricFamilyCreate, _on_family_create)
    handlers.on_frame(MetricOps, _on_ops)
    handlers.on_frame(MetricValueQuery, _on_value_query)
