"""pystub_backend.backend.features.custom_metrics: the server-wide registry of custom metrics, and the restart rule."""

from __future__ import annotations

import pytest

from pystub_backend.backend.features.custom_metrics import COUNTER, GAUGE, HISTOGRAM, CustomMetricError, CustomMetrics
from pystub_backend.ipc.messages.metrics import ENTRY_CREATE, ENTRY_DELETE, ENTRY_UPDATE


class Holder:
    """Stands in for a StubProcess: the registry only asks whether it is alive."""

    def __init__(self) -> None:
        self.alive = True


def create(family: str, labels: dict[str, str], buckets: list[float] | None = None) -> list:
    return [ENTRY_CREATE, family, labels, buckets]


def update(family: str, labels: dict[str, str], set_to: float | None = None, delta: float = 0.0,
           observations: list[float] | None = None) -> list:
    return [ENTRY_UPDATE, family, labels, set_to, delta, observations or []]


def delete(family: str, labels: dict[str, str]) -> list:
    return [ENTRY_DELETE, family, labels]


def series(registry: CustomMetrics, family: str) -> dict:
    found = next(f for f in registry.families() if f.name == family)
    return {labels: s for labels, s in found.series.items()}


def test_families_are_server_wide_by_name_and_kind() -> None:
    registry = CustomMetrics()
    registry.create_family("requests", "help", COUNTER)
    registry.create_family("requests", "other help", COUNTER)  # reused, first description wins
    assert [(f.name, f.description, f.kind) for f in registry.families()] == [("requests", "help", COUNTER)]
    with pytest.raises(CustomMetricError, match="^Family name already exists with different type$"):
        registry.create_family("requests", "help", GAUGE)
    for name in ("nv_inference_count", "pystub_stub_up", "pystub_anything"):
        with pytest.raises(CustomMetricError, match="reserved for the server's own metrics"):
            registry.create_family(name, "help", COUNTER)
    with pytest.raises(CustomMetricError, match="Invalid metric name"):
        registry.create_family("bad name", "help", COUNTER)
    with pytest.raises(CustomMetricError, match="Unknown metric kind 9"):
        registry.create_family("x", "help", 9)


def test_changes_apply_in_order_and_series_are_shared() -> None:
    registry = CustomMetrics()
    registry.create_family("g", "help", GAUGE)
    a, b = Holder(), Holder()
    registry.apply(a, [create("g", {"k": "1", "j": "2"}), update("g", {"j": "2", "k": "1"}, delta=2.0),
                       update("g", {"k": "1", "j": "2"}, set_to=10.0, delta=-1.5)])
    registry.apply(b, [create("g", {"j": "2", "k": "1"}), update("g", {"k": "1", "j": "2"}, delta=1.0)])
    assert registry.value("g", {"k": "1", "j": "2"}) == 9.5  # one series, whatever the label order
    with pytest.raises(CustomMetricError, match="No metric of family 'g' has the labels"):
        registry.value("g", {"k": "2"})
    with pytest.raises(CustomMetricError, match="Metric family 'h' is not registered"):
        registry.value("h", {})


def test_histograms_bin_with_le_semantics() -> None:
    registry = CustomMetrics()
    registry.create_family("h", "help", HISTOGRAM)
    registry.apply(Holder(), [create("h", {}, [1.0, 2.0]), update("h", {}, observations=[0.5, 1.0, 1.5, 2.0, 7.0])])
    (only,) = series(registry, "h").values()
    assert only.bucket_counts == [2, 2] and only.count == 5 and only.total == 12.0


def test_a_series_goes_when_its_last_live_holder_drops_it() -> None:
    registry = CustomMetrics()
    registry.create_family("c", "help", COUNTER)
    a, b = Holder(), Holder()
    registry.apply(a, [create("c", {}), update("c", {}, delta=1.0)])
    registry.apply(b, [create("c", {})])
    registry.apply(a, [delete("c", {})])
    assert registry.value("c", {}) == 1.0  # b still holds it
    registry.apply(b, [delete("c", {})])
    assert series(registry, "c") == {}
    assert [f.name for f in registry.families()] == ["c"]  # families stay
    registry.apply(a, [delete("c", {})])  # deleting what is gone is harmless


def test_a_dead_holder_leaves_its_series_and_a_new_one_continues() -> None:
    registry = CustomMetrics()
    registry.create_family("c", "help", COUNTER)
    old = Holder()
    registry.apply(old, [create("c", {"m": "x"}), update("c", {"m": "x"}, delta=5.0)])
    old.alive = False  # killed: it never said goodbye
    assert registry.value("c", {"m": "x"}) == 5.0
    new = Holder()
    registry.apply(new, [create("c", {"m": "x"}), update("c", {"m": "x"}, delta=1.0)])
    assert registry.value("c", {"m": "x"}) == 6.0
    registry.apply(new, [delete("c", {"m": "x"})])  # the only live holder lets go
    assert series(registry, "c") == {}


def test_malformed_entries_are_dropped_alone(caplog: pytest.LogCaptureFixture) -> None:
    registry = CustomMetrics()
    registry.create_family("c", "help", COUNTER)
    registry.apply(Holder(), [update("nope", {}, delta=1.0), [7, "c", {}], update("c", {}, delta=2.0)])
    assert registry.value("c", {}) == 2.0
    assert sum("malformed metric change" in r.message for r in caplog.records) == 2
