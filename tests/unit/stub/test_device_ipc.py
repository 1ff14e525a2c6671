"""GPU outputs by CUDA IPC at the two ends of a BLS call, on the fake device: the callee exports a
GPU output only for a request that prefers that device and holds it until DeviceRelease; a caller
that cannot map an output gets an error naming it and gives its claim back at once; a mapped output
gives its claim back when collected. GPU inputs: exported when CUDA can (else copied), an input
that cannot be mapped fails its request naming it and gives its claim back."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pystub_backend.devices import FAKE_VARIABLE, FakeMemory, fake_cuda_capsule, fake_device_array
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.bls import DeviceCleanup, DeviceRelease
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireResponse, WireTensor
from pystub_backend.stub import device_outputs
from pystub_backend.stub.features import device_ipc
from pystub_backend.stub.features.bls_outputs import Cleanup, response_from_wire
from pystub_backend.stub.pb_utils import Tensor


@pytest.fixture(autouse=True)
def _fake_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(FAKE_VARIABLE, "2")
    monkeypatch.setattr(device_outputs, "_memory", None)
    yield
    gc.collect()
    assert device_ipc.facts()["device_exports_held"] == 0


class _Owner:
    """A request's state, as `expect` ties the preference to it."""


def _sent_claims(sent: list[Any]) -> list[int]:
    return [claim for message in sent if isinstance(message, DeviceCleanup) for claim in message.claims]


def _until_sent(sent: list[Any], claims: list[int]) -> None:
    import time

    deadline = time.monotonic() + 10
    while _sent_claims(sent) != claims:
        assert time.monotonic() < deadline, f"DeviceCleanup{claims} was not sent within 10 s (sent: {sent})"
        time.sleep(0.01)


def test_an_output_on_the_preferred_device_is_exported_and_held_until_released() -> None:
    owner = _Owner()
    device_ipc.expect(41, owner, 1)
    assert (device_ipc.export_device(41), device_ipc.export_device(42)) == (1, None)
    tensor = Tensor.from_dlpack("OUT", fake_cuda_capsule(fake_device_array(np.arange(4, dtype=np.int32), 1), 1))
    wire = device_ipc.export("OUT", "INT32", [4], tensor._wire_payload()[2])  # type: ignore[arg-type]
    tag, device, export_id, offset, nbytes, handle = wire.handle
    assert (tag, device, offset, nbytes, len(handle)) == (DEVICE_HANDLE_TAG, 1, 0, 16, 64)
    del tensor
    gc.collect()
    assert device_ipc.facts()["device_exports_held"] == 1  # the stub keeps it alive for the caller
    memory = FakeMemory()
    base = memory.open_handle(1, handle)  # another process would do this; the bytes are there
    assert list((ctypes.c_int32 * 4).from_address(base)) == [0, 1, 2, 3]
    memory.close_handle(1, base)
    device_ipc._on_release(None, DeviceRelease([export_id]))
    del owner
    gc.collect()
    assert device_ipc.export_device(41) is None  # the preference went with the request


def test_an_output_that_cannot_be_mapped_is_an_error_naming_it_and_its_claim_goes_back() -> None:
    sent: list[Any] = []
    cleanup = Cleanup(sent.append)
    bogus = WireTensor("OUT", "FP32", [4], [DEVICE_HANDLE_TAG, 0, 7, 0, 16, bytes(64)])
    response = response_from_wire(cleanup, None, WireResponse(1, msg.RESPONSE_FINAL, None, [bogus], "{}"), 0)  # type: ignore[arg-type]
    assert response.has_error()
    assert response.error().message() == ("the GPU output 'OUT' could not be mapped: cudaIpcOpenMemHandle failed: "
                                           "invalid argument (not an IPC memory handle)")
    _until_sent(sent, [7])


def test_a_mapped_output_gives_its_claim_back_when_collected() -> None:
    sent: list[Any] = []
    cleanup = Cleanup(sent.append)
    memory = FakeMemory()
    pointer = memory.alloc(0, 16)
    memory.from_host(0, pointer, memoryview(np.arange(4, dtype=np.float32)).cast("B"))
    handle, _ = memory.export_handle(0, pointer)
    wire = WireTensor("OUT", "FP32", [4], [DEVICE_HANDLE_TAG, 0, 9, 0, 16, handle])
    response = response_from_wire(cleanup, None, WireResponse(1, msg.RESPONSE_FINAL, None, [wire], "{}"), 0)  # type: ignore[arg-type]
    (out,) = response.output_tensors()
    assert (out.is_cpu(), out.__dlpack_device__()) == (False, (2, 0))
    assert device_ipc.facts()["device_mappings"] == 1
    copy = np.empty(4, dtype=np.float32)
    device_outputs.copy_to_host(out._wire_payload()[2], memoryview(copy).cast("B"))
    assert copy.tolist() == [0.0, 1.0, 2.0, 3.0]
    del response, out
    gc.collect()
    _until_sent(sent, [9])
    assert device_ipc.facts()["device_mappings"] == 0
    memory.free(0, pointer)


# -- GPU inputs of a BLS call: the caller exports them, the callee maps them ----------------------
def test_a_gpu_input_is_exported_when_cuda_can_and_copied_when_it_cannot() -> None:
    tensor = Tensor.from_dlpack("IN", fake_cuda_capsule(fake_device_array(np.arange(4, dtype=np.int32), 0), 0))
    wire = device_ipc.export_input("IN", "INT32", (4,), tensor._wire_payload()[2])  # type: ignore[arg-type]
    assert wire is not None and wire.handle[:2] == [DEVICE_HANDLE_TAG, 0] and wire.shape == [4]
    assert device_ipc.facts()["device_exports_held"] == 1  # held for the callee until DeviceRelease
    device_ipc._on_release(None, DeviceRelease([wire.handle[2]]))
    memory = FakeMemory()
    base = memory.open_handle(0, wire.handle[5])  # a tensor mapped here, as a BLS answer would be
    mapped = Tensor._on_device("IN", "INT32", [4], 0, base, object())
    try:
        assert device_ipc.export_input("IN", "INT32", [4], mapped._wire_payload()[2]) is None  # type: ignore[arg-type]
        assert device_ipc.facts()["device_exports_held"] == 0
    finally:
        del mapped
        memory.close_handle(0, base)


def test_without_the_servers_answer_a_gpu_input_is_copied() -> None:
    request = type("Request", (), {"_model_name": "callee", "_model_version": -1})()
    assert device_ipc.device_taking_inputs(request, 0) == -1  # no model-control client in this process


def test_a_gpu_input_that_cannot_be_mapped_fails_the_request_naming_it_and_its_claim_goes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pystub_backend.stub.features import bls

    sent: list[Any] = []
    monkeypatch.setattr(bls, "_client", SimpleNamespace(cleanup=Cleanup(sent.append)))
    bogus = WireTensor("IN", "FP32", [4], [DEVICE_HANDLE_TAG, 0, 5, 0, 16, bytes(64)])
    with pytest.raises(ValueError, match="the GPU input 'IN' could not be mapped"):
        device_ipc.open_input(bogus)
    _until_sent(sent, [5])
