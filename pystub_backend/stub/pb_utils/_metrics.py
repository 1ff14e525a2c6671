"""Custom metrics: `MetricFamily` and `Metric` (docs/reference/model-api.md#custom-metrics).

Values are kept here, in the stub, with the server's semantics; when the stub has installed a
metric reporter every change is also forwarded to it, in order, so that `/metrics` shows it, and
`value()` reads the server's value back through it.

Lifetimes follow the server's: families are never removed from the registry (re-creating a name
with the same kind reuses it), metrics with the same labels in one family share one value and
are reference-counted, and a `Metric` holds no reference to its `MetricFamily`, so dropping the
family object invalidates its metrics.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import json
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from . import _runtime
from ._binding import FLOAT, MODULE, STR, Arg, PybindRepr, binding, enum_of
from ._errors import TritonModelException, require_str

__all__ = ["MetricFamily", "Metric", "MetricKind"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)
_lock = threading.Lock()


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_Kind = MetricKind  # for annotations inside MetricFamily, whose own `MetricKind` attribute shadows it


_KIND_NAME = {
    MetricKind.COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER",
    MetricKind.GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
    MetricKind.HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM",
}


@dataclass
class _Series:
    """One labelled time series; shared by every `Metric` object with the same labels."""

    buckets: list[float] | None
    value: float = 0.0
    total: float = 0.0
    count: int = 0
    bucket_counts: list[int] = field(default_factory=list)
    refs: int = 0


@dataclass
class _FamilyRecord:
    name: str
    description: str
    kind: MetricKind
    series: dict[str, _Series] = field(default_factory=dict)


_families: dict[str, _FamilyRecord] = {}


class _Liveness:
    """Shared by a `MetricFamily` object and its metrics; cleared when the family object goes."""

    def __init__(self) -> None:
        self.alive = True


# What pybind11 raises when a bucket bound is not a number (the original converts the list in C++).
_NOT_A_NUMBER = ("Unable to cast Python instance to C++ type (#define PYBIND11_DETAILED_ERROR_MESSAGES or compile in "
                 "debug mode for details)")
_OPERATION = binding(f"(self: {MODULE}.Metric, arg0: float) -> None", Arg("arg0", FLOAT))


def _refused(reason: str) -> TritonModelException:
    """A metric the server refuses to create, in the original's words (its server answers the stub)."""
    return TritonModelException(f"Error when creating Metric: Failed to process the request for model "
                                f"'{_runtime.instance_name()}', message: {reason}")


class MetricFamily(PybindRepr):
    """`MetricFamily(name, description, kind)`.

    Raises TritonModelException `Error when creating MetricFamily: <reason>` for an invalid name
    or a name already registered with another kind; TypeError for arguments of the wrong type.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM
    MetricKind = MetricKind

    @binding(f"{MODULE}.MetricFamily(name: str, description: str, kind: {MODULE}.MetricKind)", Arg("name", STR),
             Arg("description", STR), Arg("kind", enum_of(MetricKind)))
    def __init__(self, name: str, description: str, kind: _Kind) -> None:
        name = require_str("name", name)
        description = require_str("description", description)
        known = _families.get(name)
        try:
            self._record = _register_family(name, description, kind)
        except Exception as exc:  # noqa: BLE001
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None
        try:
            _report("family_created", name, description, int(kind))
        except Exception as exc:  # noqa: BLE001 - a reporter failure is a creation failure too
            if known is None:  # the server refused a new family: a later attempt must ask again
                _forget_if_unused(self._record)
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None
        self._liveness = _Liveness()
        weakref.finalize(self, _invalidate, self._liveness)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        """A metric of this family. Raises TritonModelException `Failed to create metric. ...`."""
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if labels is not None and not _is_str_dict(labels):
            raise _refused("attempt to access JSON non-string as string")
        bucket_list = self._check_buckets(buckets)
        return Metric._create(self._record, self._liveness, dict(labels or {}), bucket_list)

    def _check_buckets(self, buckets: object) -> list[float] | None:
        kind = self._record.kind
        if buckets is None:
            if kind == MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Missing required buckets.")
            return None
        if not isinstance(buckets, list):
            raise TritonModelException("Failed to create metric. Buckets must be a list.")
        if kind != MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        if not all(isinstance(b, (int, float)) for b in buckets):
            raise RuntimeError(_NOT_A_NUMBER)
        values = [float(b) for b in buckets]
        if any(low >= high for low, high in itertools.pairwise(values)):
            raise _refused("Bucket Boundaries must be strictly sorted")
        return values


class Metric(PybindRepr):
    """A labelled counter, gauge or histogram, created by `MetricFamily.Metric(...)`.

    Every method raises TritonModelException `Failed to <op> metric value: <reason>`.
    """

    _record: _FamilyRecord
    _liveness: _Liveness
    _labels: dict[str, str]
    _key: str
    _series: _Series

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Metric objects are created with MetricFamily.Metric(labels, buckets)")

    @classmethod
    def _create(cls, record: _FamilyRecord, liveness: _Liveness, labels: dict[str, str],
                buckets: list[float] | None) -> Metric:
        metric = cls.__new__(cls)
        metric._record = record
        metric._liveness = liveness
        metric._labels = labels
        metric._key = json.dumps(labels, sort_keys=True)
        with _lock:
            series = record.series.get(metric._key)
            created = series is None
            if series is None:
                series = record.series[metric._key] = _Series(buckets, bucket_counts=[0] * len(buckets or []))
            series.refs += 1
        metric._series = series
        if created:
            try:
                _report("metric_created", record.name, dict(labels), buckets)
            except Exception as exc:  # noqa: BLE001
                _release(record, metric._key, labels)
                raise TritonModelException(f"Failed to create metric. {exc}") from None
        weakref.finalize(metric, _release, record, metric._key, labels)
        return metric

    @_OPERATION
    def increment(self, value: float, /) -> None:
        """Add `value` (COUNTER: non-negative only; GAUGE: any sign)."""
        self._operate("increment", "Increment", value, (MetricKind.COUNTER, MetricKind.GAUGE))

    @_OPERATION
    def set(self, value: float, /) -> None:
        """Set a GAUGE to `value`."""
        self._operate("set", "Set", value, (MetricKind.GAUGE,))

    @_OPERATION
    def observe(self, value: float, /) -> None:
        """Record `value` in a HISTOGRAM."""
        self._operate("observe", "Observe", value, (MetricKind.HISTOGRAM,))

    @binding(f"(self: {MODULE}.Metric) -> float")
    def value(self) -> float:
        """The current value of a COUNTER or GAUGE: the server's, when a reporter that can read
        it back (`metric_value`) is installed, else the local one."""
        try:
            self._check_usable("Value", (MetricKind.COUNTER, MetricKind.GAUGE))
            reporter = _runtime.metric_reporter()
            read_back = getattr(reporter, "metric_value", None) if reporter is not None else None
            if read_back is not None:
                # The server's series may hold more than this process did: changes made before a
                # stub restart, or by other instances that share the series.
                return float(read_back(self._record.name, dict(self._labels)))
        except Exception as exc:  # noqa: BLE001 - every failure gets the operation's prefix
            raise TritonModelException(f"Failed to get metric value: {exc}") from None
        with _lock:
            return float(self._series.value)

    def _operate(self, op: str, op_title: str, value: object, kinds: tuple[MetricKind, ...]) -> None:
        number = _number(value)
        try:
            self._check_usable(op_title, kinds)
            if op == "increment" and self._record.kind == MetricKind.COUNTER and number < 0:
                raise TritonModelException(
                    "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                    "non-negative values."
                )
            _apply(self._series, op, number)
            _report("metric_operation", self._record.name, dict(self._labels), op, number)
        except Exception as exc:  # noqa: BLE001 - every failure gets the operation's prefix
            raise TritonModelException(f"Failed to {op} metric value: {exc}") from None

    def _check_usable(self, op_title: str, kinds: tuple[MetricKind, ...]) -> None:
        if not self._liveness.alive:
            raise TritonModelException(_FAMILY_DELETED)
        if self._record.kind not in kinds:
            raise TritonModelException(f"{_KIND_NAME[self._record.kind]} does not support {op_title}")

    def _snapshot(self) -> dict[str, Any]:
        """Local state, for tests and debugging: value, or sum/count/cumulative bucket counts."""
        with _lock:
            series = self._series
            if series.buckets is None:
                return {"value": series.value}
            return {"sum": series.total, "count": series.count,
                    "buckets": dict(zip(series.buckets, series.bucket_counts, strict=False))}


def _apply(series: _Series, op: str, value: float) -> None:
    with _lock:
        if op == "increment":
            series.value += value
        elif op == "set":
            series.value = value
        else:
            series.total += value
            series.count += 1
            # Cumulative, as exported: every bucket whose upper bound is >= value counts it.
            first = bisect.bisect_left(series.buckets or [], value)
            for i in range(first, len(series.bucket_counts)):
                series.bucket_counts[i] += 1


def _register_family(name: str, description: str, kind: MetricKind) -> _FamilyRecord:
    if not _NAME.match(name) or name.startswith("__"):
        raise TritonModelException("Invalid metric name")
    with _lock:
        record = _families.get(name)
        if record is None:
            record = _families[name] = _FamilyRecord(name, description, kind)
        elif record.kind != kind:
            raise TritonModelException("Family name already exists with different type")
        return record


def _forget_if_unused(record: _FamilyRecord) -> None:
    with _lock:
        if not record.series and _families.get(record.name) is record:
            del _families[record.name]


def _invalidate(liveness: _Liveness) -> None:
    liveness.alive = False


def _release(record: _FamilyRecord, key: str, labels: dict[str, str]) -> None:
    with _lock:
        series = record.series.get(key)
        if series is None:
            return
        series.refs -= 1
        if series.refs > 0:
            return
        del record.series[key]
    try:
        _report("metric_deleted", record.name, dict(labels))
    except Exception:  # noqa: BLE001 - runs from a finalizer: nobody could handle it
        pass


def _report(method: str, *args: Any) -> None:
    reporter = _runtime.metric_reporter()
    handler = getattr(reporter, method, None) if reporter is not None else None
    if handler is not None:
        handler(*args)


def _is_str_dict(labels: object) -> bool:
    return isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(value.__float__())  # type: ignore[attr-defined]
        except (AttributeError, TypeError, ValueError):
            raise TypeError(f"metric value must be a number, got {type(value)}") from None
    return float(value)
