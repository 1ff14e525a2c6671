"""pb_utils.MetricFamily / Metric (docs/reference/model-api.md#custom-metrics): local semantics, errors, reporter
hook."""

from __future__ import annotations

import gc
import itertools

import pytest

from pystub_backend.stub.pb_utils import MetricFamily, TritonModelException, _runtime

FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
    "object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)
_names = itertools.count()


@pytest.fixture(autouse=True)
def _reset_runtime():
    yield
    _runtime.set_metric_reporter(None)


def _family(kind, prefix="pb_utils_test"):
    # The registry outlives family objects (as the server's does), so every test uses new names.
    return MetricFamily(f"{prefix}_{next(_names)}", "a test family", kind)


def _raises(call, text):
    with pytest.raises(TritonModelException) as exc:
        call()
    assert str(exc.value) == text


def test_counter():
    family = _family(MetricFamily.COUNTER)  # must outlive its metrics
    metric = family.Metric(labels={"model": "m"})
    assert metric.value() == 0.0
    metric.increment(2)
    metric.increment(0.5)
    assert metric.value() == 2.5
    _raises(lambda: metric.increment(-1),
            "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
            "monotonically by non-negative values.")
    _raises(lambda: metric.set(1), "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set")
    _raises(lambda: metric.observe(1),
            "Failed to observe metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Observe")
    assert metric.value() == 2.5


def test_gauge():
    family = _family(MetricFamily.GAUGE)
    metric = family.Metric()
    metric.set(10)
    metric.increment(-3)
    metric.increment(1.5)
    assert metric.value() == 8.5
    _raises(lambda: metric.observe(1),
            "Failed to observe metric value: TRITONSERVER_METRIC_KIND_GAUGE does not support Observe")


def test_histogram():
    family = _family(MetricFamily.HISTOGRAM)
    metric = family.Metric(labels={}, buckets=[1, 2.5, 10])
    for value in (0.5, 1, 2, 3, 100):
        metric.observe(value)
    assert metric._snapshot() == {"sum": 106.5, "count": 5, "buckets": {1.0: 2, 2.5: 3, 10.0: 4}}
    _raises(lambda: metric.increment(1),
            "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
    _raises(lambda: metric.set(1),
            "Failed to set metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set")
    _raises(metric.value, "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")


def test_metric_creation_errors():
    counter = _family(MetricFamily.COUNTER)
    histogram = _family(MetricFamily.HISTOGRAM)
    _raises(lambda: counter.Metric(labels=["a"]), "Failed to create metric. Labels must be a dictionary.")
    _raises(lambda: counter.Metric(labels={"a": 1}), "Error when creating Metric: Failed to process the request for "
            "model '', message: attempt to access JSON non-string as string")
    _raises(lambda: histogram.Metric(buckets=(1, 2)), "Failed to create metric. Buckets must be a list.")
    _raises(lambda: histogram.Metric(), "Failed to create metric. Missing required buckets.")
    _raises(lambda: counter.Metric(buckets=[1.0]), "Failed to create metric. Unexpected buckets found.")
    _raises(lambda: _family(MetricFamily.GAUGE).Metric(buckets=[1.0]),
            "Failed to create metric. Unexpected buckets found.")
    with pytest.raises(RuntimeError, match="^Unable to cast Python instance to C"):
        histogram.Metric(buckets=["a"])
    _raises(lambda: histogram.Metric(buckets=[1, 1, 2]), "Error when creating Metric: Failed to process the request "
            "for model '', message: Bucket Boundaries must be strictly sorted")


def test_family_creation_errors():
    _raises(lambda: MetricFamily("bad name", "d", MetricFamily.COUNTER),
            "Error when creating MetricFamily: Invalid metric name")
    _raises(lambda: MetricFamily("", "d", MetricFamily.COUNTER),
            "Error when creating MetricFamily: Invalid metric name")
    family = _family(MetricFamily.COUNTER)
    _raises(lambda: MetricFamily(family._record.name, "d", MetricFamily.GAUGE),
            "Error when creating MetricFamily: Family name already exists with different type")
    for bad in ((None, "d", MetricFamily.COUNTER), ("n", None, MetricFamily.COUNTER), ("n", "d", 7), ("n", "d", None)):
        with pytest.raises(TypeError):
            MetricFamily(*bad)


def test_same_name_and_kind_shares_the_family_and_labels_share_values():
    first = _family(MetricFamily.COUNTER, "shared")
    second = MetricFamily(first._record.name, "a test family", MetricFamily.COUNTER)
    a = first.Metric(labels={"x": "1"})
    b = second.Metric(labels={"x": "1"})
    c = first.Metric(labels={"x": "2"})
    a.increment(3)
    assert b.value() == 3
    assert c.value() == 0


def test_labelled_series_is_reference_counted():
    family = _family(MetricFamily.GAUGE)
    a = family.Metric(labels={"k": "v"})
    b = family.Metric(labels={"k": "v"})
    a.set(5)
    del a
    gc.collect()
    assert b.value() == 5  # b still holds the series
    del b
    gc.collect()
    assert family.Metric(labels={"k": "v"}).value() == 0  # the series was dropped with its last holder


def test_temporary_family_invalidates_its_metric_at_once():
    metric = _family(MetricFamily.COUNTER).Metric()  # the family object is dropped right away
    _raises(lambda: metric.increment(1), "Failed to increment metric value: " + FAMILY_DELETED)


def test_metric_after_family_deleted():
    family = _family(MetricFamily.GAUGE)
    metric = family.Metric(labels={"a": "b"})
    del family
    gc.collect()
    _raises(lambda: metric.set(1), "Failed to set metric value: " + FAMILY_DELETED)
    _raises(lambda: metric.increment(1), "Failed to increment metric value: " + FAMILY_DELETED)
    _raises(metric.value, "Failed to get metric value: " + FAMILY_DELETED)
    histogram = _family(MetricFamily.HISTOGRAM)
    observed = histogram.Metric(buckets=[1.0])
    del histogram
    gc.collect()
    _raises(lambda: observed.observe(1), "Failed to observe metric value: " + FAMILY_DELETED)


def test_values_must_be_numbers():
    family = _family(MetricFamily.GAUGE)
    metric = family.Metric()
    with pytest.raises(TypeError):
        metric.set("1")
    with pytest.raises(TypeError):
        metric.set(None)


def test_metrics_cannot_be_built_directly():
    from pystub_backend.stub.pb_utils import Metric
    with pytest.raises(TypeError):
        Metric()


def test_reporter_sees_every_change():
    events = []

    class Reporter:
        def family_created(self, name, description, kind):
            events.append(("family", name, description, kind))

        def metric_created(self, family, labels, buckets):
            events.append(("metric", family, labels, buckets))

        def metric_operation(self, family, labels, op, value):
            events.append(("op", family, labels, op, value))

        def metric_deleted(self, family, labels):
            events.append(("deleted", family, labels))

    gc.collect()  # metrics earlier tests left unreachable would report their deletion here
    _runtime.set_metric_reporter(Reporter())
    family = _family(MetricFamily.HISTOGRAM, "reported")
    name = family._record.name
    metric = family.Metric(labels={"l": "v"}, buckets=[1, 2])
    metric.observe(1.5)
    del metric
    gc.collect()
    assert events == [
        ("family", name, "a test family", 2),
        ("metric", name, {"l": "v"}, [1.0, 2.0]),
        ("op", name, {"l": "v"}, "observe", 1.5),
        ("deleted", name, {"l": "v"}),
    ]


def test_reporter_failure_surfaces_with_the_operation_prefix():
    class Reporter:
        def metric_operation(self, family, labels, op, value):
            raise RuntimeError("server said no")

    family = _family(MetricFamily.COUNTER)
    metric = family.Metric()
    _runtime.set_metric_reporter(Reporter())  # methods it lacks are skipped
    _raises(lambda: metric.increment(1), "Failed to increment metric value: server said no")
