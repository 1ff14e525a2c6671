"""The fake machine for the device tests: two GPUs, this process's memory checked empty after each test."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from pystub_backend.devices import fake_engine


@pytest.fixture(autouse=True)
def _two_fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(fake_engine.FAKE_VARIABLE, "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield
    gc.collect()
    assert fake_engine.live() == (0, 0), "a test left fake device memory allocated or mapped"
