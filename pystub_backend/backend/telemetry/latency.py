"""Latency summaries of `--metrics-config` (Triton 2.51's `summary_latencies`, `summary_quantiles`,
`counter_latencies`), written as Triton prints them:

    # TYPE nv_inference_request_summary_us summary
    nv_inference_request_summary_us_count{model="m",version="1"} 20
    nv_inference_request_summary_us_sum{model="m",version="1"} 254463
    nv_inference_request_summary_us{model="m",version="1",quantile="0.5"} 360
    ... one line per quantile (default 0.5, 0.9, 0.95, 0.99, 0.999), NaN while the window is empty

Quantiles are exact over the requests of the last `_MAX_AGE_S` seconds (prometheus-cpp, hence
Triton, estimates them over a 60 s sliding window), at most `_MAX_SAMPLES` per series so memory
stays bounded under load. `_count` and `_sum` cover every request since load. Triton 2.51 has no
latency histograms: `histogram_latencies` is accepted and has no effect, as there.

`configure()` is called once at start-up, before models load; a `ModelStatistics` created after
it gets a `LatencyWindow` when summaries are on (and None otherwise: no cost per request).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from pystub_backend.backend.telemetry.prometheus_text import escape_label_value, format_value

__all__ = ["LatencyConfig", "LatencyWindow", "parse_config", "configure", "config", "new_window", "summary_lines",
           "SUMMARY_FAMILIES"]

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


@dataclass
class LatencyConfig:
    counters: bool = True  # the nv_inference_*_duration_us counters
    summaries: bool = False
    quantiles: tuple[float, ...] = _DEFAULT_QUANTILES


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
        quantiles=_quantiles(settings["summary_quantiles"]) if "summary_quantiles" in settings else _DEFAULT_QUANTILES)
    if "histogram_latencies" in settings:
        _flag("histogram_latencies", settings["histogram_latencies"])
    return parsed, [name for name in settings if name not in _KNOWN or name == "histogram_latencies"]


def configure(chosen: LatencyConfig) -> None:
    """Install the configuration (once, at start-up, before any model loads)."""
    config.counters, config.summaries, config.quantiles = chosen.counters, chosen.summaries, chosen.quantiles


class LatencyWindow:
    """The recent latencies of one model version, per series, in microseconds."""

    def __init__(self) -> None:
        self._samples = {series: deque[tuple[float, int]](maxlen=_MAX_SAMPLES) for series, _, _ in SUMMARY_FAMILIES}
        self.count = dict.fromkeys(self._samples, 0)
        self.sum_us = dict.fromkeys(self._samples, 0)

    def observe(self, **durations_ns: int) -> None:
        """One successful request: `request=..., queue=..., compute_input=...` in nanoseconds."""
        now = time.monotonic()
        for series, ns in durations_ns.items():
            us = max(0, ns) // 1000
            self._samples[series].append((now, us))
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
    """A window for a new model version when summaries are on, else None."""
    return LatencyWindow() if config.summaries else None


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
