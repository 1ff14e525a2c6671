"""The public faces of pystub_backend.ipc and pystub_backend.stub (their packages' `__all__`): a
change to what other parts of pystub may use must be deliberate, so it must change this test too."""

from __future__ import annotations

import importlib

import pytest

FACES = {
    "pystub_backend.ipc": {
        "ArenaFullError", "ArenaReader", "ArenaWriter", "AsyncChannel", "BlockingChannel", "ChannelClosedError",
        "ChannelTimeoutError", "ControlBlock", "EMPTY_HANDLE", "Handle", "Status", "StubState", "make_pair"},
    "pystub_backend.ipc.messages": {
        "CATALOGUE", "Direction", "Entry", "entry_of", "bls", "client_shm", "core", "forks", "metrics", "multiplex",
        "sequences", "to_backend", "workers"},
    "pystub_backend.ipc.records": {"WireTensor", "WireRequest", "WireResponse", "WireError", "RECORDS",
                                   "error_to_wire", "DEVICE_HANDLE_TAG"},
    "pystub_backend.stub": {"pb_utils"},
    "pystub_backend.stub.features": {"FEATURES", "install_features"},
    "pystub_backend.stub.handlers": {"StubHandlers", "Handler", "PhaseHook", "PHASES"},
}


@pytest.mark.parametrize("module_name", sorted(FACES))
def test_the_public_face_is_what_it_was(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert set(module.__all__) == FACES[module_name]
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_every_stub_feature_exposes_register() -> None:
    from pystub_backend.stub.features import FEATURES
    for feature in FEATURES:
        assert callable(feature.register) and "register" in feature.__all__, feature.__name__
