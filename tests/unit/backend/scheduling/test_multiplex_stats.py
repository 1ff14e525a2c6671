"""Multiplexing numbers for operators: histogram buckets, the Prometheus lines
(backend/scheduling/multiplex_stats.py), the config parameters (backend/scheduling/multiplex.py) and the stubctl
SUB-MODELS column."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.scheduling.multiplex import multiplex_settings
from pystub_backend.backend.scheduling.multiplex_stats import Histogram, InstanceCounters, multiplex_metric_lines
from pystub_backend.backend.stubctl import format_table


def test_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 7.0):
        histogram.observe(value)
    assert histogram.snapshot() == {"buckets": [[0.1, 2], [1.0, 3], ["+Inf", 4]], "sum": 7.65, "count": 4}


def test_metric_lines_name_every_instance_and_render_histograms() -> None:
    counters = InstanceCounters()
    counters.loads, counters.hits = 3, 10
    counters.load_seconds.observe(0.02)
    stats = {"model": "m", "version": "1", "instances": [{"instance": "m_0", "held": ["a", "b"],
                                                          **counters.snapshot()}]}
    lines = multiplex_metric_lines([stats])
    labels = 'instance="m_0",model="m",version="1"'
    assert f"pystub_multiplexed_models_loaded{{{labels}}} 2" in lines
    assert f"pystub_multiplexed_model_loads_total{{{labels}}} 3" in lines
    assert f"pystub_multiplexed_model_hits_total{{{labels}}} 10" in lines
    assert f'pystub_multiplexed_model_load_duration_seconds_bucket{{{labels},le="0.025"}} 1' in lines
    assert f'pystub_multiplexed_model_load_duration_seconds_bucket{{{labels},le="0.01"}} 0' in lines
    assert f"pystub_multiplexed_model_load_duration_seconds_count{{{labels}}} 1" in lines
    assert "# TYPE pystub_multiplexed_model_unload_duration_seconds histogram" in lines
    assert multiplex_metric_lines([]) == []


def config(**parameters: str) -> model_config_pb2.ModelConfig:
    result = model_config_pb2.ModelConfig(name="m")
    for key, value in parameters.items():
        result.parameters[key].string_value = value
    return result


def test_config_parameters() -> None:
    assert multiplex_settings(config()) is None
    settings = multiplex_settings(config(MAX_MULTIPLEXED_MODELS="3"))
    assert settings is not None and (settings.cap, settings.routing) == (3, "affinity")
    settings = multiplex_settings(config(MAX_MULTIPLEXED_MODELS="3", MULTIPLEX_ROUTING="Random"))
    assert settings is not None and settings.routing == "random"
    assert multiplex_settings(config(MAX_MULTIPLEXED_MODELS="0")) is None  # logged; multiplexing off
    assert multiplex_settings(config(MAX_MULTIPLEXED_MODELS="two")) is None


def test_stubctl_shows_the_sub_models_column_only_when_some_stub_holds_any() -> None:
    row = {"model": "m", "version": "1", "instance": "m_0", "healthy": True, "arena_used_bytes": 0,
           "arena_total_bytes": 0, "multiplexed_models": []}
    assert "SUB-MODELS" not in format_table([row])
    many = [f"customer-{n:03d}" for n in range(10)]  # least recently used first
    table = format_table([{**row, "multiplexed_models": many}])
    assert "SUB-MODELS" in table
    assert "customer-009,customer-008,customer-007(+7)" in table  # most recent first, cut to fit
