"""--trace-config parsing, the settings store's update rules, sampling, and traceparent parsing.

The texts and shapes are Triton 2.51's (the settings endpoints are compared with the real server in
tests/differential/test_trace_settings.py; spans are checked end to end in tests/integration/test_tracing.py).
"""

from __future__ import annotations

import pytest

from pystub_backend.backend.arguments import parse_args
from pystub_backend.backend.telemetry.tracing import Tracer, TraceSettingError, parse_trace_config
from pystub_backend.backend.telemetry.tracing.settings import TraceConfigError
from pystub_backend.backend.telemetry.tracing.spans import RequestTrace, context_of, parse_traceparent


def test_trace_config_entries() -> None:
    config = parse_trace_config(["mode=opentelemetry", "rate=5", "count=9", "level=TIMESTAMPS", "level=TENSORS",
                                 "opentelemetry,url=http://127.0.0.1:9/v1/traces",
                                 "opentelemetry,resource=service.name=a", "opentelemetry,resource=b=c=d",
                                 "opentelemetry,bsp_schedule_delay=20", "triton,file=/tmp/t.json",
                                 "triton,log-frequency=3"])
    assert (config.mode, config.rate, config.count, config.level) == ("opentelemetry", 5, 9, ("TIMESTAMPS", "TENSORS"))
    assert config.url == "http://127.0.0.1:9/v1/traces" and config.resource == (("service.name", "a"), ("b", "c=d"))
    assert (config.bsp_schedule_delay_ms, config.file, config.log_frequency) == (20, "/tmp/t.json", 3)


@pytest.mark.parametrize("entry, text", [
    ("opentelemetry", "No trace mode specified. --trace-config option format is '<trace mode>,<setting>=<value>'. "
                      "Got opentelemetry"),
    ("speed=3", 'Bad option: "--trace-config speed"'),
    ("triton,url=x", 'Bad option: "--trace-config triton,url"'),
    ("level=LOUD", "--trace-config level: expected one of OFF, TIMESTAMPS, TENSORS, got 'LOUD'"),
    ("rate=0", "--trace-config rate: expected a number >= 1, got '0'"),
    ("count=-2", "--trace-config count: expected a number >= -1, got '-2'"),
    ("mode=jaeger", "--trace-config mode: expected one of triton, opentelemetry, got 'jaeger'"),
])
def test_bad_trace_config(entry: str, text: str) -> None:
    with pytest.raises(TraceConfigError) as info:
        parse_trace_config([entry])
    assert str(info.value) == text


def test_trace_config_overrides_the_deprecated_flags() -> None:
    options = parse_args(["--model-repository=/m", "--trace-level=TENSORS", "--trace-rate=5", "--trace-count=7",
                          "--trace-config", "rate=9", "--trace-config", "level=TIMESTAMPS"])
    assert (options.trace.level, options.trace.rate, options.trace.count) == (("TIMESTAMPS",), 9, 7)
    assert options.deprecated == ["level", "rate", "count"] and options.ignored == []


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-repository=/m", "--trace-config", "rate=abc"])
    assert info.value.code == 2
    assert "--trace-config rate: expected a whole number, got 'abc'" in capsys.readouterr().err


def test_model_settings_fall_back_to_global_and_clear() -> None:
    tracer = Tracer(parse_trace_config(["rate=10"]))
    assert tracer.update({"trace_rate": "3"}, "m")["trace_rate"] == "3"
    assert tracer.settings.as_json()["trace_rate"] == "10"
    tracer.update({"trace_count": "4"})  # global: the model follows for what it did not set
    assert tracer.settings.as_json("m")["trace_count"] == "4"
    assert tracer.update({"trace_rate": None}, "m")["trace_rate"] == "10"
    assert tracer.update({"trace_rate": "7", "trace_count": None})["trace_count"] == "-1"
    assert tracer.update({"trace_rate": None})["trace_rate"] == "10"  # the start-up value


@pytest.mark.parametrize("body, status, text", [
    ({"trace_file": "x"}, 501, "trace file location can not be updated through network protocol"),
    ({"trace_level": "TIMESTAMPS"}, 500, "attempt to access JSON non-array as array"),
    ({"trace_level": ["LOUD"]}, 400, "Unable to parse 'trace_level', got: LOUD"),
    ({"trace_rate": "0"}, 400, "Unable to parse 'trace_rate'. Expecting value >= 1, got:0"),
    ({"trace_rate": "5", "trace_count": "x"}, 400, "Unable to parse 'trace_count', got: x"),
])
def test_refused_updates_change_nothing(body: dict[str, object], status: int, text: str) -> None:
    tracer = Tracer()
    before = tracer.settings.as_json()
    with pytest.raises(TraceSettingError) as info:
        tracer.update(body)
    assert (info.value.status, str(info.value)) == (status, text)
    assert tracer.settings.as_json() == before


class _Sink:
    def __init__(self) -> None:
        self.traces: list[RequestTrace] = []

    def export(self, trace: RequestTrace) -> None:
        self.traces.append(trace)

    def shutdown(self, timeout: float = 0) -> None:
        pass


def test_sampling_rate_count_and_level() -> None:
    sink = _Sink()
    tracer = Tracer(parse_trace_config(["mode=opentelemetry", "level=TIMESTAMPS", "rate=3", "count=2"]),
                    sink)  # type: ignore[arg-type]
    sampled = [tracer.start("m", "HTTP") is not None for _ in range(12)]
    assert sampled == [False, False, True, False, False, True] + [False] * 6
    tracer.update({"trace_level": ["OFF"], "trace_count": "-1"})
    assert not tracer.active and tracer.start("m", "HTTP") is None
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, "other")  # a model of its own
    assert tracer.active and tracer.start("m", "HTTP") is None and tracer.start("other", "HTTP") is not None


def test_spans_wait_for_the_execute_and_carry_the_context() -> None:
    sink = _Sink()
    tracer = Tracer(parse_trace_config(["mode=opentelemetry", "level=TIMESTAMPS", "rate=1"]),
                    sink)  # type: ignore[arg-type]
    trace = tracer.start("m", "HTTP", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    assert trace is not None
    trace.received(1, 2)
    trace.request_start(3)
    trace.computing("1", 4, 5)
    trace.finish()  # the response went out before EXECUTE_DONE
    assert sink.traces == []
    trace.computed(6, 9)
    (exported,) = sink.traces
    root, model, compute = exported.records()
    assert root.parent_span_id == bytes.fromhex("b7ad6b7169203331") and model.parent_span_id == root.span_id
    assert compute.parent_span_id == model.span_id and model.end_ns >= compute.end_ns
    child = tracer.child(trace.context(), "leaf")  # the stub hands the context back with a BLS call
    assert child is not None and child.trace_id == trace.trace_id and child.parent_triton_id == 0  # parent ended
    assert context_of(trace.context()) == (trace.trace_id, trace.model_span_id)


def test_a_wait_in_the_stubs_queue_starts_the_compute_later() -> None:
    """A batch sent while the stub ran the one before: the wait is queue time (as the statistics)."""
    sink = _Sink()
    tracer = Tracer(parse_trace_config(["mode=opentelemetry", "level=TIMESTAMPS", "rate=1"]),
                    sink)  # type: ignore[arg-type]
    trace = tracer.start("m", "HTTP")
    assert trace is not None
    trace.request_start(1)
    trace.computing("1", 2, 3)
    trace.computed(4, 20, waited_ns=10)  # staged at 4, waited until 14, returned at 20
    trace.finish()
    (exported,) = sink.traces
    compute = exported.records()[-1]
    origin = compute.events[0][1] - 13  # exported on the wall clock: the monotonic times plus an offset
    assert [(name, at - origin) for name, at in compute.events] == [
        ("COMPUTE_START", 13), ("COMPUTE_INPUT_END", 14), ("COMPUTE_OUTPUT_START", 20), ("COMPUTE_END", 20)]


@pytest.mark.parametrize("value", [None, "", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
                                   "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                                   "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                                   "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"])
def test_bad_traceparent_is_ignored(value: str | None) -> None:
    assert parse_traceparent(value) is None
