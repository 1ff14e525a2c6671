"""Custom metrics frames (kinds 30-39): `pb_utils.MetricFamily` / `Metric` in a stub, mirrored to
the backend's registry, which serves them on `/metrics`.

    stub -> backend                                   backend -> stub
    ---------------                                   ---------------
    MetricFamilyCreate(token, ...)  (waits)  ──────▶  MetricReply(token, error, value)
    MetricValueQuery(token, ...)    (waits)  ──────▶  MetricReply(token, error, value)
    MetricOps(entries)              (one way, buffered in the stub, sent before any other frame)

Entries of `MetricOps`, applied in order, are records told apart by their length (and their `op`):
    MetricCreate [ENTRY_CREATE, family, labels, buckets | None]
                                                         a series this stub now holds
    MetricUpdate [ENTRY_UPDATE, family, labels, set_to | None, delta, observations]
                                                         changes since the last frame: set the value
                                                         first (if set_to is not None), then add delta;
                                                         histograms observe each of `observations`
    MetricDelete [ENTRY_DELETE, family, labels]           this stub dropped its last Metric object
"""

from __future__ import annotations

from typing import NamedTuple

from pystub_backend.ipc.wire import message

__all__ = ["MetricFamilyCreate", "MetricValueQuery", "MetricOps", "MetricReply", "MetricCreate", "MetricUpdate",
           "MetricDelete", "MetricEntry", "ENTRY_CREATE", "ENTRY_UPDATE", "ENTRY_DELETE"]

ENTRY_CREATE = 0
ENTRY_UPDATE = 1
ENTRY_DELETE = 2


class MetricCreate(NamedTuple):
    op: int  # ENTRY_CREATE
    family: str
    labels: dict[str, str]
    buckets: list[float] | None


class MetricUpdate(NamedTuple):
    op: int  # ENTRY_UPDATE
    family: str
    labels: dict[str, str]
    set_to: float | None
    delta: float
    observations: list[float]


class MetricDelete(NamedTuple):
    op: int  # ENTRY_DELETE
    family: str
    labels: dict[str, str]


MetricEntry = MetricCreate | MetricUpdate | MetricDelete  # the decoder tells them apart by length


@message(30)
class MetricFamilyCreate(NamedTuple):
    token: int
    name: str
    description: str
    kind: int  # pb_utils.MetricFamily.COUNTER / GAUGE / HISTOGRAM


@message(31)
class MetricOps(NamedTuple):
    entries: list[MetricEntry]


@message(32)
class MetricValueQuery(NamedTuple):
    token: int
    family: str
    labels: dict[str, str]


@message(33)
class MetricReply(NamedTuple):
    token: int
    error: str | None  # the reason; pb_utils adds its prefix (docs/reference/model-api.md#custom-metrics)
    value: float
