"""The public faces of the supervision and features packages (trio's test_exports): every name in
`__all__` resolves, nothing else is offered, and a change of the face is deliberate (edit here)."""

from __future__ import annotations

import importlib

import pytest

FACES = {
    "pystub_backend.backend.supervision": {
        "BackendConfigError", "ForkedStub", "Handler", "BackendHandlers", "InstanceSpec", "InstanceState",
        "ModelInstance", "RestartPolicy", "StubFacingCore", "StubProcess", "StubServices", "StubSettings",
        "StubStartError", "WeightsTemplate", "parse_backend_config", "watch_health",
    },
    "pystub_backend.backend.features": {
        "ClientShmRegistry", "CustomMetrics", "feature_services", "install_features", "registry_for",
    },
    "pystub_backend.backend.features.bls": {"PayloadRegistry", "REGISTRY"},
    "pystub_backend.ipc.exit_codes": {"StubExitCode", "BOOT_FAILURES", "describe_exit"},
}


@pytest.mark.parametrize("package", sorted(FACES))
def test_the_public_face_is_what_it_says(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == FACES[package]
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name} does not resolve"
    assert not hasattr(module, "_not_public_at_all"), "unknown names raise AttributeError"


def test_every_backend_feature_frame_kind_has_exactly_one_handler() -> None:
    from pystub_backend.backend.features.install import install_features
    from pystub_backend.backend.supervision.handlers import BackendHandlers
    from pystub_backend.ipc.messages import bls, client_shm, metrics, multiplex, sequences

    handlers = install_features(BackendHandlers())
    expected = {bls.BlsRequest, bls.BlsCancel, bls.BlsCleanup, bls.BlsInspect, bls.ModelControl, bls.DeviceCleanup,
                client_shm.ClientShmForgotten,
                metrics.MetricFamilyCreate, metrics.MetricOps, metrics.MetricValueQuery,
                sequences.SequenceRescheduled, multiplex.MultiplexLoaded, multiplex.MultiplexLoadFailed,
                multiplex.MultiplexUnloaded, multiplex.MultiplexUsage}
    assert set(handlers.handled_kinds()) == expected
    with pytest.raises(ValueError, match="already has a handler"):
        install_features(handlers)  # registering twice is refused, not silently overwritten
