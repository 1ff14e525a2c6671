"""Latency summaries of `--metrics-config` (Triton 2.51's `summary_latencies`, `summary_quantiles`,
`counter_latencies`), written as Triton prints them:

    # TYPE nv_inference_request_summary_us summary
    nv_inference_request_summary_us_count{model="m",version="1"} 20
    nv_inference_request_summary_us_sum{model="m",version="1"} 254463
    nv_inference_request_summary_us{model="m",version="1",quantile="0.5"} 360
    ... one line per quantile (default 0.5, 0.9, 0.95, 0.99, 0.999), NaN while the window is empty

Quantiles are exact over the requests of the last `_MAX_AGE_S` seconds (prometheus-cpp, hence
Triton, estimates them over a 60 s sliding window), at most `_MAX_SAMPLES` per series so memory
stays bounded under load. `_count` and `_sum` cover every request since load.

`histogram_latencies=true` adds one histogram per series (a pystub addition: Triton 2.51 accepts
the key and prints nothing; later Triton releases name their latency histogram
`nv_inference_first_response_histogram_ms`, so these follow that pattern, `<series>_histogram_us`,
rather than reuse the counters' `_duration_us` names, which a family of another type may not share):

    # TYPE nv_inference_request_histogram_us histogram
    nv_inference_request_histogram_us_bucket{model="m",version="1",le="100"} 3
    ... one bucket per bound of HISTOGRAM_BOUNDS_US, then le="+Inf", _sum and _count

`configure()` is called once at start-up, before models load; a `ModelStatistics` created after
it gets a `LatencyWindow` when summaries or histograms are on (and None otherwise: no cost per
request).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from pystub_backend.backend.telemetry.prometheus_text import TextWriter, escape_label_value, format_value

__all__ = ["LatencyConfig", "LatencyWindow", "parse_config", "configure", "config", "new_window", "summary_lines",
           "histogram_lines", "SUMMARY_FAMILIES", "HISTOGRAM_FAMILIES", "HISTOGRAM_BOUNDS_US"]

_MAX_AGE_S = 60.0
_MAX_SAMPLES = 8192
_DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
_KNOWN = ("counter_latencies", "summary_latencies", "summary_quantiles", "histogram_latencies")

# (series, family, help) in Triton's order and with its help texts.
SUMMARY_FAMILIES = (
    ("request", "nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)"),
    ("queue", "nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)"),
    ("compute_input", "nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("compute_infer", "nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("compute_output", "nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
)

# (series, family, help) of histogram_latencies=true.
HISTOGRAM_FAMILIES = (
    ("request", "nv_inference_request_histogram_us",
     "Histogram of inference request duration in microseconds (includes cached requests)"),
    ("queue", "nv_inference_queue_histogram_us",
     "Histogram of inference queuing duration in microseconds (includes cached requests)"),
    ("compute_input", "nv_inference_compute_input_histogram_us",
     "Histogram of compute input duration in microseconds (does not include cached requests)"),
    ("compute_infer", "nv_inference_compute_infer_histogram_us",
     "Histogram of compute inference duration in microseconds (does not include cached requests)"),
    ("compute_output", "nv_inference_compute_output_histogram_us",
     "Histogram of compute output duration in microseconds (does not include cached requests)"),
)
# From 100 us to 10 s, about three bounds per decade: an HTTP round trip to a Python model is a
# few hundred microseconds, a heavy model seconds.
HISTOGRAM_BOUNDS_US = (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
                       1_000_000, 2_500_000, 5_000_000, 10_000_000)


@dataclass
class LatencyConfig:
    counters: bool = True  # the nv_inference_*_duration_us counters
    summaries: bool = False
    quantiles: tuple[float, ...] = _DEFAULT_QUANTILES
    histograms: bool = False


config = LatencyConfig()


def _flag(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false", "1", "0"):
        raise ValueError(f"--metrics-config {name} expects true or false, got '{text}'")
    return lowered in ("true", "1")


def _quantiles(text: str) -> tuple[float, ...]:
    """Triton's `<quantile>:<error>,...`; the error bound is accepted (quantiles here are exact)."""
    result = []
    for item in text.split(","):
        quantile, colon, error = item.partition(":")
        try:
            value, _ = float(quantile), float(error)
        except ValueError:
            value, colon = -1.0, ""
        if not colon or not 0 <= value <= 1:
            raise ValueError(f"--metrics-config summary_quantiles expects <quantile>:<error>,..., got '{text}'")
        result.append(value)
    return tuple(result)


def parse_config(settings: dict[str, str]) -> tuple[LatencyConfig, list[str]]:
    """--metrics-config settings as a LatencyConfig, and the names of those without effect here.
    Raises ValueError for a malformed value."""
    parsed = LatencyConfig(
        counters=_flag("counter_latencies", settings.get("counter_latencies", "true")),
        summaries=_flag("summary_latencies", settings.get("summary_latencies", "false")),
        quantiles=_quantiles(settings["summary_quantiles"]) if "summary_quantiles" in settings else _DEFAULT_QUANTILES,
        histograms=_flag("histogram_latencies", settings.get("histogram_latencies", "false")))
    return parsed, [name for name in settings if name not in _KNOWN]


def configure(chosen: LatencyConfig) -> None:
    """Install the configuration (once, at start-up, before any model loads)."""
    config.counters, config.summaries, config.quantiles = chosen.counters, chosen.summaries, chosen.quantiles
    config.histograms = chosen.histograms


class LatencyWindow:
    """The recent latencies of one model version, per series, in microseconds."""

    def __init__(self, summaries: bool = True, histograms: bool = False) -> None:
        self._samples = {series: deque[tuple[float, int]](maxlen=_MAX_SAMPLES) for series, _, _ in SUMMARY_FAMILIES}
        self._summaries = summaries
        self.count = dict.fromkeys(self._samples, 0)
        self.sum_us = dict.fromkeys(self._samples, 0)
        # Per bound, not cumulative; the last slot counts what lies above every bound.
        self.buckets = {series: [0] * (len(HISTOGRAM_BOUNDS_US) + 1) for series in self._samples} \
            if histograms else None

    def observe(self, **durations_ns: int) -> None:
        """One successful request: `request=..., queue=..., compute_input=...` in nanoseconds."""
        now = time.monotonic()
        for series, ns in durations_ns.items():
            us = max(0, ns) // 1000
            if self._summaries:
                self._samples[series].append((now, us))
            if self.buckets is not None:  # le semantics: a value equal to a bound falls in that bucket
                self.buckets[series][bisect.bisect_left(HISTOGRAM_BOUNDS_US, us)] += 1
            self.count[series] += 1
            self.sum_us[series] += us

    def quantiles(self, series: str, wanted: tuple[float, ...]) -> list[float]:
        samples = self._samples[series]
        cutoff = time.monotonic() - _MAX_AGE_S
        while samples and samples[0][0] < cutoff:
            samples.popleft()
        values = sorted(us for _, us in samples)
        if not values:
            return [float("nan")] * len(wanted)
        return [float(values[min(len(values) - 1, int(q * len(values)))]) for q in wanted]


def new_window() -> LatencyWindow | None:
    """A window for a new model version when summaries or histograms are on, else None."""
    if not (config.summaries or config.histograms):
        return None
    return LatencyWindow(config.summaries, config.histograms)


def summary_lines(rows: list[tuple[str, str, LatencyWindow]]) -> Iterator[str]:
    """The summary families for `(model, version, window)` rows, as Triton writes them."""
    if not config.summaries:
        return
    for series, family, help_text in SUMMARY_FAMILIES:
        yield f"# HELP {family} {help_text}"
        yield f"# TYPE {family} summary"
        for model, version, window in rows:
            labels = f'model="{escape_label_value(model)}",version="{escape_label_value(version)}"'
            yield f"{family}_count{{{labels}}} {window.count[series]}"
            yield f"{family}_sum{{{labels}}} {window.sum_us[series]}"
            for quantile, value in zip(config.quantiles, window.quantiles(series, config.quantiles), strict=True):
                shown = format_value(int(value)) if value == value else "NaN"
                yield f'{family}{{{labels},quantile="{format_value(quantile)}"}} {shown}'


def histogram_lines(rows: list[tuple[str, str, LatencyWindow]]) -> Iterator[str]:
    """The histogram families (histogram_latencies=true) for `(model, version, window)` rows."""
    if not config.histograms:
        return
    writer = TextWriter()
    for series, family, help_text in HISTOGRAM_FAMILIES:
        writer.family(family, "histogram", help_text)
        for model, version, window in rows:
            if window.buckets is not None:
                writer.histogram(family, [("model", model), ("version", version)], HISTOGRAM_BOUNDS_US,
                                 window.buckets[series][:-1], window.sum_us[series], window.count[series])
    yield from writer.text().splitlines()
