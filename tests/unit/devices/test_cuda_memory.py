"""CudaMemory (devices/cuda_runtime.py), the code a stub runs on a real GPU, on stand-ins of NVIDIA's
cuda-bindings in both shapes: 12.x (`cudaIpcMemHandle_t.reserved`) and 13.4.2+ (only `getPtr()`).

Its handles cross real processes in both shapes; its copies are done when they return (the bytes
are there for a reader that waits for nothing); it gives the thread its device back; it opens its
own exports; it names runtime and driver errors from their own tables; whatever the bindings
raise is a DeviceError; copies between devices take the peer path."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import types

import numpy as np
import pytest
from device_peer import Peer

from pystub_backend.devices import DeviceError, FakeCudaTensor, fake_device_array, fake_engine, fake_memory
from pystub_backend.devices.cuda_runtime import CudaMemory
from pystub_backend.devices.fake import fake_side_stream, fake_write_later
from pystub_backend.devices.fake_bindings import bindings


def _raw(pointer: int, count: int = 4) -> list[float]:
    """The bytes as the pages hold them now: what another process sees without waiting."""
    return list((ctypes.c_float * count).from_address(pointer))


@pytest.mark.parametrize("shape", ["12", "13"])
def test_a_handle_crosses_processes_in_either_shape_of_the_bindings(shape: str) -> None:
    memory = fake_memory(shape)
    pointer = memory.alloc(1, 64)
    memory.from_host(1, pointer, memoryview(np.arange(16, dtype=np.float32)).cast("B"))
    handle, offset = memory.export_handle(1, pointer + 16)
    assert (len(handle), offset) == (64, 16)
    peer = Peer(handle, offset, 1, shape)
    assert (peer.line(), peer.line()) == ("raw [4.0, 5.0, 6.0, 7.0]", "wrote")
    assert peer.finish() == "closed (0, 0)"
    memory.free(1, pointer)


def test_copies_are_done_when_they_return() -> None:
    memory = fake_memory()
    first, second = memory.alloc(0, 16), memory.alloc(0, 16)
    memory.from_host(0, first, memoryview(np.arange(4, dtype=np.float32)).cast("B"))
    assert _raw(first) == [0.0, 1.0, 2.0, 3.0]  # not merely staged: in device memory
    memory.device_copy(0, second, first, 16)
    assert _raw(second) == [0.0, 1.0, 2.0, 3.0]  # cudaMemcpy device-to-device would not have waited
    for pointer in (first, second):
        memory.free(0, pointer)


def test_a_copy_waits_for_the_models_default_stream_work_and_a_dlpack_stream_for_its_side_stream() -> None:
    memory = fake_memory()
    out = fake_device_array(np.zeros(4, np.float32), 0)
    fake_write_later(out, np.ones(4), 0)  # the model's kernel on the legacy stream, unsynchronized
    host = np.empty(4, np.float32)
    memory.to_host(0, int(out.ctypes.data), memoryview(host).cast("B"))
    assert host.tolist() == [1.0] * 4
    with fake_side_stream(0):
        fake_write_later(out, np.full(4, 2.0), 0)
        tensor = FakeCudaTensor(out, 0)
        tensor.__dlpack__(stream=memory.consumer_stream(0))  # as PyTorch: our stream waits for its stream
    memory.wait_stream(0)
    assert _raw(out.ctypes.data) == [2.0] * 4
    del out, tensor


def test_copies_between_devices_take_the_peer_path_after_the_sources_work() -> None:
    memory = fake_memory()
    source = fake_device_array(np.zeros(4, np.float32), 0)
    destination = memory.alloc(1, 16)
    fake_write_later(source, np.full(4, 5.0), 0)  # the model's kernel on GPU 0's default stream
    with pytest.raises(DeviceError, match="cudaMemcpyAsync failed: invalid argument"):
        memory.device_copy(1, destination, int(source.ctypes.data), 16)
    memory.peer_copy(1, destination, 0, int(source.ctypes.data), 16)
    assert _raw(destination) == [5.0] * 4  # a stream of GPU 1 would not have waited for GPU 0's kernel
    memory.free(1, destination)
    del source


def test_the_threads_device_is_given_back() -> None:
    runtime, _ = bindings("13")
    runtime.cudaSetDevice(0)  # the model works on GPU 0 (it has a context there)
    memory = fake_memory()
    pointer = memory.alloc(1, 16)
    memory.from_host(1, pointer, memoryview(np.ones(4, np.float32)).cast("B"))
    memory.free(1, pointer)
    assert runtime.cudaGetDevice()[1] == 0  # later torch work on "cuda" still lands on GPU 0


_FRESH_THREAD = '''
from pystub_backend.devices import fake_engine, fake_memory
from pystub_backend.devices.fake_bindings import bindings
runtime, _ = bindings("13")
memory = fake_memory()
memory.free(1, memory.alloc(1, 16))
print(runtime.cudaGetDevice()[1], sorted(fake_engine.contexts()))
'''


def test_a_thread_that_never_used_its_device_keeps_pystubs_and_gets_no_context_there() -> None:
    result = subprocess.run([sys.executable, "-c", _FRESH_THREAD], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "1 [1]", result.stderr  # no context was made on GPU 0


def test_a_process_opens_its_own_export() -> None:
    memory = fake_memory()
    pointer = memory.alloc(0, 16)
    handle, _ = memory.export_handle(0, pointer)
    assert memory.open_handle(0, handle) == pointer  # CUDA itself refuses this (cudaErrorDeviceUninitialized)
    assert memory.open_handle(0, handle) == pointer
    memory.close_handle(0, pointer)
    memory.close_handle(0, pointer)
    with pytest.raises(DeviceError, match="cudaIpcCloseMemHandle failed"):
        memory.close_handle(0, pointer)  # no third open to close
    memory.free(0, pointer)
    with pytest.raises(DeviceError, match="cudaIpcOpenMemHandle failed"):
        memory.open_handle(0, handle)  # freed: no longer this process's export


def test_errors_are_named_from_the_table_of_the_api_that_returned_them() -> None:
    memory = fake_memory()
    host = np.zeros(4, np.float32)
    with pytest.raises(DeviceError) as driver_error:
        memory.export_handle(0, int(host.ctypes.data))
    assert str(driver_error.value) == "cuMemGetAddressRange failed: named symbol not found (CUDA_ERROR_NOT_FOUND)"
    with pytest.raises(DeviceError) as runtime_error:
        memory.alloc(5, 16)
    assert str(runtime_error.value) == "cudaSetDevice(5) failed: invalid device ordinal (cudaErrorInvalidDevice)"


def test_whatever_the_bindings_raise_is_a_device_error() -> None:
    runtime, driver = bindings("13")

    def no_driver(*_: object) -> tuple[object, ...]:
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')

    broken = types.ModuleType("driver")
    broken.__dict__.update(driver.__dict__, cuMemGetAddressRange=no_driver, cuDeviceGet=no_driver)
    memory = CudaMemory(runtime, broken)
    pointer = memory.alloc(0, 16)
    with pytest.raises(DeviceError, match="cuMemGetAddressRange failed: RuntimeError: .*driver library"):
        memory.export_handle(0, pointer)
    twelve, _ = bindings("12")
    handle_type = type("cudaIpcMemHandle_t", (), {})  # a release whose handle has neither attribute
    missing = types.ModuleType("runtime")
    missing.__dict__.update(twelve.__dict__, cudaIpcMemHandle_t=handle_type)
    with pytest.raises(DeviceError, match="cudaIpcMemHandle_t failed: AttributeError"):
        CudaMemory(missing, driver).open_handle(0, bytes(64))
    memory.free(0, pointer)


def test_empty_allocations_are_null_and_never_reach_cuda() -> None:
    memory = fake_memory()
    before = fake_engine.counters()["mallocs"]
    assert memory.alloc(0, 0) == 0
    memory.free(0, 0)
    memory.to_host(0, 0, memoryview(bytearray()))
    assert fake_engine.counters()["mallocs"] == before
