"""GPU tensors by CUDA IPC at the two ends of a BLS call, on the fake device (CudaMemory on the
stand-in bindings: queued work lands only at a synchronization).

The callee exports a synchronized copy in a buffer it owns, only for a request that prefers that
device, and holds it until DeviceRelease (the buffer then goes back to its pool): so a caller in
another process sees what the model wrote even if the model never synchronized, and memory CUDA
cannot export (a pool's, one the callee itself mapped) is exported all the same; an empty output
goes through the host. A caller that cannot map an output gets an error naming it and gives its
claim back at once, whatever failed; a mapped output is closed once the device is idle and gives
its claim back; the exporting stub maps its own export. GPU inputs: exported as copies, copied to
the host when that fails. Outputs copied onto a GPU reuse pooled buffers."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from device_peer import Peer

from pystub_backend.devices import (
    DeviceError,
    fake_cuda_capsule,
    fake_device_array,
    fake_engine,
    fake_memory,
    fake_write_later,
)
from pystub_backend.ipc.arena import ArenaWriter
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.bls import DeviceCleanup, DeviceRelease
from pystub_backend.ipc.names import DEFAULT_PREFIX, stub_base_name
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireResponse, WireTensor
from pystub_backend.stub import device_outputs, translate
from pystub_backend.stub.features import device_ipc
from pystub_backend.stub.features.bls_outputs import Cleanup, response_from_wire
from pystub_backend.stub.pb_utils import InferenceResponse, Tensor


@pytest.fixture(autouse=True)
def _fake_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(fake_engine.FAKE_VARIABLE, "2")
    monkeypatch.setattr(device_outputs, "_memory", None)
    monkeypatch.setattr(device_ipc, "_pool", None, raising=False)  # (absent before the pool existed)
    yield
    gc.collect()
    assert device_ipc.facts()["device_exports_held"] == 0
    pool = device_ipc._pool
    if pool is not None:
        pool.close()
    assert fake_engine.live() == (0, 0), "a test left fake device memory allocated or mapped"


class _Owner:
    """A request's state, as `expect` ties the preference to it."""


def _gpu_tensor(array: np.ndarray, device: int, exportable: bool = True) -> Tensor:
    return Tensor.from_dlpack("OUT", fake_cuda_capsule(fake_device_array(array, device, exportable), device))


def _sent_claims(sent: list[Any]) -> list[int]:
    return [claim for message in sent if isinstance(message, DeviceCleanup) for claim in message.claims]


def _until_sent(sent: list[Any], claims: list[int]) -> None:
    deadline = time.monotonic() + 30
    while _sent_claims(sent) != claims:
        assert time.monotonic() < deadline, f"DeviceCleanup{claims} was not sent within 30 s (sent: {sent})"
        time.sleep(0.01)


def test_an_output_on_the_preferred_device_is_exported_as_a_copy_held_until_released() -> None:
    owner = _Owner()
    device_ipc.expect(41, owner, 1)
    assert (device_ipc.export_device(41), device_ipc.export_device(42)) == (1, None)
    tensor = _gpu_tensor(np.arange(4, dtype=np.int32), 1)
    wire = device_ipc.export("OUT", "INT32", [4], tensor._wire_payload()[2])  # type: ignore[arg-type]
    assert wire is not None
    tag, device, export_id, offset, nbytes, handle = wire.handle
    assert (tag, device, offset, nbytes, len(handle)) == (DEVICE_HANDLE_TAG, 1, 0, 16, 64)
    del tensor
    gc.collect()  # the model's memory may go: the export is the stub's own copy
    assert device_ipc.facts()["device_exports_held"] == 1
    peer = Peer(handle, 0, 1)  # the caller, another process
    assert peer.line().startswith("raw [0.0, 1.4")  # int32 0, 1, 2, 3 read as floats: the bytes are there
    assert peer.finish().endswith("closed (0, 0)")
    device_ipc._on_release(None, DeviceRelease([export_id]))
    del owner
    gc.collect()
    assert device_ipc.export_device(41) is None  # the preference went with the request


def test_the_export_holds_what_the_model_wrote_though_it_never_synchronized() -> None:
    out = fake_device_array(np.zeros(4, np.float32), 0)
    fake_write_later(out, np.full(4, 7.0), 0)  # a kernel after a long one: still queued at return
    tensor = Tensor.from_dlpack("OUT", fake_cuda_capsule(out, 0))
    wire = device_ipc.export("OUT", "FP32", [4], tensor._wire_payload()[2])  # type: ignore[arg-type]
    assert wire is not None
    peer = Peer(wire.handle[5], 0, 0)
    assert peer.line() == "raw [7.0, 7.0, 7.0, 7.0]"  # handing over the model's memory itself: zeros
    peer.finish()
    device_ipc.unexport(wire.handle)
    del tensor, out


def test_memory_cuda_cannot_export_is_exported_as_a_copy_and_an_empty_output_goes_through_the_host() -> None:
    pooled = _gpu_tensor(np.arange(4, dtype=np.float32), 0, exportable=False)  # a caching pool's memory
    wire = device_ipc.export("OUT", "FP32", [4], pooled._wire_payload()[2])  # type: ignore[arg-type]
    assert wire is not None
    device_ipc.unexport(wire.handle)
    owner = _Owner()
    device_ipc.expect(7, owner, 0)
    empty = _gpu_tensor(np.empty(0, np.float32), 0)
    assert empty._pointer == 0  # NULL, as cudaMalloc(0)
    writer = ArenaWriter(stub_base_name(DEFAULT_PREFIX), "s2p", 1 << 20, 1 << 20)
    try:
        response = InferenceResponse([empty, pooled])
        wire_response = translate.response_to_wire(7, response, msg.RESPONSE_FINAL, set(), writer)
        assert wire_response.error is None, wire_response.error
        empty_out, pooled_out = wire_response.outputs
        assert empty_out.shape == [0] and empty_out.handle[0] != DEVICE_HANDLE_TAG  # through the host
        assert pooled_out.handle[0] == DEVICE_HANDLE_TAG
        device_ipc.unexport(pooled_out.handle)
        for placed in wire_response.outputs[:1]:
            writer.free(tuple(placed.handle))  # type: ignore[arg-type]
    finally:
        writer.close()
    del pooled, empty, response, owner


def test_an_output_that_cannot_be_mapped_is_an_error_naming_it_and_its_claim_goes_back() -> None:
    sent: list[Any] = []
    cleanup = Cleanup(sent.append)
    bogus = WireTensor("OUT", "FP32", [4], [DEVICE_HANDLE_TAG, 0, 7, 0, 16, bytes(64)])
    response = response_from_wire(cleanup, None, WireResponse(1, msg.RESPONSE_FINAL, None, [bogus], "{}"), 0)  # type: ignore[arg-type]
    assert response.has_error()
    assert response.error().message() == ("the GPU output 'OUT' could not be mapped: cudaIpcOpenMemHandle failed: "
                                           "invalid argument (cudaErrorInvalidValue)")
    _until_sent(sent, [7])


class _BrokenMemory:
    """A DeviceMemory whose bindings raise what they should not (not a DeviceError)."""

    def open_handle(self, device_id: int, handle: bytes) -> int:
        raise AttributeError("'cudaIpcMemHandle_t' object has no attribute 'reserved'")


def test_whatever_fails_in_opening_a_mapping_its_claim_goes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_outputs, "_memory", _BrokenMemory())
    sent: list[Any] = []
    wire = WireTensor("OUT", "FP32", [4], [DEVICE_HANDLE_TAG, 0, 8, 0, 16, bytes(64)])
    response = response_from_wire(Cleanup(sent.append), None, WireResponse(1, msg.RESPONSE_FINAL, None, [wire], "{}"),  # type: ignore[arg-type]
                                  0)
    assert response.has_error() and "no attribute 'reserved'" in response.error().message()
    _until_sent(sent, [8])


def test_a_mapped_output_is_closed_once_the_device_is_idle_and_gives_its_claim_back() -> None:
    sent: list[Any] = []
    cleanup = Cleanup(sent.append)
    exporter = fake_memory()
    pointer = exporter.alloc(0, 16)
    exporter.from_host(0, pointer, memoryview(np.arange(4, dtype=np.float32)).cast("B"))
    handle, _ = exporter.export_handle(0, pointer)
    script = '''
import gc, sys, time
from typing import Any
from pystub_backend.devices import fake_engine, fake_kernel
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.bls import DeviceCleanup
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireResponse, WireTensor
from pystub_backend.stub.features.bls_outputs import Cleanup, response_from_wire
sent: list[Any] = []
def _claims(messages): return [c for m in messages if isinstance(m, DeviceCleanup) for c in m.claims]
wire = WireTensor("OUT", "FP32", [4], [DEVICE_HANDLE_TAG, 0, 9, 0, 16, HANDLE])
response = response_from_wire(Cleanup(sent.append), None, WireResponse(1, msg.RESPONSE_FINAL, None, [wire], "{}"), 0)
(out,) = response.output_tensors()
ran = []
import numpy as np
view = np.frombuffer((np.ctypeslib.as_ctypes_type(np.uint8) * 16).from_address(out._pointer), np.uint8)
fake_kernel(0, lambda: ran.append(int(view.sum())), (view,))  # the model's kernel still reads it
del response, out, view
gc.collect()
deadline = time.monotonic() + 30
while not sent and time.monotonic() < deadline:
    time.sleep(0.01)
print("claims", _claims(sent))
print("kernel read", ran)
print("live", fake_engine.live())
'''
    said = Peer(handle, 0, 0, script=script).finish()
    # the claim went back after the model's kernel read the mapping (the bytes of 0.0 .. 3.0 sum to 383)
    assert said.splitlines()[-3:] == ["claims [9]", "kernel read [383]", "live (0, 0)"], said
    exporter.free(0, pointer)
    del cleanup


def test_the_exporting_stub_maps_its_own_export() -> None:
    sent: list[Any] = []
    tensor = _gpu_tensor(np.arange(4, dtype=np.float32), 0)
    wire = device_ipc.export("OUT", "FP32", [4], tensor._wire_payload()[2])  # type: ignore[arg-type]
    assert wire is not None
    claimed = WireTensor("OUT", "FP32", [4], [DEVICE_HANDLE_TAG, 0, 11, *wire.handle[3:]])
    response = response_from_wire(Cleanup(sent.append), None,  # type: ignore[arg-type]
                                  WireResponse(1, msg.RESPONSE_FINAL, None, [claimed], "{}"), 0)
    assert not response.has_error(), response.error().message()  # CUDA itself refuses this
    (out,) = response.output_tensors()
    host = np.empty(4, np.float32)
    device_outputs.copy_to_host(out._wire_payload()[2], memoryview(host).cast("B"))
    assert host.tolist() == [0.0, 1.0, 2.0, 3.0]
    del response, out
    gc.collect()
    _until_sent(sent, [11])
    device_ipc.unexport(wire.handle)
    del tensor


def test_a_gpu_input_is_exported_as_a_copy_and_a_mapped_one_too() -> None:
    tensor = _gpu_tensor(np.arange(4, dtype=np.int32), 0)
    wire = device_ipc.export_input("IN", "INT32", (4,), tensor._wire_payload()[2])  # type: ignore[arg-type]
    assert wire is not None and wire.handle[:2] == [DEVICE_HANDLE_TAG, 0] and wire.shape == [4]
    assert device_ipc.facts()["device_exports_held"] == 1  # held for the callee until DeviceRelease
    device_ipc._on_release(None, DeviceRelease([wire.handle[2]]))
    importer = fake_memory()
    other = importer.alloc(0, 16)  # a tensor this stub maps from another (here: its own, opened again)
    handle, _ = importer.export_handle(0, other)
    base = importer.open_handle(0, handle)
    mapped = Tensor._on_device("IN", "INT32", [4], 0, base, object())
    again = device_ipc.export_input("IN", "INT32", [4], mapped._wire_payload()[2])  # type: ignore[arg-type]
    assert again is not None  # its copy is this stub's own: exportable
    device_ipc.unexport(again.handle)
    importer.close_handle(0, base)
    importer.free(0, other)
    del tensor, mapped


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


def test_outputs_copied_onto_a_gpu_reuse_pooled_buffers() -> None:
    counters = fake_engine.counters()
    mallocs, frees = counters["mallocs"], counters["frees"]
    for value in range(20):
        on_gpu = device_ipc.to_device(Tensor("OUT", np.full(256, value, np.float32)), 1)
        host = np.empty(256, np.float32)
        device_outputs.copy_to_host(on_gpu._wire_payload()[2], memoryview(host).cast("B"))
        assert host[0] == value
        del on_gpu
        gc.collect()
    assert (counters["mallocs"] - mallocs, counters["frees"] - frees) == (1, 0)  # cudaFree syncs the device
    empty = device_ipc.to_device(Tensor("OUT", np.empty(0, np.float32)), 1)
    assert (empty.is_cpu(), empty._pointer) == (False, 0)


def test_a_failed_copy_onto_a_gpu_is_a_device_error() -> None:
    with pytest.raises(DeviceError, match="cudaSetDevice"):
        device_ipc.to_device(Tensor("OUT", np.ones(4, np.float32)), 5)
