"""PYSTUB_PIN_GPU in a stub: a GPU instance asked to be pinned sees its GPU alone (CUDA_VISIBLE_DEVICES
set before its model is imported, its `model_instance_device_id` 0); the default and CPU instances
keep the server's view; any other value fails the load with a clear text."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from pystub_backend.devices import numbering
from pystub_backend.stub.device_pinning import pinned_args
from pystub_backend.stub.loader import LoadError


def _args(kind: str, device: str, value: str | None) -> dict[str, str]:
    parameters = {} if value is None else {"PYSTUB_PIN_GPU": {"string_value": value}}
    return {"model_config": json.dumps({"name": "m", "parameters": parameters}), "model_instance_kind": kind,
            "model_instance_device_id": device, "model_name": "m"}


@pytest.fixture(autouse=True)
def _restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(numbering, "_numbering", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-ab12")  # the server's view: two GPUs
    yield
    os.environ.pop(numbering.PINNED_VARIABLE, None)  # pin() set it; monkeypatch knew it absent


def test_a_pinned_gpu_instance_sees_its_gpu_alone() -> None:
    args = pinned_args(_args("GPU", "1", "yes"))
    assert args["model_instance_device_id"] == "0"
    assert (os.environ["CUDA_VISIBLE_DEVICES"], os.environ[numbering.PINNED_VARIABLE]) == ("GPU-ab12", "1")
    assert numbering.device_numbering().to_server(0) == 1 and numbering.device_numbering().to_local(1) == 0


@pytest.mark.parametrize(("kind", "value"), [("GPU", None), ("GPU", "no"), ("CPU", "yes")])
def test_otherwise_the_stub_keeps_the_servers_view(kind: str, value: str | None) -> None:
    args = _args(kind, "1", value)
    assert pinned_args(args) is args and os.environ["CUDA_VISIBLE_DEVICES"] == "3,GPU-ab12"


def test_a_bad_value_fails_the_load() -> None:
    with pytest.raises(LoadError, match="Incorrect value for PYSTUB_PIN_GPU: 'true' \\(expected 'yes' or 'no'\\)"):
        pinned_args(_args("GPU", "0", "true"))
    with pytest.raises(LoadError, match="has no device 5"):
        pinned_args(_args("GPU", "5", "yes"))
