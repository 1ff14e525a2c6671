"""Model multiplexing counters and latencies per instance, and their Prometheus form.

Counters live per instance *name*, so they survive the instance's stub restarts (a new stub
starts with an empty cache; the counts go on). `multiplex_metric_lines` renders the stats of
the multiplexed model versions for `GET /metrics`:

    pystub_multiplexed_models_loaded{model,version,instance}             gauge
    pystub_multiplexed_model_{loads,load_failures,unloads,hits,waits}_total{...}   counters
    pystub_multiplexed_model_{load,unload}_duration_seconds{...}         histograms
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from pystub_backend.backend.telemetry.prometheus_text import TextWriter

__all__ = ["LATENCY_BUCKETS", "Histogram", "InstanceCounters", "multiplex_metric_lines"]

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Observations counted into fixed buckets (upper bounds, seconds) plus +Inf."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        """`{"buckets": [[upper bound, cumulative count], ..., ["+Inf", count]], "sum", "count"}`."""
        buckets, total = [], 0
        for bound, count in zip([*self.bounds, "+Inf"], self.counts, strict=True):
            total += count
            buckets.append([bound, total])
        return {"buckets": buckets, "sum": self.sum, "count": self.count}


class InstanceCounters:
    """What one instance's caches did, across its stub incarnations."""

    __slots__ = ("loads", "load_failures", "unloads", "hits", "waits", "load_seconds", "unload_seconds")

    def __init__(self) -> None:
        self.loads = self.load_failures = self.unloads = self.hits = self.waits = 0
        self.load_seconds = Histogram()
        self.unload_seconds = Histogram()

    def snapshot(self) -> dict[str, Any]:
        return {"loads": self.loads, "load_failures": self.load_failures, "unloads": self.unloads,
                "hits": self.hits, "waits": self.waits, "load_seconds": self.load_seconds.snapshot(),
                "unload_seconds": self.unload_seconds.snapshot()}


_COUNTERS = (
    ("loads", "Sub-models loaded by load_multiplexed"),
    ("load_failures", "load_multiplexed calls that raised"),
    ("unloads", "Sub-models evicted from an instance's cache"),
    ("hits", "Sub-model lookups answered from the cache"),
    ("waits", "Sub-model lookups that waited for a load of the same id already in progress"),
)
_HISTOGRAMS = (
    ("load_seconds", "pystub_multiplexed_model_load_duration_seconds", "Time load_multiplexed took"),
    ("unload_seconds", "pystub_multiplexed_model_unload_duration_seconds",
     "Time unload_multiplexed (or dropping the sub-model) took"),
)


def multiplex_metric_lines(all_stats: Iterable[dict[str, Any]]) -> list[str]:
    """Prometheus text lines for the `multiplex_router.multiplex_stats` of each multiplexed model
    version ([] when there is none)."""
    rows = [((("model", stats["model"]), ("version", stats["version"]), ("instance", instance["instance"])), instance)
            for stats in all_stats for instance in stats["instances"]]
    if not rows:
        return []
    writer = TextWriter()
    writer.family("pystub_multiplexed_models_loaded", "gauge", "Sub-models an instance holds now")
    for labels, row in rows:
        writer.sample("pystub_multiplexed_models_loaded", labels, len(row["held"]))
    for key, help_text in _COUNTERS:
        name = f"pystub_multiplexed_model_{key}_total"
        writer.family(name, "counter", help_text)
        for labels, row in rows:
            writer.sample(name, labels, row[key])
    for key, name, help_text in _HISTOGRAMS:
        writer.family(name, "histogram", help_text)
        for labels, row in rows:
            histogram = row[key]
            cumulative = [count for _, count in histogram["buckets"]]
            per_bucket = [cumulative[0]] + [b - a for a, b in zip(cumulative, cumulative[1:], strict=False)]
            writer.histogram(name, labels, LATENCY_BUCKETS, per_bucket[:len(LATENCY_BUCKETS)], histogram["sum"],
                             histogram["count"])
    return writer.text().splitlines()
