"""GPU tensors in a stub, on the fake device (CudaMemory on the stand-in bindings: "device" pointers
are host addresses, work lands at a synchronization): DLPack import of CUDA capsules, Triton's
texts, export back to a CUDA capsule, the one copy to the host (pystub_backend.stub.device_outputs)
into an arena block; a producer object on a side stream is waited for on its stream, as Triton
passes one to `__dlpack__`; device ids as the model's process sees them when pinned to its GPU."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest

from pystub_backend.devices import (
    FAKE_VARIABLE,
    FakeCudaTensor,
    fake_cuda_capsule,
    fake_device_array,
    fake_side_stream,
    fake_write_later,
)
from pystub_backend.devices import numbering as numbering_module
from pystub_backend.devices.fake_bindings import bindings
from pystub_backend.devices.numbering import device_numbering
from pystub_backend.ipc.arena import ArenaWriter
from pystub_backend.ipc.names import DEFAULT_PREFIX, stub_base_name
from pystub_backend.stub import device_outputs
from pystub_backend.stub.pb_utils import Tensor, TritonModelException, _dlpack


@pytest.fixture(autouse=True)
def _fake_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(FAKE_VARIABLE, "2")
    monkeypatch.setattr(device_outputs, "_memory", None)
    yield


def _gpu_tensor(array: np.ndarray, device_id: int = 1) -> Tensor:
    return Tensor.from_dlpack("OUT", fake_cuda_capsule(fake_device_array(array, device_id), device_id))


def test_a_cuda_capsule_is_a_gpu_tensor_on_its_device() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = _gpu_tensor(array)
    assert not tensor.is_cpu() and tensor.__dlpack_device__() == (_dlpack.KDL_CUDA, 1)
    assert tensor.shape() == [2, 3]
    with pytest.raises(TritonModelException, match="Tensor is stored in GPU and cannot be converted to NumPy."):
        tensor.as_numpy()


def test_a_strided_cuda_tensor_is_refused_with_tritons_text() -> None:
    device = fake_device_array(np.arange(12, dtype=np.int32).reshape(3, 4), 1)
    with pytest.raises(TritonModelException, match="DLPack tensor is not contiguous. Only contiguous DLPack "
                                                   "tensors that are stored in C-Order are supported."):
        Tensor.from_dlpack("OUT", fake_cuda_capsule(device[:, ::2], 1))


def test_to_dlpack_of_a_gpu_tensor_shares_its_device_memory_and_lets_go_once_consumed() -> None:
    array = fake_device_array(np.arange(4, dtype=np.int64), 1)
    tensor = Tensor.from_dlpack("OUT", fake_cuda_capsule(array, 1))
    again = Tensor.from_dlpack("AGAIN", tensor.to_dlpack())
    assert again.__dlpack_device__() == (_dlpack.KDL_CUDA, 1) and again._pointer == array.ctypes.data
    assert len(_dlpack._exports) == 1
    del again
    gc.collect()
    assert _dlpack._exports == {}  # the consumer's release reached the deleter
    tensor.to_dlpack()  # a capsule nobody consumes is released when it is collected
    gc.collect()
    assert _dlpack._exports == {} and _dlpack._capsules == {}


def test_bf16_on_the_gpu_keeps_its_type_through_export_and_import() -> None:
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0 and 2.0 in bfloat16
    capsule = _dlpack.export_device_capsule(bits.ctypes.data, (_dlpack.KDL_CUDA, 0), [2], "BF16", bits)
    tensor = Tensor.from_dlpack("B", capsule)
    assert (tensor.triton_dtype(), tensor.is_cpu()) == (14, False)
    datatype, shape, buffer = tensor._wire_payload()
    assert (datatype, shape, buffer.nbytes) == ("BF16", [2], 4)  # type: ignore[attr-defined]


def test_the_payload_is_copied_once_from_the_device_into_the_arena_block() -> None:
    array = np.linspace(0, 1, 1000, dtype=np.float32)
    datatype, shape, buffer = _gpu_tensor(array, 0)._wire_payload()
    assert isinstance(buffer, device_outputs.DeviceBuffer) and buffer.nbytes == array.nbytes
    writer = ArenaWriter(stub_base_name(DEFAULT_PREFIX), "s2p", 1 << 20, 1 << 20)
    try:
        placed = device_outputs.place(writer, "OUT", datatype, shape, buffer)
        received = np.frombuffer(writer.view(tuple(placed.handle)), dtype=np.float32)  # type: ignore[arg-type]
        np.testing.assert_array_equal(received, array)
        writer.free(tuple(placed.handle))  # type: ignore[arg-type]
    finally:
        writer.close()


class _Region:
    """A client region as the stub maps it (RegionViews), over a bytearray."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)

    def view(self, target: list[object], writable: bool = False) -> memoryview:
        return memoryview(self.data)


def test_a_gpu_output_goes_straight_into_the_clients_region_or_is_refused_with_tritons_text() -> None:
    array = np.arange(8, dtype=np.int32)
    datatype, shape, buffer = _gpu_tensor(array)._wire_payload()
    region = _Region(64)
    placed = device_outputs.place_in_region(region, "OUT", datatype, shape, buffer, [1, 0, 64, "/k", 1])
    assert placed.handle == [-1, 0, 0] and bytes(region.data[:32]) == array.tobytes()
    with pytest.raises(ValueError, match=r"shared memory size specified with the request for output 'OUT' "
                                         r"\(16 bytes\) should be at least 32 bytes to hold the results"):
        device_outputs.place_in_region(region, "OUT", datatype, shape, buffer, [1, 0, 16, "/k", 1])


def test_a_producer_on_a_side_stream_is_waited_for_on_its_stream() -> None:
    out = fake_device_array(np.zeros(4, np.float32), 0)
    with fake_side_stream(0):  # the model computes on a stream of its own and does not synchronize
        fake_write_later(out, np.full(4, 5.0), 0)
        tensor = Tensor.from_dlpack("OUT", FakeCudaTensor(out, 0))  # inside the stream's `with`, as with torch
    host = np.empty(4, np.float32)
    device_outputs.copy_to_host(tensor._wire_payload()[2], memoryview(host).cast("B"))  # type: ignore[arg-type]
    assert host.tolist() == [5.0] * 4  # without the stream handshake: the zeros of before the kernel
    del tensor, out


def test_a_pinned_stubs_model_sees_its_gpu_as_cuda_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numbering_module, "_numbering", None)
    bindings("13")[0].cudaSetDevice(0)  # this thread's device from earlier tests: one that exists pinned too
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    import os

    environ = dict(os.environ)
    numbering_module.pin(environ, 1)  # the server's GPU 1 alone
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", environ["CUDA_VISIBLE_DEVICES"])
    monkeypatch.setenv(numbering_module.PINNED_VARIABLE, "1")
    monkeypatch.setattr(device_outputs, "_memory", None)  # made after pinning, as in a stub (not by a finalizer before)
    assert environ["CUDA_VISIBLE_DEVICES"] == "1"
    tensor = Tensor.from_dlpack("OUT", fake_cuda_capsule(fake_device_array(np.ones(4, np.float32), 0), 0))
    assert tensor._device == (_dlpack.KDL_CUDA, 1) and tensor.__dlpack_device__() == (_dlpack.KDL_CUDA, 0)
    again = Tensor.from_dlpack("AGAIN", tensor.to_dlpack())  # the model's own round trip: still cuda:0
    assert again.__dlpack_device__() == (_dlpack.KDL_CUDA, 0) and device_numbering().to_server(0) == 1
    host = np.empty(4, np.float32)
    device_outputs.copy_to_host(tensor._wire_payload()[2], memoryview(host).cast("B"))  # type: ignore[arg-type]
    assert host.tolist() == [1.0] * 4  # the server's GPU 1 is CUDA's ordinal 0 here
    with pytest.raises(TritonModelException, match="cuda:1 does not exist here"):
        Tensor.from_dlpack("X", fake_cuda_capsule(np.ones(1, np.float32), 1))
    del tensor, again
    monkeypatch.setattr(numbering_module, "_numbering", None)
