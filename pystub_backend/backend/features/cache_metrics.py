"""The response cache's families on `/metrics`, with Triton 2.51's names, help texts and order.

    nv_cache_num_hits_per_model {model, version}      counter, after nv_inference_compute_output_*
    nv_cache_hit_duration_per_model                   counter, microseconds
    nv_cache_num_misses_per_model                     counter
    nv_cache_miss_duration_per_model                  counter, microseconds (lookup + insertion)
    nv_cache_util, nv_cache_num_entries, ...          gauges of the server's cache, after the CPU gauges

Triton prints the per-model counters for every model whose config enables the cache, configured or
not, and the server gauges only when a cache is configured. It leaves the server gauges other than
`nv_cache_util` at 0 (a leftover of its older cache); pystub reports their real values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pystub_backend.backend.features.response_cache import ResponseCache, cache_enabled
from pystub_backend.backend.telemetry.prometheus_text import TextWriter
from pystub_backend.backend.telemetry.statistics import ModelStatistics

__all__ = ["write_model_cache_families", "write_cache_gauges"]

_PER_MODEL: tuple[tuple[str, str, Callable[[ModelStatistics], int]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s.cache_hit.count),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda s: s.cache_hit.ns // 1000),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: s.cache_miss.count),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.cache_miss.ns // 1000),
)

_GAUGES: tuple[tuple[str, str, Callable[[ResponseCache], float | int]], ...] = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", lambda c: float(c.utilization)),
    ("nv_cache_num_entries", "Number of responses stored in response cache", lambda c: c.entries),
    ("nv_cache_num_hits", "Number of cache hits in response cache", lambda c: c.hits),
    ("nv_cache_num_misses", "Number of cache misses in response cache", lambda c: c.misses),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", lambda c: c.hits + c.misses),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache", lambda c: c.evictions),
    ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
     lambda c: c.lookup_ns // 1000),
    ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
     lambda c: c.insertion_ns // 1000),
)


def write_model_cache_families(writer: TextWriter, versions: list[Any]) -> None:
    """The per-model counters of every version whose config enables the cache (none: no family)."""
    cached = [version for version in versions if cache_enabled(version.config)]
    if not cached:
        return
    for name, help_text, value in _PER_MODEL:
        writer.family(name, "counter", help_text)
        for version in cached:
            writer.sample(name, [("model", version.name), ("version", str(version.version))], value(version.stats))


def write_cache_gauges(writer: TextWriter, cache: ResponseCache | None) -> None:
    """The server cache's gauges, when there is one."""
    if cache is None:
        return
    for name, help_text, value in _GAUGES:
        writer.family(name, "gauge", help_text)
        writer.sample(name, [], value(cache))
