"""Per-model metrics of the OpenAI-compatible API (frontends/openai), on the metrics port:

    pystub_openai_requests_total{model,endpoint}             requests that named the model
    pystub_openai_request_failures_total{model,endpoint}     of those, answered with an error
    pystub_openai_time_to_first_token_seconds{model}         histogram: request received -> first text sent
    pystub_openai_inter_token_latency_seconds{model}         histogram: between two text chunks of a stream

The requests also count in the v2 families (nv_inference_*), as every request the core serves.
A frontend observes through `token_metrics_for(core)`; the metrics page renders `lines()`.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Iterator
from typing import Any

from pystub_backend.backend.telemetry.prometheus_text import TextWriter

__all__ = ["TokenMetrics", "token_metrics_for", "TTFT_BOUNDS_S", "ITL_BOUNDS_S"]

TTFT_BOUNDS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bound, not cumulative; the last is above every bound
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds
        self.count += 1


class TokenMetrics:
    """The counters and histograms of one server, keyed by model (and endpoint)."""

    def __init__(self) -> None:
        self._requests: dict[tuple[str, str], int] = {}
        self._failures: dict[tuple[str, str], int] = {}
        self._ttft: dict[str, _Histogram] = {}
        self._itl: dict[str, _Histogram] = {}

    def request(self, model: str, endpoint: str, failed: bool) -> None:
        key = (model, endpoint)
        self._requests[key] = self._requests.get(key, 0) + 1
        if failed:
            self._failures[key] = self._failures.get(key, 0) + 1

    def first_token(self, model: str, seconds: float) -> None:
        self._histogram(self._ttft, model, TTFT_BOUNDS_S).observe(seconds)

    def between_tokens(self, model: str, seconds: float) -> None:
        self._histogram(self._itl, model, ITL_BOUNDS_S).observe(seconds)

    @staticmethod
    def _histogram(table: dict[str, _Histogram], model: str, bounds: tuple[float, ...]) -> _Histogram:
        found = table.get(model)
        if found is None:
            found = table[model] = _Histogram(bounds)
        return found

    def forget(self, known_models: set[str]) -> None:
        """Drop the series of models no longer served (an unknown name asked for is never kept)."""
        for table in (self._requests, self._failures):
            for key in [key for key in table if key[0] not in known_models]:
                del table[key]
        for histograms in (self._ttft, self._itl):
            for model in [model for model in histograms if model not in known_models]:
                del histograms[model]

    def lines(self) -> Iterator[str]:
        """The families in Prometheus text; nothing before the first OpenAI request."""
        if not self._requests:
            return
        writer = TextWriter()
        for name, table, help_text in (
                ("pystub_openai_requests_total", self._requests, "Requests of the OpenAI-compatible API per model"),
                ("pystub_openai_request_failures_total", self._failures,
                 "Requests of the OpenAI-compatible API answered with an error")):
            writer.family(name, "counter", help_text)
            for (model, endpoint), value in sorted(table.items()):
                writer.sample(name, [("model", model), ("endpoint", endpoint)], value)
        for name, histograms, help_text in (
                ("pystub_openai_time_to_first_token_seconds", self._ttft,
                 "Seconds from receiving a generation request to sending its first text"),
                ("pystub_openai_inter_token_latency_seconds", self._itl,
                 "Seconds between two text chunks of a streamed generation")):
            writer.family(name, "histogram", help_text)
            for model, histogram in sorted(histograms.items()):
                writer.histogram(name, [("model", model)], histogram.bounds, histogram.counts[:-1], histogram.total,
                                 histogram.count)
        yield from writer.text().splitlines()


_REGISTRIES: weakref.WeakKeyDictionary[Any, TokenMetrics] = weakref.WeakKeyDictionary()


def token_metrics_for(core: Any) -> TokenMetrics:
    """The token metrics of the server whose core is `core`."""
    found = _REGISTRIES.get(core)
    if found is None:
        found = _REGISTRIES[core] = TokenMetrics()
    return found
