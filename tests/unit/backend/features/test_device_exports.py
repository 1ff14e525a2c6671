"""The device-export registry (GPU outputs by CUDA IPC): an export is released to its exporter only
when the response that carried it is released and every consumer closed its mapping; dead
consumers' claims and dead exporters' exports are swept; the table empties in every case."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pystub_backend.backend.features.bls.device_exports import DeviceExports
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG


@dataclass(eq=False)
class _Stub:
    base: str
    instance_name: str = "m_0"
    alive: bool = True


class _Released:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def __call__(self, exporter: Any, export_ids: list[int]) -> None:
        self.calls.append((exporter.base, export_ids))


def _handle(export_id: int) -> list[Any]:
    return [DEVICE_HANDLE_TAG, 0, export_id, 16, 64, bytes(64)]


@pytest.fixture
def released() -> _Released:
    return _Released()


def test_an_export_is_released_after_its_response_and_every_claim(released: _Released) -> None:
    registry, exporter, a, b = DeviceExports(released), _Stub("e"), _Stub("a"), _Stub("b")
    ref = registry.received(exporter, _handle(7))  # type: ignore[arg-type]
    assert (ref.key, ref.device_id, ref.offset, ref.nbytes) == (("e", 7), 0, 16, 64)
    first, second = registry.claim(ref.key, a), registry.claim(ref.key, b)  # type: ignore[arg-type]
    assert first is not None and second is not None
    registry.drop_hold(ref.key)
    registry.release(a, [first])  # type: ignore[arg-type]
    assert released.calls == [] and len(registry) == 1
    assert registry.release(a, [second]) == []  # type: ignore[arg-type]  # not a's claim: ignored
    registry.release(b, [second])  # type: ignore[arg-type]
    assert released.calls == [("e", [7])] and (len(registry), registry.claims()) == (0, 0)


def test_an_export_nobody_claimed_goes_back_with_its_response(released: _Released) -> None:
    registry, exporter = DeviceExports(released), _Stub("e")
    ref = registry.received(exporter, _handle(1))  # type: ignore[arg-type]
    registry.drop_hold(ref.key)
    assert released.calls == [("e", [1])] and len(registry) == 0


def test_a_dead_consumers_claims_are_swept_and_the_export_released(released: _Released) -> None:
    registry, exporter, consumer = DeviceExports(released), _Stub("e"), _Stub("c")
    ref = registry.received(exporter, _handle(3))  # type: ignore[arg-type]
    registry.claim(ref.key, consumer)  # type: ignore[arg-type]
    registry.drop_hold(ref.key)
    registry.sweep()
    assert released.calls == []
    consumer.alive = False
    registry.sweep()
    assert released.calls == [("e", [3])] and (len(registry), registry.claims()) == (0, 0)


def test_a_dead_exporters_exports_are_dropped_and_cannot_be_claimed(released: _Released) -> None:
    registry, exporter, consumer = DeviceExports(released), _Stub("e"), _Stub("c")
    ref = registry.received(exporter, _handle(4))  # type: ignore[arg-type]
    claim = registry.claim(ref.key, consumer)  # type: ignore[arg-type]
    exporter.alive = False
    assert not registry.exporter_alive(ref.key)
    registry.sweep()
    assert (len(registry), registry.claims(), released.calls) == (0, 0, [])  # nobody to tell
    assert registry.claim(ref.key, consumer) is None  # type: ignore[arg-type]
    assert claim is not None
    registry.release(consumer, [claim])  # type: ignore[arg-type]  # the consumer closes later: a no-op
    registry.drop_hold(ref.key)
    assert len(registry) == 0


def test_malformed_and_reused_exports_are_refused(released: _Released) -> None:
    registry, exporter = DeviceExports(released), _Stub("e")
    with pytest.raises(ValueError, match="malformed GPU output handle"):
        registry.received(exporter, [DEVICE_HANDLE_TAG, 0, 1])  # type: ignore[arg-type]
    ref = registry.received(exporter, _handle(5))  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="exported GPU buffer 5 twice"):
        registry.received(exporter, _handle(5))  # type: ignore[arg-type]
    registry.drop_hold(ref.key)
    assert len(registry) == 0


def test_exports_in_a_response_nobody_takes_go_straight_back(released: _Released) -> None:
    from pystub_backend.ipc.records import WireTensor

    registry, exporter = DeviceExports(released), _Stub("e")
    outputs = [WireTensor("A", "FP32", [4], _handle(11)), WireTensor("B", "FP32", [4], [0, 64, 16])]
    registry.discard(exporter, outputs)  # type: ignore[arg-type]
    assert released.calls == [("e", [11])] and len(registry) == 0
    exporter.alive = False
    registry.discard(exporter, outputs)  # type: ignore[arg-type]  # a dead exporter is told nothing
    assert released.calls == [("e", [11])]
