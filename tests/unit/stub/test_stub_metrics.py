"""pystub_backend.stub.features.metrics: the stub's reporter buffers metric changes, in order, and flushes them before
any other frame; waiting calls get the server's answer. The "server" here is a real
pystub_backend.backend.features.custom_metrics registry behind a fake send."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest

from pystub_backend.backend.features.custom_metrics import CustomMetricError, CustomMetrics
from pystub_backend.ipc.messages.metrics import (
    ENTRY_CREATE,
    ENTRY_UPDATE,
    MetricFamilyCreate,
    MetricOps,
    MetricReply,
    MetricValueQuery,
)
from pystub_backend.stub.features import metrics as stub_metrics
from pystub_backend.stub.features.metrics import MAX_OBSERVATIONS, MetricsError, MetricsReporter
from pystub_backend.stub.pb_utils import MetricFamily, TritonModelException, _runtime

_names = itertools.count()


class FakeServer:
    """Records every frame and answers waiting calls from a registry, on another thread."""

    def __init__(self) -> None:
        self.registry = CustomMetrics()
        self.frames: list[Any] = []
        self.reporter: MetricsReporter | None = None
        self.holder = type("Holder", (), {"alive": True})()

    def send(self, message: Any) -> None:
        if not isinstance(message, MetricOps) and self.reporter is not None and self.reporter.pending:
            self.reporter.flush()  # what the stub's before-send hook does
        self.frames.append(message)
        if isinstance(message, MetricOps):
            self.registry.apply(self.holder, message.entries)
        elif isinstance(message, (MetricFamilyCreate, MetricValueQuery)):
            threading.Thread(target=self._answer, args=(message,)).start()

    def _answer(self, message: Any) -> None:
        assert self.reporter is not None
        try:
            if isinstance(message, MetricFamilyCreate):
                self.registry.create_family(message.name, message.description, message.kind)
                reply = MetricReply(message.token, None, 0.0)
            else:
                reply = MetricReply(message.token, None, self.registry.value(message.family, message.labels))
        except CustomMetricError as exc:
            reply = MetricReply(message.token, str(exc), 0.0)
        self.reporter.on_reply(reply)


@pytest.fixture
def server() -> Any:
    fake = FakeServer()
    fake.reporter = MetricsReporter(fake.send, timeout=5.0)
    _runtime.set_metric_reporter(fake.reporter)
    yield fake
    _runtime.set_metric_reporter(None)


def name(prefix: str = "stub_metrics_test") -> str:
    return f"{prefix}_{next(_names)}"


def ops_frames(server: FakeServer) -> list[MetricOps]:
    return [f for f in server.frames if isinstance(f, MetricOps)]


def test_changes_are_aggregated_per_series_and_sent_before_the_next_frame(server: FakeServer) -> None:
    family = MetricFamily(name(), "help", MetricFamily.GAUGE)
    gauge = family.Metric(labels={"b": "2", "a": "1"})
    (created,) = ops_frames(server)  # a new series reaches the server before Metric() returns
    assert [entry[0] for entry in created.entries] == [ENTRY_CREATE]
    assert server.registry.value(family._record.name, {"a": "1", "b": "2"}) == 0.0
    for _ in range(1000):
        gauge.increment(1)
    gauge.set(5)
    gauge.increment(2)
    assert ops_frames(server) == [created]  # the changes are buffered
    server.send("a response")  # any other frame flushes first
    (_, frame) = ops_frames(server)
    assert [entry[0] for entry in frame.entries] == [ENTRY_UPDATE]
    assert list(frame.entries[0][3:]) == [5.0, 2.0, []]  # set to 5, then +2: the 1000 increments collapsed
    assert server.frames[-1] == "a response"
    assert gauge.value() == 7.0  # read back from the server


def test_value_reads_the_servers_value(server: FakeServer) -> None:
    family = MetricFamily(name(), "help", MetricFamily.COUNTER)
    counter = family.Metric(labels={"m": "x"})
    counter.increment(3)
    server.registry.apply(object(), [[ENTRY_UPDATE, family._record.name, {"m": "x"}, None, 10.0, []]])
    assert counter.value() == 13.0  # changes made elsewhere (an earlier stub, another instance)


def test_a_kind_conflict_with_another_process_fails_creation(server: FakeServer) -> None:
    shared = name()
    server.registry.create_family(shared, "someone else's", MetricFamily.COUNTER)
    with pytest.raises(TritonModelException,
                       match="^Error when creating MetricFamily: Family name already exists with different type$"):
        MetricFamily(shared, "mine", MetricFamily.GAUGE)
    MetricFamily(shared, "mine", MetricFamily.COUNTER)  # the refused attempt left nothing behind


def test_invalid_label_names_fail_creation(server: FakeServer) -> None:
    family = MetricFamily(name(), "help", MetricFamily.HISTOGRAM)
    with pytest.raises(TritonModelException, match=r"^Failed to create metric. Invalid label name '0x'.$"):
        family.Metric(labels={"0x": "v"}, buckets=[1.0])
    with pytest.raises(TritonModelException, match="^Failed to create metric. Label name 'le' is reserved"):
        family.Metric(labels={"le": "v"}, buckets=[1.0])


def test_many_observations_flush_on_their_own(server: FakeServer) -> None:
    family = MetricFamily(name(), "help", MetricFamily.HISTOGRAM)
    histogram = family.Metric(buckets=[1.0])
    created = len(ops_frames(server))
    for value in range(MAX_OBSERVATIONS + 10):
        histogram.observe(value % 3)
    assert len(ops_frames(server)) == created + 1  # the threshold sent one frame, the rest waits
    server.reporter.flush()
    (series,) = next(f for f in server.registry.families() if f.name == family._record.name).series.values()
    assert series.count == MAX_OBSERVATIONS + 10


def test_the_flusher_sends_changes_made_outside_any_frame(server: FakeServer) -> None:
    family = MetricFamily(name(), "help", MetricFamily.COUNTER)
    counter = family.Metric()
    created = len(ops_frames(server))
    thread = threading.Thread(target=server.reporter.run_flusher, daemon=True)
    thread.start()
    counter.increment(4)
    for _ in range(200):
        if len(ops_frames(server)) > created:
            break
        threading.Event().wait(0.01)
    server.reporter.close()
    thread.join(5)
    assert len(ops_frames(server)) > created and server.registry.value(family._record.name, {}) == 4.0


def test_an_unanswered_call_times_out_with_what_it_waited_for() -> None:
    reporter = MetricsReporter(lambda message: None, timeout=0.05)
    with pytest.raises(MetricsError, match="timed out after 0.05 s waiting for the server to answer the creation "
                                           "of metric family 'x'"):
        reporter.family_created("x", "help", 0)


def test_the_before_send_hook_is_registered() -> None:
    from pystub_backend.stub.handlers import StubHandlers
    handlers = StubHandlers()
    stub_metrics.register(handlers)
    assert stub_metrics._flush_before in handlers.send_hooks()
